// SPDX-License-Identifier: Apache-2.0
#include <bellows/regime/accordion.hpp>

#include <doctest/doctest.h>

#include <bellows/collectives/local.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../support/allocation_counter.hpp"
#include "../support/random.hpp"

using bellows::accordion;
using bellows::accordion_params;
using bellows::accordion_state;
using bellows::participation;
using bellows::regime;

namespace {

constexpr regime C = regime::critical;
constexpr regime N = regime::normal;

/// One rank, no traffic, but counts what it was asked to exchange.
struct recording_collective : bellows::archetypes::collective {
  std::vector<std::size_t> allreduce_lengths;
  std::size_t allgathers = 0;
  void allreduce_sum(std::span<float> v) { allreduce_lengths.push_back(v.size()); }
  void allgather(std::span<const std::byte> mine, bellows::gather_buffer& out) {
    ++allgathers;
    collective::allgather(mine, out);
  }
};

/// The local collective, except that rank r's sums come back increased by r: a transport that
/// returns different results to different ranks.
struct skewed_collective {
  bellows::collectives::local* inner;
  [[nodiscard]] std::size_t rank() const { return inner->rank(); }
  [[nodiscard]] std::size_t size() const { return inner->size(); }
  void allreduce_sum(std::span<float> v) {
    inner->allreduce_sum(v);
    for (float& x : v) x += static_cast<float>(rank());
  }
  void allgather(std::span<const std::byte> mine, bellows::gather_buffer& out) { inner->allgather(mine, out); }
};

/// A detector of one 2-element layer.
accordion one_layer(accordion_params p) {
  accordion d(p);
  d.add_layer({0, "fc", bellows::shape{2}});
  return d;
}

/// Ends the epoch in progress after `steps` steps whose gradient of layer 0 is {norm, 0} (L2
/// norm `norm`, exactly representable, so the mean's norm is exactly `norm`); returns the
/// decision for the next epoch.
regime epoch_with_norm(accordion& d, float norm, float lr = 0.1f, int steps = 3) {
  recording_collective coll;
  const std::vector<float> g{norm, 0.0f};
  for (int s = 0; s < steps; ++s) CHECK(d.observe(0, g) == bellows::step_status::ok);
  return d.end_epoch(d.epoch(), lr, coll)[0];
}

}  // namespace

TEST_CASE("accordion rule: the first check is critical, then critical iff |prev - now| / prev >= eta") {
  accordion d = one_layer({.eta = 0.5f, .interval = 1});
  CHECK(d.regimes()[0] == C);             // before any check
  CHECK(epoch_with_norm(d, 4.0f) == C);   // first check: no previous norm
  CHECK(epoch_with_norm(d, 3.0f) == N);   // |4 - 3| / 4 = 0.25
  CHECK(epoch_with_norm(d, 1.0f) == C);   // |3 - 1| / 3 = 0.67
  CHECK(epoch_with_norm(d, 1.25f) == N);  // 0.25
  CHECK(epoch_with_norm(d, 2.5f) == C);   // growth counts too: |1.25 - 2.5| / 1.25 = 1
  CHECK(epoch_with_norm(d, 2.5f) == N);   // 0
  CHECK(d.state().checks == 6);
  CHECK(d.state().norm_prev[0] == 2.5f);
}

TEST_CASE("accordion rule: a change of exactly eta is critical (>=), one ulp less is not") {
  accordion d = one_layer({.eta = 0.5f, .interval = 1});
  CHECK(epoch_with_norm(d, 2.0f) == C);  // first check
  CHECK(epoch_with_norm(d, 1.0f) == C);  // |2 - 1| / 2 = 0.5 exactly, falling
  CHECK(epoch_with_norm(d, 1.5f) == C);  // |1 - 1.5| / 1 = 0.5 exactly, rising
  CHECK(epoch_with_norm(d, 1.5f) == N);
  // 1.5 -> 0.75 would be exactly 0.5; the next float above 0.75 is a change just under it.
  CHECK(epoch_with_norm(d, std::nextafter(0.75f, 1.0f)) == N);

  accordion quarter = one_layer({.eta = 0.25f, .interval = 1});
  CHECK(epoch_with_norm(quarter, 2.0f) == C);
  CHECK(epoch_with_norm(quarter, 1.5f) == C);  // 0.25 exactly
  CHECK(epoch_with_norm(quarter, 1.5f) == N);
}

