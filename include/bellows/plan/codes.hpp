// SPDX-License-Identifier: Apache-2.0
// The layout of QSGD's codes (docs/spec.md#qsgd; cpu/quantize.hpp fixes the arithmetic): bits per
// code, buckets and their scales, the same on every backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "bellows/core/error.hpp"

namespace bellows {

/// How a bucket's scale is measured.
enum class bucket_norm : unsigned char { l2, max_abs };

/// The shape of a QSGD code array: n elements of `bits` bits in buckets of `bucket` elements.
struct code_layout {
  unsigned bits = 8;
  std::size_t bucket = 512;
  std::size_t n = 0;

  [[nodiscard]] static constexpr bool valid_bits(unsigned b) noexcept { return b == 2 || b == 4 || b == 8; }
  /// s: magnitude levels above zero.
  [[nodiscard]] constexpr std::uint32_t levels() const noexcept { return (1u << (bits - 1)) - 1; }
  [[nodiscard]] constexpr std::size_t buckets() const noexcept { return (n + bucket - 1) / bucket; }
  [[nodiscard]] constexpr std::size_t code_bytes() const noexcept { return (n * bits + 7) / 8; }
};

/// One payload's arrays: a scale per bucket and the packed codes.
struct code_arrays {
  std::span<const float> scales;
  std::span<const std::uint8_t> codes;
};

namespace detail {

/// Scales below this are taken as 0: the bucket's codes are all zero.
inline constexpr float smallest_scale = 0x1p-100f;

/// Raises bellows::error, naming `what`, when arrays of these sizes do not fit the layout.
inline void check_codes(const char* what, const code_layout& layout, std::size_t values, std::size_t scales,
                        std::size_t code_bytes) {
  BELLOWS_EXPECTS(code_layout::valid_bits(layout.bits) && layout.bucket >= 1, what,
                  ": bits must be 2, 4 or 8 and bucket >= 1, got bits ", layout.bits, " and bucket ", layout.bucket);
  BELLOWS_EXPECTS(values == layout.n && scales == layout.buckets() && code_bytes == layout.code_bytes(), what, ": ",
                  values, " values, ", scales, " scales and ", code_bytes, " code bytes for a layout of ", layout.n,
                  ", ", layout.buckets(), " and ", layout.code_bytes());
}

}  // namespace detail

}  // namespace bellows
