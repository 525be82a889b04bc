// SPDX-License-Identifier: Apache-2.0
// A sparse vector's arrays and the magnitude order of floats: what the top-k and rand-k kernels of
// every backend share; the layout of a sparse payload (a top-k or rand-k payload: the header, the
// ascending indices, then their values) and the words its kernels report in.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

#include "bellows/core/wire.hpp"

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

/// Sparse payloads carry 64-bit indices for layers of 2^32 elements or more.
[[nodiscard]] constexpr bool wide_indices(std::uint64_t n) noexcept { return (n >> 32) != 0; }

/// The bytes of one entry of a sparse payload for a layer of n elements: its index, then its value.
[[nodiscard]] constexpr std::size_t entry_bytes(std::uint64_t n) noexcept { return (wide_indices(n) ? 8 : 4) + 4; }

/// Bytes of a sparse payload of `count` entries for a layer of n elements; bellows::error when
/// that does not fit std::size_t.
[[nodiscard]] constexpr std::size_t sparse_payload_bytes(std::uint64_t n, std::size_t count) {
  const std::size_t indices =
      wide_indices(n) ? wire::array_end<std::uint64_t>(0, count) : wire::array_end<std::uint32_t>(0, count);
  return wire::payload_bytes(wire::array_end<float>(indices, count));
}

/// The `count` entries of a sparse payload whose body starts at `body`: Index[count], then
/// float[count] right after (no padding between them for either width). Const bytes give const
/// arrays.
template <class Index, class Byte>
[[nodiscard]] auto payload_entries(Byte* body, std::size_t count) noexcept {
  constexpr bool read_only = std::is_const_v<Byte>;
  using I = std::conditional_t<read_only, const Index, Index>;
  using F = std::conditional_t<read_only, const float, float>;
  return std::pair{std::span<I>(reinterpret_cast<I*>(body), count),
                   std::span<F>(reinterpret_cast<F*>(body + sizeof(Index) * count), count)};
}

/// What a selection or a draw into a payload reports, in the backend's memory: its non-finite
/// word (set for NaN or +-Inf in its input), and its count when that varies (null: the least
/// count, the only one). The CPU counts in 64 bits, the device in 32.
template <class Count>
struct sparse_words {
  using count_type = Count;
  const unsigned* non_finite = nullptr;
  const Count* count = nullptr;
};

/// The type a backend counts a selection's entries in (sparse_words' Count): specialised beside
/// each backend's sparse payloads.
template <class Exec>
struct sparse_count_of;
template <class Exec>
using sparse_count_for = typename sparse_count_of<Exec>::type;

/// The workspace a backend keeps in a layer's state for a top-k selection and for a rand-k draw:
/// specialised beside each backend's sparse payloads (cpu/sparse_payload.hpp,
/// cuda/sparse_payload.cuh), and sized by their fit_workspace.
template <class Exec>
struct select_workspace_of;
template <class Exec>
using select_workspace_for = typename select_workspace_of<Exec>::type;
template <class Exec>
struct sample_workspace_of;
template <class Exec>
using sample_workspace_for = typename sample_workspace_of<Exec>::type;

}  // namespace bellows
