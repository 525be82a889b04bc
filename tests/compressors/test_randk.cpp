// SPDX-License-Identifier: Apache-2.0
#include <bellows/collectives/local.hpp>
#include <bellows/compressors/randk.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../support/allocation_counter.hpp"
#include "../support/random.hpp"
#include "sparse_checks.hpp"

namespace {

using bellows::collectives::local;
using bellows::collectives::local_group;

using bellows::testing::payload_storage;
using bellows::testing::same_bits;

/// The indices of a valid rand-k payload of a layer below 2^32 elements.
std::vector<std::uint32_t> indices_of(std::span<const std::byte> payload) {
  const auto count = bellows::wire::reader(payload, bellows::randk_method::codec).head().count;
  const auto* first = reinterpret_cast<const std::uint32_t*>(payload.data() + bellows::wire::header_bytes);
  return {first, first + count};
}

}  // namespace

TEST_CASE("randk: k distinct ascending indices, the same on every rank only in shared mode") {
  for (auto mode : {bellows::randk_mode::shared, bellows::randk_mode::per_rank}) {
    const std::size_t n = 10000, w = 3;
    std::vector<std::vector<std::uint32_t>> seen(w);
    local_group group(w);
    group.run([&](local& comm) {
      bellows::cpu::executor exec(1);
      bellows::randk<> c({.ratio = 0.01, .mode = mode}, exec);
      auto st = c.make_state({7, "w", bellows::shape{n}});
      const auto x = bellows::testing::normal_floats(n, comm.rank());
      seen[comm.rank()] = indices_of(c.stage(st, x, comm.rank()));
    });
    for (const auto& v : seen) {
      CHECK(v.size() == 100);
      CHECK(std::adjacent_find(v.begin(), v.end(), std::greater_equal<>()) == v.end());
      CHECK(v.back() < n);
    }
    if (mode == bellows::randk_mode::shared)
      CHECK((seen[0] == seen[1] && seen[1] == seen[2]));
    else
      CHECK((seen[0] != seen[1] && seen[1] != seen[2]));
  }
}

TEST_CASE("randk: for W = 1, 2, 3, 8 the output is the average of every rank's decoded payload") {
  for (auto mode : {bellows::randk_mode::shared, bellows::randk_mode::per_rank})
    for (std::size_t w : {1u, 2u, 3u, 8u}) {
      CAPTURE(w);
      bellows::testing::check_average_of_payloads(
          [&](bellows::cpu::executor& exec) { return bellows::randk<>({.ratio = 0.05, .mode = mode}, exec); }, w,
          bellows::shape{3000});
    }
}

TEST_CASE("randk: the traffic of a step, and the rounds of each mode") {
  bellows::cpu::executor exec(1);
  bellows::archetypes::collective solo;
  const std::size_t n = 3000;
  for (auto mode : {bellows::randk_mode::shared, bellows::randk_mode::per_rank}) {
    bellows::randk<> c({.ratio = 0.05, .mode = mode}, exec);
    auto st = c.make_state({0, "w", bellows::shape{n}});
    auto x = bellows::testing::normal_floats(n, 1);
    const auto sent = c.reduce(st, x, solo).sent;
    if (mode == bellows::randk_mode::shared) {
      CHECK(c.rounds(st, 1) == bellows::exchange_rounds{{bellows::collective_op::allreduce_sum, 4 * 151}});
      CHECK(sent == bellows::traffic{4 * 151, 151, 150});
    } else {
      CHECK(c.rounds(st, 1) ==
            bellows::exchange_rounds{{bellows::collective_op::allgather, bellows::sparse_payload_bytes(n, 150)}});
      CHECK(sent == bellows::traffic{bellows::sparse_payload_bytes(n, 150), 150, 150});
    }
  }
}

TEST_CASE("randk: indices uniform over steps (chi-square on frequencies, false alarm 1e-6)") {
  bellows::cpu::executor exec(1);
  const std::size_t n = 40, k = 4, steps = 5000;
  bellows::randk<> c({.k = static_cast<std::int64_t>(k), .feedback = bellows::feedback::none}, exec);
  auto st = c.make_state({0, "b", bellows::shape{n}});
  payload_storage buf(c.max_payload_bytes(st));
  const std::vector<float> x(n, 1.0f);
  std::vector<double> count(n, 0.0);
  for (std::size_t s = 0; s < steps; ++s) {
    st.step = s;
    for (std::uint32_t i : indices_of(c.encode(st, x, buf.bytes()))) count[i] += 1;
  }
  const double p = static_cast<double>(k) / n, expected = p * steps;
  double stat = 0;
  for (double v : count) stat += (v - expected) * (v - expected);
  stat *= (n - 1.0) / (n * expected * (1 - p));
  CHECK(stat < 96.1);  // chi-square with 39 degrees of freedom: P(> 96.1) = 1e-6
}

TEST_CASE("randk residual feedback: e = m with zeros where kept; sum of contributions + e_T = sum of g") {
  bellows::testing::check_feedback_invariant(
      [](bellows::cpu::executor& exec) { return bellows::randk<>({.ratio = 0.03}, exec); }, 4000, 50);
}

