// SPDX-License-Identifier: Apache-2.0
// Size arithmetic that cannot wrap: every product or sum of counts that sizes a buffer, a payload
// or a loop goes through these, and an overflow raises bellows::error naming what was computed
// instead of yielding a small number that a later bounds check would trust.
#pragma once

#include <cstddef>
#include <limits>
#include <utility>

#include "bellows/core/error.hpp"

namespace bellows::detail {

/// a * b; bellows::error "<what...>: a * b overflows" when the product exceeds std::size_t.
template <class... What>
[[nodiscard]] constexpr std::size_t checked_mul(std::size_t a, std::size_t b, What&&... what) {
  std::size_t product = 0;
  if (__builtin_mul_overflow(a, b, &product))
    fail(std::forward<What>(what)..., ": ", a, " * ", b, " overflows std::size_t");
  return product;
}

/// a + b; bellows::error "<what...>: a + b overflows" when the sum exceeds std::size_t.
template <class... What>
[[nodiscard]] constexpr std::size_t checked_add(std::size_t a, std::size_t b, What&&... what) {
  std::size_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum))
    fail(std::forward<What>(what)..., ": ", a, " + ", b, " overflows std::size_t");
  return sum;
}

/// x rounded up to a multiple of `step` (> 0), checked like checked_add.
template <class... What>
[[nodiscard]] constexpr std::size_t checked_round_up(std::size_t x, std::size_t step, What&&... what) {
  return checked_add(x, (step - x % step) % step, std::forward<What>(what)...);
}

/// a * b, or the largest std::size_t when the product overflows: for comparisons against a
/// bound that fits (a product past the type is past every such bound).
[[nodiscard]] constexpr std::size_t saturating_mul(std::size_t a, std::size_t b) noexcept {
  std::size_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? std::numeric_limits<std::size_t>::max() : product;
}

}  // namespace bellows::detail