TEST_CASE("accordion rule: a previous norm of 0 makes the next check critical") {
  accordion d = one_layer({.eta = 0.5f, .interval = 1});
  CHECK(epoch_with_norm(d, 0.0f) == C);  // first check (norm 0)
  CHECK(epoch_with_norm(d, 0.0f) == C);  // prev = 0, although nothing changed
  CHECK(epoch_with_norm(d, 5.0f) == C);  // prev = 0
  CHECK(epoch_with_norm(d, 5.0f) == N);
  // An epoch in which the layer was never observed has norm 0 too.
  CHECK(epoch_with_norm(d, 7.0f, 0.1f, 0) == C);  // |5 - 0| / 5 = 1
  CHECK(epoch_with_norm(d, 5.0f) == C);           // prev = 0
}

TEST_CASE("accordion signal: the mean over the steps, not the sum") {
  accordion d = one_layer({.eta = 0.5f, .interval = 1});
  CHECK(epoch_with_norm(d, 4.0f, 0.1f, 2) == C);
  CHECK(epoch_with_norm(d, 4.0f, 0.1f, 8) == N);  // 4x the steps, same mean: no change
  recording_collective coll;
  d.observe(0, std::vector<float>{2.0f, 0.0f});
  d.observe(0, std::vector<float>{6.0f, 0.0f});
  CHECK(d.end_epoch(2, 0.1f, coll)[0] == N);  // mean {4, 0}
  CHECK(d.state().norm_prev[0] == 4.0f);
}

TEST_CASE("accordion signal: float sums of a long epoch against a double reference; observe_finite sums alike") {
  const std::size_t n = 1000;
  const int steps = 500;
  accordion a({.interval = 1}), b({.interval = 1});
  a.add_layer({0, "w", bellows::shape{n}});
  b.add_layer({0, "w", bellows::shape{n}});
  std::vector<double> exact(n, 0.0), magnitude(n, 0.0);
  for (int s = 0; s < steps; ++s) {
    auto g = bellows::testing::normal_floats(n, 900 + static_cast<unsigned>(s));
    g[0] += 0.05f;  // a drift, so that the mean is not only noise
    CHECK(a.observe(0, g) == bellows::step_status::ok);
    b.observe_finite(0, g);
    for (std::size_t i = 0; i < n; ++i) {
      exact[i] += g[i];
      magnitude[i] += std::abs(g[i]);
    }
  }
  CHECK(a.state() == b.state());
  // Each of the `steps` additions rounds by at most 2^-24 of the running sum's magnitude.
  const double u = std::ldexp(1.0, -24);
  for (std::size_t i = 0; i < n; ++i)
    CHECK(std::abs(double{a.state().sums[0][i]} - exact[i]) <= steps * u * magnitude[i]);
  double squares = 0.0;
  for (double v : exact) squares += v * v;
  const double norm = std::sqrt(squares) / steps;
  recording_collective coll;
  (void)a.end_epoch(0, 0.1f, coll);
  CHECK(std::abs(a.state().norm_prev[0] - norm) <= 1e-5 * norm);
  // observe_finite checks the size as observe does, and accumulates nothing outside checks.
  CHECK_THROWS_AS(b.observe_finite(0, std::vector<float>(n + 1)), bellows::error);
  accordion c({.interval = 2});
  c.add_layer({0, "w", bellows::shape{2}});
  (void)c.end_epoch(0, 0.1f, coll);
  c.observe_finite(0, std::vector<float>{1.0f, 2.0f});
  CHECK(c.state().steps[0] == 0);
  CHECK(c.state().sums[0] == std::vector<float>{0.0f, 0.0f});
}

