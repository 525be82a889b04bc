// SPDX-License-Identifier: Apache-2.0
// The layout of EF-signSGD's payload arrays (docs/signsgd.md; cpu/signs.hpp and cuda/signs.cuh
// fix the arithmetic): buckets and their scales, the sign bits, and the chunks of a scale's sum,
// the same on every backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "bellows/core/error.hpp"

namespace bellows {

/// The shape of a sign payload's arrays: n elements in buckets of `bucket` elements (0: one
/// bucket, the whole layer), one float scale per bucket and one sign bit per element.
struct sign_layout {
  std::size_t bucket = 0;
  std::size_t n = 0;

  /// Elements of a scale's sum cut into chunks of this many (from the bucket's start), each
  /// summed by `sign_lanes` interleaved float lanes combined in a fixed tree.
  static constexpr std::size_t chunk = 1024;
  static constexpr std::size_t lanes = 32;

  /// Elements of a full bucket: `bucket`, or n for bucket 0.
  [[nodiscard]] constexpr std::size_t bucket_length() const noexcept { return bucket == 0 ? n : bucket; }
  [[nodiscard]] constexpr std::size_t buckets() const noexcept {
    return n == 0 ? 0 : (bucket == 0 ? 1 : (n - 1) / bucket + 1);
  }
  /// Bucket b covers elements [begin(b), end(b)).
  [[nodiscard]] constexpr std::size_t begin(std::size_t b) const noexcept { return b * bucket_length(); }
  [[nodiscard]] constexpr std::size_t end(std::size_t b) const noexcept {
    const std::size_t e = begin(b) + bucket_length();
    return e < n ? e : n;
  }
  /// Chunks of a full bucket.
  [[nodiscard]] constexpr std::size_t chunks_per_bucket() const noexcept {
    return (bucket_length() + chunk - 1) / chunk;
  }
  [[nodiscard]] constexpr std::size_t sign_bytes() const noexcept { return (n + 7) / 8; }
};

/// One payload's arrays: a scale per bucket and the packed sign bits (element i in bit i % 8 of
/// byte i / 8).
struct sign_arrays {
  std::span<const float> scales;
  std::span<const std::uint8_t> signs;
};

namespace detail {

/// Raises bellows::error, naming `what`, when arrays of these sizes do not fit the layout.
inline void check_signs(const char* what, const sign_layout& layout, std::size_t values, std::size_t scales,
                        std::size_t sign_bytes) {
  BELLOWS_EXPECTS(values == layout.n && scales == layout.buckets() && sign_bytes == layout.sign_bytes(), what, ": ",
                  values, " values, ", scales, " scales and ", sign_bytes, " sign bytes for a layout of ", layout.n,
                  ", ", layout.buckets(), " and ", layout.sign_bytes());
}

}  // namespace detail

}  // namespace bellows
