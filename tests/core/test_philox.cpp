// SPDX-License-Identifier: Apache-2.0
#include <bellows/core/philox.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <set>

using bellows::philox::u32x2;
using bellows::philox::u32x4;

namespace {
void check_kat(u32x4 counter, u32x2 key, u32x4 expected) {
  const u32x4 got = bellows::philox::philox4x32_10(counter, key);
  for (int i = 0; i < 4; ++i) CHECK(got.v[i] == expected.v[i]);
}
}  // namespace

TEST_CASE("philox4x32-10 reproduces the Random123 known-answer vectors") {
  check_kat({{0, 0, 0, 0}}, {{0, 0}}, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}});
  check_kat({{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, {{0xffffffff, 0xffffffff}},
            {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}});
  check_kat({{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, {{0xa4093822, 0x299f31d0}},
            {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}});
}

TEST_CASE("philox is usable in constant expressions") {
  constexpr u32x4 r = bellows::philox::philox4x32_10({{0, 0, 0, 0}}, {{0, 0}});
  static_assert(r.v[0] == 0x6627e8d5u, "known answer at compile time");
  CHECK(r.v[3] == 0x9b00dbd8u);
}

TEST_CASE("stream: word i is word i % 4 of block i / 4, keyed by seed, step, layer and rank") {
  const bellows::philox::stream s{0x0123456789abcdefULL, 7, 3, 1};
  for (std::uint64_t i = 0; i < 64; ++i) {
    const u32x4 expected =
        bellows::philox::philox4x32_10({{static_cast<std::uint32_t>(i / 4), 7, 3, 1}}, {{0x89abcdefu, 0x01234567u}});
    CHECK(s.word(i) == expected.v[i % 4]);
  }
  // Any change of key gives another stream.
  std::set<std::uint32_t> first_words;
  for (const bellows::philox::stream& t :
       {s, bellows::philox::stream{s.seed + 1, 7, 3, 1}, bellows::philox::stream{s.seed, 8, 3, 1},
        bellows::philox::stream{s.seed, 7, 4, 1}, bellows::philox::stream{s.seed, 7, 3, 2},
        bellows::philox::stream{s.seed, 7, 3, bellows::philox::stream::shared}})
    first_words.insert(t.word(0));
  CHECK(first_words.size() == 6);
}

TEST_CASE("uniform conversions stay in their ranges at the extremes") {
  CHECK(bellows::philox::to_uniform(0) == 0.0f);
  CHECK(bellows::philox::to_uniform(0xffffffffu) < 1.0f);
  CHECK(bellows::philox::to_uniform(0xffffffffu) == 1.0f - 0x1p-24f);
  CHECK(bellows::philox::to_uniform_nonzero(0) > 0.0);
  CHECK(bellows::philox::to_uniform_nonzero(0xffffffffu) == 1.0);
  CHECK(bellows::philox::to_below(0xffffffffu, 10) == 9);
  CHECK(bellows::philox::to_below(0, 10) == 0);
  const auto extreme = bellows::philox::to_normals(0, 0);  // the smallest uniform: the largest radius
  CHECK(std::isfinite(extreme.first));
  CHECK(extreme.first > 5.0f);
}

TEST_CASE("uniform and normal helpers have the moments they promise") {
  // One million draws: the sample mean of U[0,1) has standard deviation 0.00029, so a bound of
  // 0.0015 (over 5 sigma) fails with probability below 1e-6 for a correct generator.
  const bellows::philox::stream s{42, 0, 0, 0};
  constexpr std::uint64_t n = 1'000'000;
  double sum = 0, nsum = 0, nsq = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    const float u = bellows::philox::to_uniform(s.word(i));
    REQUIRE(u >= 0.0f);
    REQUIRE(u < 1.0f);
    sum += u;
  }
  for (std::uint64_t i = 0; i < n; i += 2) {
    const auto z = bellows::philox::to_normals(s.word(n + i), s.word(n + i + 1));
    nsum += double{z.first} + z.second;
    nsq += double{z.first} * z.first + double{z.second} * z.second;
  }
  CHECK(std::abs(sum / n - 0.5) < 0.0015);
  // Normal: mean sd 0.001, variance sd 0.0014; bounds of 5 sigma.
  CHECK(std::abs(nsum / n) < 0.005);
  CHECK(std::abs(nsq / n - 1.0) < 0.007);
}