TEST_CASE("accordion signal: a float sum that overflows is critical, remembered as norm 0, and checkpointable") {
  accordion d = one_layer({.eta = 0.5f, .interval = 1});
  CHECK(epoch_with_norm(d, 4.0f) == C);  // first check
  CHECK(epoch_with_norm(d, 4.0f) == N);
  const std::vector<float> huge{3e38f, 1.0f};
  CHECK(d.observe(0, huge) == bellows::step_status::ok);
  CHECK(d.observe(0, huge) == bellows::step_status::ok);
  CHECK(std::isinf(d.state().sums[0][0]));
  // Mid-epoch, the infinite sum goes through a checkpoint and back.
  bellows::checkpoint_writer w;
  d.save(w);
  accordion copy = one_layer({.eta = 0.5f, .interval = 1});
  bellows::checkpoint_reader r(w.bytes());
  copy.load(r);
  CHECK(copy.state() == d.state());
  recording_collective coll;
  CHECK(d.end_epoch(d.epoch(), 0.1f, coll)[0] == C);
  CHECK(d.state().norm_prev[0] == 0.0f);
  CHECK(epoch_with_norm(d, 4.0f) == C);  // prev = 0
  CHECK(epoch_with_norm(d, 4.0f) == N);
  // A NaN in a saved sum is refused.
  accordion_state bad = d.state();
  bad.sums[0][1] = std::numeric_limits<float>::quiet_NaN();
  accordion nan_source = one_layer({.eta = 0.5f, .interval = 1});
  nan_source.restore(bad);
  bellows::checkpoint_writer w2;
  nan_source.save(w2);
  bellows::checkpoint_reader r2(w2.bytes());
  CHECK_THROWS_AS(copy.load(r2), bellows::wire_error);
}

TEST_CASE("accordion: a learning-rate decay puts every participating layer on critical until the next check") {
  accordion d({.eta = 0.5f, .interval = 10});
  d.add_layer({0, "a", bellows::shape{2}});
  d.add_layer({1, "b", bellows::shape{2}});
  d.add_layer({2, "bias", bellows::shape{2}}, participation::excluded);
  recording_collective coll;
  const std::vector<float> g{1.0f, 0.0f};
  const auto run_epoch = [&](float lr) {
    for (std::size_t id = 0; id < 3; ++id) d.observe(id, g);
    const auto r = d.end_epoch(d.epoch(), lr, coll);
    return std::vector<regime>(r.begin(), r.end());
  };
  CHECK(run_epoch(0.1f) == std::vector<regime>{C, C, C});  // epoch 0: first check
  for (int e = 1; e < 10; ++e) CHECK(run_epoch(0.1f) == std::vector<regime>{C, C, C});
  CHECK(run_epoch(0.1f) == std::vector<regime>{N, N, C});  // epoch 10: stable norms
  CHECK(run_epoch(0.2f) == std::vector<regime>{N, N, C});  // epoch 11: an increase changes nothing
  CHECK(run_epoch(0.2f) == std::vector<regime>{N, N, C});
  CHECK(run_epoch(0.02f) == std::vector<regime>{C, C, C});  // epoch 13: decay
  for (int e = 14; e < 20; ++e) CHECK(run_epoch(0.02f) == std::vector<regime>{C, C, C});
  CHECK(run_epoch(0.02f) == std::vector<regime>{N, N, C});  // epoch 20: the next check decides
  // A decay at a check boundary overrides the check's normal decision.
  for (int e = 21; e < 30; ++e) run_epoch(0.02f);
  CHECK(run_epoch(0.002f) == std::vector<regime>{C, C, C});  // epoch 30
  CHECK(d.state().lr == 0.002f);
}

