// SPDX-License-Identifier: Apache-2.0
// Checks that top-k and rand-k share (tests/compressors/test_topk.cpp, test_randk.cpp), each
// run for a compressor built by `make(exec)`.
#pragma once

#include <bellows/collectives/local.hpp>
#include <bellows/core/checkpoint.hpp>
#include <bellows/cpu/executor.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "../support/random.hpp"

namespace bellows::testing {

/// An 8-byte aligned buffer for a payload.
struct payload_storage {
  std::vector<std::uint64_t> words;
  explicit payload_storage(std::size_t bytes) : words((bytes + 7) / 8) {}
  std::span<std::byte> bytes() { return std::as_writable_bytes(std::span(words)); }
};

inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

/// The error-feedback invariant over `steps` steps of one rank. Each step splits m = fl(g + e)
/// exactly into its kept part (the contribution, which one rank's reduce returns) and the new e:
/// one of them holds m_i, the other 0. So sum_t c_t + e_T - sum_t g_t is the sum of the rounding
/// errors of the T additions, per element at most 2^-24 * sum_t |m_t| (half an ulp each); the
/// sums are taken in double.
template <class Make>
void check_feedback_invariant(Make&& make, std::size_t n, std::size_t steps) {
  cpu::executor exec(1);
  archetypes::collective solo;
  auto c = make(exec);
  auto st = c.make_state({1, "w", shape{n}});
  std::vector<double> sum_g(n, 0.0), sum_c(n, 0.0), bound(n, 0.0);
  std::size_t split_exact = 0;
  for (std::size_t t = 0; t < steps; ++t) {
    auto g = normal_floats(n, 500 + t);
    std::vector<float> m(n);
    for (std::size_t i = 0; i < n; ++i) {
      m[i] = g[i] + st.memory.values()[i];
      sum_g[i] += g[i];
      bound[i] += std::abs(double{m[i]}) * 0x1p-24;
    }
    REQUIRE(c.reduce(st, g, solo).status == step_status::ok);  // g is now c_t
    for (std::size_t i = 0; i < n; ++i) {
      sum_c[i] += g[i];
      const float e = st.memory.values()[i];
      split_exact += g[i] == 0.0f ? e == m[i] : (e == 0.0f && g[i] == m[i]);
    }
  }
  CHECK(split_exact == n * steps);
  std::size_t within = 0;
  for (std::size_t i = 0; i < n; ++i)
    within += std::abs(sum_c[i] + st.memory.values()[i] - sum_g[i]) <= bound[i] + 1e-12;
  CHECK(within == n);
  CHECK(st.step == steps);
}

/// On W ranks, reduce leaves the average of every rank's decoded payload (staged on a copy of
/// the state), with the rank-order float sums and the division by W that the reduce does too.
template <class Make>
void check_average_of_payloads(Make&& make, std::size_t w, const shape& shp) {
  const std::size_t n = shp.size();
  std::vector<std::vector<float>> decoded(w, std::vector<float>(n)), out(w);
  collectives::local_group group(w);
  cpu::executor exec(2);
  std::atomic<int> ok_steps{0};
  group.run([&](collectives::local& comm) {
    auto c = make(exec);
    auto st = c.make_state({4, "w", shp});
    for (int s = 0; s < 3; ++s) {
      auto x = normal_floats(n, 31 * comm.rank() + static_cast<std::uint64_t>(s));
      auto ahead = st;
      std::fill(decoded[comm.rank()].begin(), decoded[comm.rank()].end(), 0.0f);
      (void)c.decode_add(ahead, c.stage(ahead, x, comm.rank()), decoded[comm.rank()]);
      ok_steps += c.reduce(st, x, comm).status == step_status::ok;
      out[comm.rank()] = x;
    }
  });
  CHECK(ok_steps == static_cast<int>(3 * w));
  std::vector<float> expected(n, 0.0f);
  for (std::size_t r = 0; r < w; ++r)
    for (std::size_t i = 0; i < n; ++i) expected[i] += decoded[r][i];
  if (w > 1)
    for (float& v : expected) v /= static_cast<float>(w);
  for (std::size_t r = 0; r < w; ++r) CHECK(out[r] == expected);  // +0 and -0 alike
}

/// NaN or Inf at `at` on one of 3 ranks: every rank gets non_finite with its gradient, memory
/// and step unchanged, and the next finite step goes on from there.
template <class Make>
void check_non_finite(Make&& make, std::size_t n, std::size_t at, float bad) {
  const std::size_t w = 3;
  collectives::local_group group(w);
  std::atomic<int> right{0};
  group.run([&](collectives::local& comm) {
    cpu::executor exec(1);
    auto c = make(exec);
    auto st = c.make_state({0, "w", shape{n}});
    auto x = normal_floats(n, comm.rank());
    (void)c.reduce(st, x, comm);  // a memory that is not zero
    const std::vector<float> memory(st.memory.values().begin(), st.memory.values().end());
    auto g = normal_floats(n, 10 + comm.rank());
    if (comm.rank() == 2) g[at] = bad;
    const auto before = g;
    if (c.reduce(st, g, comm).status == step_status::non_finite && same_bits(g, before) &&
        same_bits(st.memory.values(), memory) && st.step == 1 && c.reduce(st, x, comm).status == step_status::ok &&
        st.step == 2)
      ++right;
  });
  CHECK(right == static_cast<int>(w));
}

/// save then load restore the step and the memory; a state of another size refuses the bytes.
template <class Make>
void check_save_load(Make&& make) {
  cpu::executor exec(1);
  archetypes::collective solo;
  auto c = make(exec);
  auto st = c.make_state({0, "w", shape{300}});
  auto x = normal_floats(300, 6);
  (void)c.reduce(st, x, solo);
  checkpoint_writer w;
  c.save(st, w);
  auto restored = c.make_state({0, "w", shape{300}});
  checkpoint_reader r(w.bytes());
  c.load(restored, r);
  r.finish();
  CHECK(restored.step == 1);
  CHECK(same_bits(restored.memory.values(), st.memory.values()));
  auto other = c.make_state({0, "w", shape{301}});
  checkpoint_reader wrong(w.bytes());
  CHECK_THROWS_AS(c.load(other, wrong), wire_error);
  CHECK(other.step == 0);
}

}  // namespace bellows::testing
