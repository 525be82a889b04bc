// SPDX-License-Identifier: Apache-2.0
#include <bellows/cpu/elementwise.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../support/random.hpp"

TEST_CASE("all_finite: finds one NaN or Inf anywhere, in any chunk, for any thread count") {
  const std::size_t n = 3 * bellows::cpu::elementwise_chunk + 17;
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::signaling_NaN(),
                              std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                              -std::nanf("0x7")};
  for (unsigned threads : {1u, 3u}) {
    bellows::cpu::executor exec(threads);
    auto x = bellows::testing::normal_floats(n, 5);
    x[7] = std::numeric_limits<float>::max();
    x[8] = std::numeric_limits<float>::denorm_min();
    x[9] = -0.0f;
    CHECK(bellows::cpu::all_finite(exec, x));
    CHECK(bellows::cpu::all_finite(exec, std::span<const float>()));
    for (float bad : bad_values) {
      for (std::size_t at : {std::size_t{0}, std::size_t{5}, std::size_t{15}, std::size_t{16}, std::size_t{33},
                             bellows::cpu::elementwise_chunk, bellows::cpu::elementwise_chunk + 9, n - 2, n - 1}) {
        const float keep = x[at];
        x[at] = bad;
        CHECK_FALSE(bellows::cpu::all_finite(exec, x));
        x[at] = keep;
      }
    }
  }
}

TEST_CASE("compensate: m = g + e in place or not, and a float flag for NaN and Inf in any chunk") {
  const std::size_t n = 2 * bellows::cpu::elementwise_chunk + 11;
  const auto g = bellows::testing::normal_floats(n, 31);
  const auto e = bellows::testing::normal_floats(n, 32);
  for (unsigned threads : {1u, 3u}) {
    bellows::cpu::executor exec(threads);
    std::vector<float> m(n);
    float flag = 0.0f;
    bellows::cpu::compensate(exec, m, g, e, &flag);
    for (std::size_t i = 0; i < n; ++i) CHECK(m[i] == g[i] + e[i]);
    CHECK(flag == 0.0f);
    auto x = g;  // m aliasing g
    bellows::cpu::compensate(exec, x, x, e, &flag);
    CHECK(x == m);
    CHECK(flag == 0.0f);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
      for (std::size_t at : {std::size_t{0}, bellows::cpu::elementwise_chunk + 3, n - 1}) {
        auto g2 = g;
        g2[at] = bad;
        float raised = 0.0f;
        bellows::cpu::compensate(exec, m, g2, e, &raised);
        CHECK(raised == 1.0f);
      }
    }
    // finite terms that overflow raise it too: the check is on m, not on g and e
    std::vector<float> big(n, std::numeric_limits<float>::max());
    float overflow = 0.0f;
    bellows::cpu::compensate(exec, m, big, big, &overflow);
    CHECK(overflow == 1.0f);
  }
  std::vector<float> short_m(3);
  float flag = 0.0f;
  bellows::cpu::executor exec(1);
  CHECK_THROWS_AS(bellows::cpu::compensate(exec, short_m, g, e, &flag), bellows::error);
}

TEST_CASE("copy: out = x, bit for bit, for any thread count") {
  const std::size_t n = 2 * bellows::cpu::elementwise_chunk + 7;
  auto x = bellows::testing::normal_floats(n, 41);
  x[1] = std::numeric_limits<float>::quiet_NaN();
  x[2] = -0.0f;
  for (unsigned threads : {1u, 3u}) {
    bellows::cpu::executor exec(threads);
    std::vector<float> out(n, 1.0f);
    bellows::cpu::copy(exec, out, x);
    CHECK(std::memcmp(out.data(), x.data(), n * sizeof(float)) == 0);
  }
  std::vector<float> short_out(3);
  bellows::cpu::executor exec(1);
  CHECK_THROWS_AS(bellows::cpu::copy(exec, short_out, x), bellows::error);
}

TEST_CASE("divide: divides (not multiplies by the reciprocal), identically for any thread count") {
  const std::size_t n = 2 * bellows::cpu::elementwise_chunk + 3;
  const auto x = bellows::testing::normal_floats(n, 6);
  std::vector<float> expected(x);
  for (float& v : expected) v = v / 3.0f;
  for (unsigned threads : {1u, 2u, 5u}) {
    bellows::cpu::executor exec(threads);
    std::vector<float> y(x);
    bellows::cpu::divide(exec, y, 3.0f);
    CHECK(std::memcmp(y.data(), expected.data(), n * sizeof(float)) == 0);
  }
}

