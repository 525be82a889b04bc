// SPDX-License-Identifier: Apache-2.0
// Bad input that cuts across the compressors, seen through the Synchronizer as a trainer sees it:
// layers with no elements or one element, a non-finite value in such a layer, and the checkpoint
// of a run that holds them. (docs/reliability.md#behaviour-on-bad-input names the test of every row.)
#include <bellows/collectives/local.hpp>
#include <bellows/compressors/list.hpp>
#include <bellows/regime/accordion.hpp>
#include <bellows/sync/synchronizer.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../support/examples.hpp"

using bellows::collectives::local;
using bellows::collectives::local_group;

namespace {

// Each case: a compressor of the list at two of its example configurations, example I serving
// critical regimes and the next one the others.
template <class M, std::size_t I>
struct levels_case {
  static constexpr bool lossy_on_one_element = !M::exact_on_one_element;
  static auto make() {
    auto& exec = bellows::cpu::executor::shared();
    return std::pair{M::make(M::examples[I], exec), M::make(M::examples[(I + 1) % std::size(M::examples)], exec)};
  }
};

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

using bad_input_cases = bellows::testing::every_example<levels_case>;

TEST_CASE_TEMPLATE_DEFINE("bad input: layers of no element and of one element go through every compressor, checkpoint "
                          "and restore",
                          Case, bad_input_1) {
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
          if constexpr (Case::lossy_on_one_element)
            ok = ok && std::abs(got - mean) <= 1e-5f * std::abs(mean) + 0.02f * 2.0f;
          else
            ok = ok && got == mean;
        }
      }
      for (bellows::regime r : sync.end_epoch(0.1f, comm))
        ok = ok && (r == bellows::regime::critical || r == bellows::regime::normal);
    }
    ok = ok && sync.telemetry()[0].steps == 4 && sync.telemetry()[2].steps == 4;
    saved[comm.rank()] = sync.checkpoint(comm);
    auto resumed = make_sync<Case>();
    resumed.restore(saved[comm.rank()], comm);
    ok = ok && resumed.checkpoint(comm) == saved[comm.rank()] && resumed.epoch() == 2 && resumed.steps() == 4;
    if (ok) ++right;
  });
  CHECK(right == static_cast<int>(w));
}

TEST_CASE_TEMPLATE_DEFINE("bad input: a NaN or Inf in a one-element layer skips that layer on every rank and changes "
                          "nothing",
                          Case, bad_input_2) {
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

TEST_CASE_TEMPLATE_APPLY(bad_input_1, bad_input_cases);
TEST_CASE_TEMPLATE_APPLY(bad_input_2, bad_input_cases);
