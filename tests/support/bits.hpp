// SPDX-License-Identifier: Apache-2.0
// Bit-for-bit comparison of float arrays (NaN payloads and the sign of zero included), for the
// tests that hold two computations to the same bits.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <span>

namespace bellows::testing {

[[nodiscard]] inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return std::ranges::equal(
      a, b, [](float x, float y) { return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y); });
}

}  // namespace bellows::testing