TEST_CASE("accordion interval: checks and accumulation only in epochs e with e % interval == 0") {
  accordion d = one_layer({.eta = 0.5f, .interval = 3});
  recording_collective coll;
  const std::vector<float> small{1.0f, 0.0f}, huge{1000.0f, 0.0f};
  for (std::size_t e = 0; e < 7; ++e) {
    CAPTURE(e);
    const bool check_epoch = e % 3 == 0;
    CHECK(d.observing(0) == check_epoch);
    // Non-check epochs see huge gradients; if they were accumulated, the checks would change.
    d.observe(0, check_epoch ? small : huge);
    CHECK(d.state().steps[0] == (check_epoch ? 1u : 0u));
    const std::size_t exchanges = coll.allreduce_lengths.size();
    const regime r = d.end_epoch(e, 0.1f, coll)[0];
    CHECK(coll.allreduce_lengths.size() == exchanges + (check_epoch ? 1 : 0));
    CHECK(r == (e < 3 ? C : N));  // epoch 0's decision holds until the check of epoch 3
    CHECK(d.state().norm_prev[0] == 1.0f);
  }
  CHECK(d.state().checks == 3);  // epochs 0, 3, 6
  CHECK(coll.allgathers == 0);   // the agreement check is off by default
}

TEST_CASE("accordion: excluded layers are not accumulated, not exchanged, and stay critical") {
  accordion d({.eta = 0.5f, .interval = 1});
  d.add_layer({0, "conv.bias", bellows::shape{4}}, participation::excluded);
  d.add_layer({1, "conv.weight", bellows::shape{4, 3}});
  CHECK_FALSE(d.participates(0));
  CHECK(d.participates(1));
  CHECK_FALSE(d.observing(0));
  CHECK(d.state().sums[0].empty());
  recording_collective coll;
  const std::vector<float> g0(4, 1.0f), g1(12, 1.0f);
  for (int e = 0; e < 3; ++e) {
    d.observe(0, g0);
    d.observe(1, g1);
    d.end_epoch(d.epoch(), 0.1f, coll);
  }
  CHECK(coll.allreduce_lengths == std::vector<std::size_t>{1, 1, 1});
  CHECK(d.regimes()[0] == C);
  CHECK(d.regimes()[1] == N);
}