TEST_CASE("randk unbiased: kept values scaled by n / k, only without error feedback") {
  bellows::cpu::executor exec(1);
  bellows::archetypes::collective solo;
  const std::size_t n = 1000;
  bellows::randk<> c({.ratio = 0.1, .unbiased = true, .feedback = bellows::feedback::none}, exec);
  auto st = c.make_state({0, "w", bellows::shape{n}});
  const auto g = bellows::testing::normal_floats(n, 8);
  auto x = g;
  (void)c.reduce(st, x, solo);
  std::size_t kept = 0;
  for (std::size_t i = 0; i < n; ++i)
    if (x[i] != 0.0f) {
      ++kept;
      CHECK(x[i] == 10.0f * g[i]);
    }
  CHECK(kept == 100);
}

TEST_CASE("randk: NaN or Inf on one rank gives non_finite on all; gradient, memory and step unchanged") {
  for (auto mode : {bellows::randk_mode::shared, bellows::randk_mode::per_rank})
    for (std::size_t at : {std::size_t{0}, std::size_t{1234}, std::size_t{1999}})  // kept or not
      bellows::testing::check_non_finite(
          [&](bellows::cpu::executor& exec) { return bellows::randk<>({.ratio = 0.02, .mode = mode}, exec); }, 2000, at,
          std::numeric_limits<float>::quiet_NaN());
}

TEST_CASE("randk: each bad parameter is refused at construction, naming the parameter and the value") {
  bellows::cpu::executor exec(1);
  struct bad_case {
    bellows::randk_params params;
    const char* says;
  };
  for (const bad_case& b : {
           bad_case{{.ratio = 0.0}, "randk: ratio must be in (0, 1], got 0"},
           bad_case{{.ratio = 2.0}, "randk: ratio must be in (0, 1], got 2"},
           bad_case{{.k = -1}, "randk: k must not be negative, got -1"},
           bad_case{{.mode = static_cast<bellows::randk_mode>(5)},
                    "randk: mode must be shared or per_rank, got the value 5"},
           bad_case{{.feedback = static_cast<bellows::feedback>(9)},
                    "randk: feedback must be none, residual or scaled, got the value 9"},
           bad_case{{.unbiased = true}, "randk: unbiased scaling needs feedback none, got feedback residual"},
       }) {
    CAPTURE(b.says);
    CHECK_THROWS_WITH_AS(bellows::randk<>(b.params, exec), b.says, bellows::error);
  }
  CHECK_NOTHROW(bellows::randk<>({.ratio = 0.0, .k = 5}, exec));  // a k > 0 sets aside the ratio
}

TEST_CASE("randk: payloads of another k or codec are refused") {
  bellows::cpu::executor exec(1);
  const bellows::layer_info layer{0, "emb", bellows::shape{500}};
  const bellows::randk<> c({.ratio = 0.02, .feedback = bellows::feedback::none}, exec);
  auto st = c.make_state(layer);
  payload_storage buf(c.max_payload_bytes(st));
  const auto payload = c.encode(st, bellows::testing::normal_floats(500, 1), buf.bytes());
  // A payload for another k (here, top-k's codec field aside) is refused.
  const bellows::randk<> other({.ratio = 0.04, .feedback = bellows::feedback::none}, exec);
  std::vector<float> acc(500, 0.0f);
  CHECK_THROWS_WITH_AS((void)other.decode_add(st, payload, acc), doctest::Contains("entries"), bellows::wire_error);
  payload_storage copy(payload.size());
  std::memcpy(copy.bytes().data(), payload.data(), payload.size());
  copy.bytes()[6] = std::byte{1};  // top-k's codec
  CHECK_THROWS_AS((void)c.validate(st, copy.bytes().first(payload.size())), bellows::wire_error);
  CHECK(std::all_of(acc.begin(), acc.end(), [](float v) { return v == 0.0f; }));
}

TEST_CASE("randk: a layer with no elements keeps nothing") {
  bellows::cpu::executor exec(1);
  bellows::archetypes::collective solo;
  for (auto mode : {bellows::randk_mode::shared, bellows::randk_mode::per_rank}) {
    bellows::randk<> c({.mode = mode}, exec);
    auto st = c.make_state({0, "empty", bellows::shape{0}});
    std::vector<float> none;
    CHECK(c.reduce(st, none, solo).status == bellows::step_status::ok);
    CHECK(st.k() == 0);
  }
}

TEST_CASE("randk: steady-state steps allocate nothing") {
  bellows::cpu::executor exec(1);
  bellows::archetypes::collective solo;
  for (auto mode : {bellows::randk_mode::shared, bellows::randk_mode::per_rank}) {
    bellows::randk<> c({.ratio = 0.01, .mode = mode}, exec);
    auto st = c.make_state({0, "w", bellows::shape{40000}});
    auto x = bellows::testing::normal_floats(40000, 3);
    (void)c.reduce(st, x, solo);
    for (int s = 0; s < 3; ++s) {
      const std::size_t mark = bellows::testing::allocations;
      (void)c.reduce(st, x, solo);
      CHECK(bellows::testing::allocations == mark);
    }
  }
}

TEST_CASE("randk: save and load restore the step and the memory") {
  bellows::testing::check_save_load(
      [](bellows::cpu::executor& exec) { return bellows::randk<>({.ratio = 0.1}, exec); });
}
