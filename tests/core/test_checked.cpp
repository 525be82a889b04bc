// SPDX-License-Identifier: Apache-2.0
#include <bellows/core/checked.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <limits>

namespace {
constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
constexpr std::size_t half = std::size_t{1} << 32;  // half * half wraps to 0
}  // namespace

TEST_CASE("checked: products and sums that fit are exact, those that wrap raise naming what") {
  using bellows::detail::checked_add;
  using bellows::detail::checked_mul;
  using bellows::detail::checked_round_up;
  CHECK(checked_mul(half - 1, half + 1, "x") == max);  // (2^32 - 1)(2^32 + 1) = 2^64 - 1
  CHECK(checked_mul(0, max, "x") == 0);
  CHECK(checked_add(max - 5, 5, "x") == max);
  CHECK(checked_round_up(13, 8, "x") == 16);
  CHECK(checked_round_up(16, 8, "x") == 16);
  CHECK(checked_round_up(max - 7, 8, "x") == max - 7);
  CHECK_THROWS_WITH_AS((void)checked_mul(half, half, "layer 'fc1'"),
                       doctest::Contains("layer 'fc1': 4294967296 * 4294967296 overflows"), bellows::error);
  CHECK_THROWS_WITH_AS((void)checked_mul(max / 3 + 1, 3, "n"), doctest::Contains("overflows"), bellows::error);
  CHECK_THROWS_WITH_AS((void)checked_add(max, 1, "total of rank ", 3),
                       doctest::Contains("total of rank 3: 18446744073709551615 + 1 overflows"), bellows::error);
  CHECK_THROWS_AS((void)checked_round_up(max - 6, 8, "x"), bellows::error);
  static_assert(checked_mul(6, 7, "x") == 42, "usable in constant expressions when it fits");
}

TEST_CASE("checked: the saturating product stops at the largest value") {
  using bellows::detail::saturating_mul;
  CHECK(saturating_mul(3, 5) == 15);
  CHECK(saturating_mul(half, half) == max);
  CHECK(saturating_mul(saturating_mul(1u << 20, max / 8), 12) == max);
  CHECK(saturating_mul(0, max) == 0);
}