TEST_CASE("accordion agreement: W = 4 ranks with different gradients take identical decisions") {
  constexpr std::size_t W = 4, epochs = 9;
  const std::vector<bellows::shape> shapes{{64, 32}, {64}, {10, 64}, {10}};
  // Per rank and epoch, each layer's gradients are noise of a rank-dependent scale around a
  // mean that jumps once (epoch 4), so some checks see large changes and some small ones, and
  // the ranks' own norms differ. Checks: 0 first, 2 stable, 4 jump, 6 stable but the learning
  // rate decays there, 8 stable.
  const auto gradient = [&](std::size_t rank, std::size_t epoch, std::size_t layer, int step) {
    std::vector<float> g = bellows::testing::normal_floats(
        shapes[layer].size(), 1000 * rank + 100 * epoch + 10 * layer + static_cast<std::size_t>(step));
    const float level = epoch < 4 ? 1.0f : 3.0f + static_cast<float>(layer);
    for (float& x : g) x = level + x * 0.5f * static_cast<float>(rank + 1);
    return g;
  };
  std::vector<std::vector<std::vector<regime>>> seen(W);  // rank -> epoch -> regimes
  std::vector<std::vector<float>> norms(W);               // rank -> norms at the last check
  bellows::collectives::local_group group(W);
  group.run([&](bellows::collectives::local& comm) {
    accordion d({.eta = 0.5f, .interval = 2, .check_agreement = true});
    for (std::uint32_t id = 0; id < shapes.size(); ++id)
      d.add_layer({id, "layer" + std::to_string(id), shapes[id]},
                  id == 3 ? participation::excluded : participation::included);
    for (std::size_t e = 0; e < epochs; ++e) {
      for (int step = 0; step < 3; ++step)
        for (std::size_t id = 0; id < shapes.size(); ++id) d.observe(id, gradient(comm.rank(), e, id, step));
      const float lr = e < 6 ? 0.1f : 0.01f;
      const auto r = d.end_epoch(e, lr, comm);
      seen[comm.rank()].emplace_back(r.begin(), r.end());
    }
    norms[comm.rank()] = d.state().norm_prev;
  });
  for (std::size_t r = 1; r < W; ++r) {
    CHECK(seen[r] == seen[0]);
    CHECK(norms[r] == norms[0]);
  }
  // The decisions follow docs/spec.md#the-rule, so the agreement is not a trivial one.
  const std::vector<regime> all_critical{C, C, C, C}, compress{N, N, N, C};
  for (std::size_t e = 0; e < epochs; ++e) {
    CAPTURE(e);
    const bool critical = e < 2 || e == 4 || e == 5 || e == 6 || e == 7;
    CHECK(seen[0][e] == (critical ? all_critical : compress));
  }
  // The agreed norm at the last check (epoch 8) is the mean over ranks of each rank's own norm.
  for (std::size_t id = 0; id < 3; ++id) {
    double mean_norm = 0;
    for (std::size_t r = 0; r < W; ++r) {
      std::vector<double> sum(shapes[id].size(), 0.0);
      for (int step = 0; step < 3; ++step) {
        const auto g = gradient(r, 8, id, step);
        for (std::size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
      }
      double squares = 0;
      for (double s : sum) squares += (s / 3) * (s / 3);
      mean_norm += std::sqrt(squares) / W;
    }
    CHECK(norms[0][id] == doctest::Approx(mean_norm).epsilon(1e-6));
  }
  CHECK(norms[0][3] == 0.0f);
}

TEST_CASE("accordion agreement check: a collective that returns different sums raises on every rank") {
  constexpr std::size_t W = 4;
  for (const bool check : {false, true}) {
    CAPTURE(check);
    std::vector<std::vector<regime>> decided(W);
    std::vector<int> raised(W, 0);
    bellows::collectives::local_group group(W);
    group.run([&](bellows::collectives::local& comm) {
      skewed_collective skewed{&comm};
      accordion d({.eta = 0.5f, .interval = 1, .check_agreement = check});
      d.add_layer({0, "fc1.weight", bellows::shape{2}});
      try {
        for (std::size_t e = 0; e < 2; ++e) {
          // The true norms are 2 then 3: a change of exactly eta, so a rank that sees a sum
          // only slightly off decides differently.
          d.observe(0, std::vector<float>{2.0f + static_cast<float>(e), 0.0f});
          const auto r = d.end_epoch(e, 0.1f, skewed);
          decided[comm.rank()].assign(r.begin(), r.end());
        }
      } catch (const bellows::error& e) {
        const std::string what = e.what();
        CHECK(what.find("ranks disagree after epoch 0") != std::string::npos);
        CHECK(what.find("gradient norm of layer 'fc1.weight'") != std::string::npos);
        raised[comm.rank()] = 1;
      }
    });
    if (check) {
      CHECK(raised == std::vector<int>(W, 1));  // at the first check, before decisions part
    } else {
      // Without the check the ranks silently part ways: rank 0 sees norms 2 -> 3 (critical),
      // rank 1 sees 2.25 -> 3.25 (a change of 0.44: normal).
      CHECK(raised == std::vector<int>(W, 0));
      CHECK(decided[0] == std::vector<regime>{C});
      CHECK(decided[1] == std::vector<regime>{N});
    }
  }
}

TEST_CASE("accordion: bad configuration raises bellows::error naming the value") {
  CHECK_THROWS_WITH_AS(accordion({.eta = 0.0f}), doctest::Contains("eta must be a finite number > 0, got 0"),
                       bellows::error);
  CHECK_THROWS_WITH_AS(accordion({.eta = -0.5f}), doctest::Contains("got -0.5"), bellows::error);
  CHECK_THROWS_WITH_AS(accordion({.eta = std::numeric_limits<float>::quiet_NaN()}), doctest::Contains("eta"),
                       bellows::error);
  CHECK_THROWS_WITH_AS(accordion({.interval = 0}), doctest::Contains("interval must be at least 1 epoch, got 0"),
                       bellows::error);
  CHECK_NOTHROW(accordion({.eta = 2.0f, .interval = 1}));  // eta > 1 is legal: growth can exceed 1
}

TEST_CASE("accordion({}) takes the default parameters; braced parameters are not ambiguous either") {
  static_assert(!std::is_default_constructible_v<accordion>,
                "a default constructor would make accordion({}) ambiguous");
  const accordion defaults({});
  CHECK(defaults.params().eta == accordion_params{}.eta);
  CHECK(defaults.params().interval == accordion_params{}.interval);
  const accordion set({.eta = 0.25f});
  CHECK(set.params().eta == 0.25f);
  CHECK(set.params().interval == accordion_params{}.interval);
}

TEST_CASE("to_string(regime) names each regime") {
  static_assert(std::string_view(bellows::to_string(regime::critical)) == "critical");
  static_assert(std::string_view(bellows::to_string(regime::normal)) == "normal");
}

TEST_CASE("accordion: misuse raises bellows::error naming the layer and the value") {
  accordion d({.interval = 2});
  CHECK_THROWS_WITH_AS(d.add_layer({1, "late", bellows::shape{3}}), doctest::Contains("'late' has id 1"),
                       bellows::error);
  d.add_layer({0, "fc1.weight", bellows::shape{2, 3}});
  CHECK_THROWS_WITH_AS(d.observe(0, std::vector<float>(5)),
                       doctest::Contains("'fc1.weight' of shape 2x3 has 6 elements, the gradient 5"), bellows::error);
  CHECK_THROWS_WITH_AS(d.observe(1, std::vector<float>(6)), doctest::Contains("unknown layer id 1 of 1"),
                       bellows::error);
  recording_collective coll;
  CHECK_THROWS_WITH_AS(d.end_epoch(1, 0.1f, coll), doctest::Contains("end_epoch(1) while epoch 0"), bellows::error);
  CHECK_THROWS_WITH_AS(d.end_epoch(0, 0.0f, coll), doctest::Contains("learning rate"), bellows::error);
  CHECK_THROWS_WITH_AS(d.end_epoch(0, std::numeric_limits<float>::infinity(), coll), doctest::Contains("got inf"),
                       bellows::error);
  CHECK(d.epoch() == 0);  // the refused calls changed nothing
  d.end_epoch(0, 0.1f, coll);
  CHECK_THROWS_WITH_AS(d.add_layer({1, "fc2.weight", bellows::shape{3}}),
                       doctest::Contains("'fc2.weight' registered after epoch 0 ended"), bellows::error);
}

TEST_CASE("accordion: a non-finite gradient is refused and changes no state") {
  accordion d = one_layer({.interval = 1});
  d.observe(0, std::vector<float>{1.0f, 2.0f});
  const bellows::accordion_state before = d.state();
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    CHECK(d.observe(0, std::vector<float>{1.0f, bad}) == bellows::step_status::non_finite);
    CHECK(d.state() == before);
  }
}