TEST_CASE("divide(out, x, d): out = x / d, the same bits as divide in place") {
  const std::size_t n = 2 * bellows::cpu::elementwise_chunk + 9;
  const auto x = bellows::testing::normal_floats(n, 7);
  for (unsigned threads : {1u, 3u}) {
    bellows::cpu::executor exec(threads);
    std::vector<float> in_place(x), out(n);
    bellows::cpu::divide(exec, in_place, 7.0f);
    bellows::cpu::divide(exec, out, x, 7.0f);
    CHECK(std::memcmp(out.data(), in_place.data(), n * sizeof(float)) == 0);
    bellows::cpu::divide(exec, out, x, 1.0f);
    CHECK(std::memcmp(out.data(), x.data(), n * sizeof(float)) == 0);
  }
  std::vector<float> short_out(3);
  bellows::cpu::executor exec(1);
  CHECK_THROWS_AS(bellows::cpu::divide(exec, short_out, x, 2.0f), bellows::error);
}

TEST_CASE("fill and divide gated by a verdict: the ungated bits when it is 0, nothing written when not") {
  const std::size_t n = 2 * bellows::cpu::elementwise_chunk + 9;
  const auto x = bellows::testing::normal_floats(n, 8);
  bellows::cpu::executor exec(3);
  for (const float verdict : {0.0f, 1.0f, 3.0f, -0.0f}) {
    CAPTURE(verdict);
    const bool runs = verdict == 0.0f;  // -0 is 0: a summed verdict of no rank
    std::vector<float> want(n, 5.0f), out(n, 5.0f);
    if (runs) bellows::cpu::divide(exec, want, x, 3.0f);
    bellows::cpu::divide(exec, out, x, 3.0f, &verdict);
    CHECK(std::memcmp(out.data(), want.data(), n * sizeof(float)) == 0);
    std::vector<float> same(x);  // in place, by 1: a copy onto itself
    bellows::cpu::divide(exec, same, same, 1.0f, &verdict);
    CHECK(std::memcmp(same.data(), x.data(), n * sizeof(float)) == 0);
    bellows::cpu::fill(exec, out, -1.5f, &verdict);
    CHECK(out == (runs ? std::vector<float>(n, -1.5f) : want));
  }
}

TEST_CASE("add: out = a + b, in place on either side, for any thread count") {
  const std::size_t n = 2 * bellows::cpu::elementwise_chunk + 5;
  const auto a = bellows::testing::normal_floats(n, 21);
  const auto b = bellows::testing::normal_floats(n, 22);
  for (unsigned threads : {1u, 3u}) {
    bellows::cpu::executor exec(threads);
    std::vector<float> out(n);
    bellows::cpu::add(exec, out, a, b);
    for (std::size_t i = 0; i < n; ++i) CHECK(out[i] == a[i] + b[i]);
    auto x = a;
    bellows::cpu::add(exec, x, x, b);
    CHECK(x == out);
  }
  std::vector<float> short_out(3);
  bellows::cpu::executor exec(1);
  CHECK_THROWS_AS(bellows::cpu::add(exec, short_out, a, b), bellows::error);
}

TEST_CASE("divide_by_count: the bits of a division by W, subnormals, zeros and extremes included") {
  std::vector<float> x = bellows::testing::normal_floats(4096, 11);
  const float special[] = {0.0f,
                           -0.0f,
                           std::numeric_limits<float>::denorm_min(),
                           -3e-45f,
                           1.1754942e-38f,
                           std::numeric_limits<float>::min(),
                           std::numeric_limits<float>::max(),
                           -std::numeric_limits<float>::max(),
                           1.0f,
                           3.0f,
                           7.0e-39f};
  std::copy(std::begin(special), std::end(special), x.begin());
  for (std::size_t i = 100; i < 400; ++i) x[i] *= 1e-40f;  // subnormal inputs and results
  for (std::size_t w : {1u, 2u, 3u, 4u, 5u, 7u, 8u, 64u, 96u, 1024u, 1u << 20}) {
    CAPTURE(w);
    std::vector<float> got = x;
    bellows::cpu::detail::divide_by_count(got.data(), got.size(), w);
    std::size_t same = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float want = x[i] / static_cast<float>(w);
      same += std::memcmp(&want, &got[i], sizeof want) == 0 ? 1 : 0;
    }
    CHECK(same == x.size());
  }
}
