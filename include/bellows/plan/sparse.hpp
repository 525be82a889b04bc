// SPDX-License-Identifier: Apache-2.0
// A sparse vector's arrays and the magnitude order of floats: what the top-k and rand-k kernels of
// every backend share.
#pragma once

#include <bit>
#include <cstdint>
#include <span>

namespace bellows {

/// Where a sparse vector's entries go: `index[j]` and `value[j]` for j < size, indices ascending.
template <class Index>
struct sparse_arrays {
  using index_type = Index;
  std::span<Index> index;
  std::span<float> value;
};

/// The bits of x with the sign cleared: for finite floats a and b, |a| < |b| exactly when
/// magnitude_key(a) < magnitude_key(b) (signed zeros and denormals included); NaN and +-Inf
/// have keys of at least non_finite_key.
[[nodiscard]] constexpr std::uint32_t magnitude_key(float x) noexcept {
  return std::bit_cast<std::uint32_t>(x) & 0x7FFFFFFFu;
}
inline constexpr std::uint32_t non_finite_key = 0x7F800000u;

}  // namespace bellows