TEST_CASE("accordion: observe allocates nothing") {
  accordion d = one_layer({.interval = 1});
  const std::vector<float> g{1.0f, 2.0f};
  d.observe(0, g);
  const std::size_t before = bellows::testing::allocations;
  for (int s = 0; s < 100; ++s) d.observe(0, g);
  CHECK(bellows::testing::allocations == before);
}

TEST_CASE("accordion: a state restored mid-epoch continues exactly as the uninterrupted run") {
  const auto make = [] {
    accordion d({.eta = 0.3f, .interval = 2});
    d.add_layer({0, "w", bellows::shape{8, 4}});
    d.add_layer({1, "b", bellows::shape{8}}, participation::excluded);
    return d;
  };
  const auto step = [](accordion& d, std::size_t e, int s) {
    const auto g = bellows::testing::normal_floats(32, 7 * e + static_cast<std::size_t>(s));
    d.observe(0, g);
    d.observe(1, std::vector<float>(8, 1.0f));
  };
  recording_collective coll;
  accordion whole = make(), first = make();
  std::vector<std::vector<regime>> a, b;
  for (std::size_t e = 0; e < 8; ++e) {
    for (int s = 0; s < 4; ++s) {
      step(whole, e, s);
      if (e < 4 || (e == 4 && s < 2)) step(first, e, s);
    }
    const auto r = whole.end_epoch(e, e < 5 ? 0.1f : 0.05f, coll);
    a.emplace_back(r.begin(), r.end());
    if (e < 4) first.end_epoch(e, 0.1f, coll);
  }
  // `first` stopped in the middle of epoch 4 (a check epoch, half accumulated); a fresh detector
  // takes its state and runs the rest.
  accordion resumed = make();
  resumed.restore(first.state());
  CHECK(resumed.epoch() == 4);
  CHECK(resumed.state().steps[0] == 2);
  for (std::size_t e = 4; e < 8; ++e) {
    for (int s = e == 4 ? 2 : 0; s < 4; ++s) step(resumed, e, s);
    const auto r = resumed.end_epoch(e, e < 5 ? 0.1f : 0.05f, coll);
    b.emplace_back(r.begin(), r.end());
  }
  CHECK(std::vector<std::vector<regime>>(a.begin() + 4, a.end()) == b);
  CHECK(resumed.state() == whole.state());

  // A state that does not fit the layers is refused, naming the layer, and changes nothing.
  bellows::accordion_state wrong = whole.state();
  wrong.sums[0].resize(31);
  CHECK_THROWS_WITH_AS(resumed.restore(wrong), doctest::Contains("layer 'w' (included, 32 elements)"), bellows::error);
  wrong = whole.state();
  wrong.sums[1].resize(8);
  CHECK_THROWS_WITH_AS(resumed.restore(wrong), doctest::Contains("layer 'b' (excluded"), bellows::error);
  wrong = whole.state();
  wrong.regimes.pop_back();
  CHECK_THROWS_WITH_AS(resumed.restore(wrong), doctest::Contains("for 2 registered layers"), bellows::error);
  CHECK(resumed.state() == whole.state());
}

