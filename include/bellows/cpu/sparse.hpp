// SPDX-License-Identifier: Apache-2.0
// CPU kernels and helpers for sparse vectors held as ascending indices and their values: the
// magnitude order of floats, one block of the error-feedback update with streaming stores, and
// the scatter-add of decoded values.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

#include "bellows/core/error.hpp"
#include "bellows/cpu/executor.hpp"

#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define BELLOWS_CPU_SSE2 1
#endif

namespace bellows::cpu {

/// Elements per task of the sparse kernels; fixed, so results never depend on the thread count.
inline constexpr std::size_t sparse_chunk = std::size_t{1} << 14;

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

namespace detail {

/// Stores four floats at `at`, bypassing the cache when `at` is 16-byte aligned (the destination
/// of a streaming pass is not read again soon, and this saves reading it first).
#if defined(BELLOWS_CPU_SSE2)
inline void stream_store(float* at, __m128 v) noexcept {
  if (reinterpret_cast<std::uintptr_t>(at) % 16 == 0)
    _mm_stream_ps(at, v);
  else
    _mm_storeu_ps(at, v);
}
#endif

/// Orders the streaming stores of this thread before whatever it does next.
inline void stream_fence() noexcept {
#if defined(BELLOWS_CPU_SSE2)
  _mm_sfence();
#endif
}

/// One block of 16 elements of v = g + e: writes v to `out` with the elements of `zero_mask`
/// (bit i: element i) set to zero, and returns whether an element of v is non-finite. When
/// `zero_mask` is not 0, `v` receives the 16 values.
inline bool compensate_block(const float* g, const float* e, float* out, std::uint32_t zero_mask,
                             float* v) noexcept {
#if defined(BELLOWS_CPU_SSE2)
  if (zero_mask == 0) {
    const __m128i magnitude = _mm_set1_epi32(0x7FFFFFFF);
    const __m128i largest_finite = _mm_set1_epi32(static_cast<int>(non_finite_key - 1));
    __m128i bad = _mm_setzero_si128();
    for (int i = 0; i < 16; i += 4) {
      const __m128 m = _mm_add_ps(_mm_loadu_ps(g + i), _mm_loadu_ps(e + i));
      bad = _mm_or_si128(bad, _mm_cmpgt_epi32(_mm_and_si128(_mm_castps_si128(m), magnitude),
                                               largest_finite));
      stream_store(out + i, m);
    }
    return _mm_movemask_epi8(bad) != 0;
  }
#endif
  std::uint32_t bad = 0;
  float staged[16];
  for (int i = 0; i < 16; ++i) {
    v[i] = g[i] + e[i];
    bad |= static_cast<std::uint32_t>(magnitude_key(v[i]) >= non_finite_key);
    staged[i] = (zero_mask >> i) & 1u ? 0.0f : v[i];
  }
#if defined(BELLOWS_CPU_SSE2)
  for (int i = 0; i < 16; i += 4) stream_store(out + i, _mm_loadu_ps(staged + i));
#else
  std::copy(staged, staged + 16, out);
#endif
  return bad != 0;
}

/// True when any of x[0, len) is non-finite.
inline bool any_non_finite(const float* x, std::size_t len) noexcept {
  std::uint32_t bad = 0;
  std::size_t i = 0;
#if defined(BELLOWS_CPU_SSE2)
  const __m128i magnitude = _mm_set1_epi32(0x7FFFFFFF);
  const __m128i largest_finite = _mm_set1_epi32(static_cast<int>(non_finite_key - 1));
  __m128i any = _mm_setzero_si128();
  for (; i + 16 <= len; i += 16)
    for (std::size_t q = 0; q < 16; q += 4)
      any = _mm_or_si128(any, _mm_cmpgt_epi32(_mm_and_si128(_mm_loadu_si128(
                                                  reinterpret_cast<const __m128i*>(x + i + q)),
                                              magnitude),
                                              largest_finite));
  bad = static_cast<std::uint32_t>(_mm_movemask_epi8(any) != 0);
#endif
  for (; i < len; ++i)
    bad |= static_cast<std::uint32_t>(magnitude_key(x[i]) >= non_finite_key);
  return bad != 0;
}

}  // namespace detail

/// acc[index[j]] += value[j] for ascending, distinct indices below acc.size().
template <class Index>
void scatter_add(executor& exec, std::span<float> acc, std::span<const Index> index,
                 std::span<const float> value) {
  BELLOWS_EXPECTS(value.size() == index.size(), "scatter_add: ", index.size(), " indices, ",
                  value.size(), " values");
  exec.for_chunks(index.size(), sparse_chunk, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t j = lo; j < hi; ++j) acc[static_cast<std::size_t>(index[j])] += value[j];
  });
}

}  // namespace bellows::cpu
