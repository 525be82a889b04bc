// SPDX-License-Identifier: Apache-2.0
// Bad input that cuts across the compressors, seen through the Synchronizer as a trainer sees it:
// layers with no elements or one element, a non-finite value in such a layer, and the checkpoint
// of a run that holds them. (docs/reliability.md#behaviour-on-bad-input names the test of every row.)
#include <bellows/collectives/local.hpp>
#include <bellows/compressors/identity.hpp>
#include <bellows/compressors/powersgd.hpp>
#include <bellows/compressors/qsgd.hpp>
#include <bellows/compressors/randk.hpp>
#include <bellows/compressors/topk.hpp>
#include <bellows/regime/accordion.hpp>
#include <bellows/sync/synchronizer.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

using bellows::collectives::local;
using bellows::collectives::local_group;

namespace {

// Each case: the low and the high level of one compressor family.
struct identity_levels {
  static auto make() { return std::pair{bellows::identity<>(), bellows::identity<>()}; }
};
struct topk_levels {
  static auto make() { return std::pair{bellows::topk<>({.ratio = 0.5}), bellows::topk<>({.ratio = 0.1})}; }
};
struct randk_levels {
  static auto make() { return std::pair{bellows::randk<>({.ratio = 0.5}), bellows::randk<>({.ratio = 0.1})}; }
};
struct randk_per_rank_levels {
  static auto make() {
    return std::pair{bellows::randk<>({.ratio = 0.5, .mode = bellows::randk_mode::per_rank}),
                     bellows::randk<>({.ratio = 0.1, .mode = bellows::randk_mode::per_rank})};
  }
};
struct qsgd_levels {
  static constexpr bool lossy_on_one_element = true;  // the rounding of the scale
  static auto make() {
    return std::pair{bellows::qsgd<>({.bits = 8, .bucket = 4}), bellows::qsgd<>({.bits = 2, .bucket = 4})};
  }
};
struct powersgd_levels {
  static auto make() { return std::pair{bellows::powersgd<>({.rank = 4}), bellows::powersgd<>({.rank = 1})}; }
};

template <class Case>
constexpr bool lossy_on_one_element() {
  if constexpr (requires { Case::lossy_on_one_element; })
    return Case::lossy_on_one_element;
  else
    return false;
}

// Layers with no elements (as a 1-D and as a matrix with a zero dimension), with one element
// (as a scalar, a vector and a 1x1 matrix), and an ordinary one beside them.
const bellows::shape odd_shapes[] = {bellows::shape{0}, bellows::shape{3, 0}, bellows::shape{},
                                     bellows::shape{1}, bellows::shape{1, 1}, bellows::shape{12, 10}};

float value_of(std::size_t rank, std::size_t layer, int step, std::size_t i) {
  return static_cast<float>(rank + 1) * 0.25f + static_cast<float>(layer) - static_cast<float>(step) * 0.5f +
         0.01f * static_cast<float>(i % 17);
}

template <class Case>
auto make_sync() {
  auto [low, high] = Case::make();
  bellows::synchronizer sync(std::move(low), std::move(high), bellows::accordion({.interval = 1}));
  for (std::size_t id = 0; id < std::size(odd_shapes); ++id)
    sync.add_layer("layer" + std::to_string(id), odd_shapes[id]);
  return sync;
}

}  // namespace

#define BAD_INPUT_CASES identity_levels, topk_levels, randk_levels, randk_per_rank_levels, qsgd_levels, powersgd_levels

TEST_CASE_TEMPLATE("bad input: layers of no element and of one element go through every compressor, checkpoint "
                   "and restore",
                   Case, BAD_INPUT_CASES) {
  constexpr std::size_t w = 2;
  local_group group(w);
  std::atomic<int> right{0};
  std::vector<std::vector<std::byte>> saved(w);
  group.run([&](local& comm) {
    auto sync = make_sync<Case>();
    bool ok = true;
    for (int epoch = 0; epoch < 2; ++epoch) {
      for (int step = 0; step < 2; ++step) {
        std::vector<std::vector<float>> g;
        for (std::size_t id = 0; id < std::size(odd_shapes); ++id) {
          g.emplace_back(odd_shapes[id].size());
          for (std::size_t i = 0; i < g.back().size(); ++i) g.back()[i] = value_of(comm.rank(), id, step, i);
        }
        std::vector<std::span<float>> v(g.begin(), g.end());
        for (bellows::step_status s : sync.step(v, comm)) ok = ok && s == bellows::step_status::ok;
        // Empty layers stay empty; a one-element layer carries the average (the exact one, but
        // for QSGD's rounding of its scale). Compressors with error feedback keep all of a
        // one-element layer (k = 1 of 1, rank 1 of 1x1 is not worth compressing).
        for (std::size_t id = 2; id <= 4; ++id) {
          const float mean = (value_of(0, id, step, 0) + value_of(1, id, step, 0)) / 2.0f;
          const float got = g[id][0];
          if constexpr (lossy_on_one_element<Case>())
            ok = ok && std::abs(got - mean) <= 1e-5f * std::abs(mean) + 0.02f * 2.0f;
          else
            ok = ok && got == mean;
        }
      }
      for (bellows::regime r : sync.end_epoch(0.1f, comm))
        ok = ok && (r == bellows::regime::critical || r == bellows::regime::normal);
    }
    ok = ok && sync.telemetry()[0].steps == 4 && sync.telemetry()[2].steps == 4;
    saved[comm.rank()] = sync.checkpoint();
    auto resumed = make_sync<Case>();
    resumed.restore(saved[comm.rank()]);
    ok = ok && resumed.checkpoint() == saved[comm.rank()] && resumed.epoch() == 2 && resumed.steps() == 4;
    if (ok) ++right;
  });
  CHECK(right == static_cast<int>(w));
}

TEST_CASE_TEMPLATE("bad input: a NaN or Inf in a one-element layer skips that layer on every rank and changes "
                   "nothing",
                   Case, BAD_INPUT_CASES) {
  constexpr std::size_t w = 2;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    CAPTURE(bad);
    local_group group(w);
    std::atomic<int> right{0};
    group.run([&](local& comm) {
      auto sync = make_sync<Case>();
      std::vector<std::vector<float>> g;
      for (std::size_t id = 0; id < std::size(odd_shapes); ++id) g.emplace_back(odd_shapes[id].size(), 1.0f);
      if (comm.rank() == 1) g[3][0] = bad;
      const auto input = g[3];
      std::vector<std::span<float>> v(g.begin(), g.end());
      const auto statuses = sync.step(v, comm);
      bool ok = statuses[3] == bellows::step_status::non_finite && statuses[5] == bellows::step_status::ok;
      ok = ok && std::memcmp(g[3].data(), input.data(), sizeof(float)) == 0;  // NaN != NaN
      // Neither the layer's compressor state, nor its telemetry, nor the detector changed.
      ok = ok && sync.state(3).step == 0 && sync.state(5).step == 1;
      ok = ok && sync.telemetry()[3].skipped == 1 && sync.telemetry()[3].steps == 0;
      const bellows::accordion_state& detector = sync.detector().state();
      ok = ok && detector.steps[3] == 0 && detector.steps[5] == (detector.sums[5].empty() ? 0u : 1u);
      for (float sum : detector.sums[3]) ok = ok && sum == 0.0f;
      if (ok) ++right;
    });
    CHECK(right == static_cast<int>(w));
  }
}