TEST_CASE("accordion batch-size variant: small while any participating layer is critical") {
  bellows::accordion_batch_size d({.small = 32, .large = 256}, {.eta = 0.5f, .interval = 1});
  d.add_layer({0, "a", bellows::shape{2}});
  d.add_layer({1, "b", bellows::shape{2}});
  d.add_layer({2, "bias", bellows::shape{2}}, participation::excluded);  // always critical, ignored
  CHECK(d.batch_size() == 32);                                           // before the first check
  recording_collective coll;
  const auto run_epoch = [&](float a, float b, float lr = 0.1f) {
    d.observe(0, std::vector<float>{a, 0.0f});
    d.observe(1, std::vector<float>{b, 0.0f});
    d.observe(2, std::vector<float>{1.0f, 0.0f});
    return d.end_epoch(d.detector().epoch(), lr, coll);
  };
  CHECK(run_epoch(1, 1) == 32);   // first check
  CHECK(run_epoch(1, 1) == 256);  // all normal
  CHECK(run_epoch(1, 4) == 32);   // layer b changed
  CHECK(run_epoch(1, 4) == 256);
  CHECK(run_epoch(1, 4, 0.01f) == 32);  // learning-rate decay
  CHECK(d.detector().regimes()[2] == C);

  CHECK_THROWS_WITH_AS(bellows::accordion_batch_size({.small = 0, .large = 8}),
                       doctest::Contains("small batch size must be >= 1, got 0"), bellows::error);
  CHECK_THROWS_WITH_AS(bellows::accordion_batch_size({.small = 64, .large = 32}),
                       doctest::Contains("large batch size (32) must be >= the small one (64)"), bellows::error);
}
