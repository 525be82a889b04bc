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
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/plan/sparse.hpp"

#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define BELLOWS_CPU_SSE2 1
#endif

namespace bellows::cpu {

/// Elements per task of the sparse kernels; fixed, so results never depend on the thread count.
inline constexpr std::size_t sparse_chunk = std::size_t{1} << 14;

namespace detail {

/// Where the kernels that write a whole buffer with streaming stores need it to start: 16 bytes,
/// which the storage of a std::vector<float> has.
[[nodiscard]] inline bool stream_aligned(const float* p) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

#if defined(BELLOWS_CPU_SSE2)
/// Stores four floats at a 16-byte aligned `at`, bypassing the cache: the destination of a
/// streaming pass is not read again soon, and this saves reading it first.
inline void stream_store(float* at, __m128 v) noexcept { _mm_stream_ps(at, v); }

/// lane_masks[m]: all ones in lane i where bit i of m is set.
struct lane_mask_table {
  alignas(16) std::uint32_t lanes[16][4];
};
inline constexpr lane_mask_table lane_masks = [] {
  lane_mask_table t{};
  for (std::uint32_t m = 0; m < 16; ++m)
    for (std::uint32_t l = 0; l < 4; ++l) t.lanes[m][l] = (m >> l) & 1u ? 0xFFFFFFFFu : 0u;
  return t;
}();
#endif

/// Orders the streaming stores of this thread before whatever it does next.
inline void stream_fence() noexcept {
#if defined(BELLOWS_CPU_SSE2)
  _mm_sfence();
#endif
}

/// One block of 16 elements of v = g + e: writes v to `out` (16-byte aligned) with the elements
/// of `zero_mask` (bit i: element i) set to zero, without branching on the mask; returns whether
/// an element of v is non-finite.
inline bool compensate_block(const float* g, const float* e, float* out, std::uint32_t zero_mask) noexcept {
#if defined(BELLOWS_CPU_SSE2)
  const __m128i magnitude = _mm_set1_epi32(0x7FFFFFFF);
  const __m128i largest_finite = _mm_set1_epi32(static_cast<int>(non_finite_key - 1));
  __m128i bad = _mm_setzero_si128();
  for (int i = 0; i < 16; i += 4) {
    const __m128 m = _mm_add_ps(_mm_loadu_ps(g + i), _mm_loadu_ps(e + i));
    bad = _mm_or_si128(bad, _mm_cmpgt_epi32(_mm_and_si128(_mm_castps_si128(m), magnitude), largest_finite));
    const __m128 zero = _mm_load_ps(reinterpret_cast<const float*>(lane_masks.lanes[(zero_mask >> i) & 15u]));
    stream_store(out + i, _mm_andnot_ps(zero, m));
  }
  return _mm_movemask_epi8(bad) != 0;
#else
  std::uint32_t bad = 0;
  for (int i = 0; i < 16; ++i) {
    const float m = g[i] + e[i];
    bad |= static_cast<std::uint32_t>(magnitude_key(m) >= non_finite_key);
    out[i] = (zero_mask >> i) & 1u ? 0.0f : m;
  }
  return bad != 0;
#endif
}

/// True when any of x[0, len) is non-finite.
inline bool any_non_finite(const float* x, std::size_t len) noexcept {
  std::uint32_t bad = 0;
#if defined(BELLOWS_CPU_SSE2)
  const std::size_t body = len / 16 * 16;
  const __m128i magnitude = _mm_set1_epi32(0x7FFFFFFF);
  const __m128i largest_finite = _mm_set1_epi32(static_cast<int>(non_finite_key - 1));
  __m128i any = _mm_setzero_si128();
  for (std::size_t i = 0; i < body; i += 16)
    for (std::size_t q = 0; q < 16; q += 4) {
      const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i + q));
      any = _mm_or_si128(any, _mm_cmpgt_epi32(_mm_and_si128(bits, magnitude), largest_finite));
    }
  bad = static_cast<std::uint32_t>(_mm_movemask_epi8(any) != 0);
#else
  const std::size_t body = 0;
#endif
  for (std::size_t i = body; i < len; ++i) bad |= static_cast<std::uint32_t>(magnitude_key(x[i]) >= non_finite_key);
  return bad != 0;
}

}  // namespace detail

/// acc[index[j]] += value[j] for ascending, distinct indices below acc.size(); nothing when
/// `skip` points to a float that is not 0 (a step's verdict).
template <class Index>
void scatter_add(executor& exec, std::span<float> acc, std::span<const Index> index, std::span<const float> value,
                 const float* skip = nullptr) {
  BELLOWS_EXPECTS(value.size() == index.size(), "scatter_add: ", index.size(), " indices but ", value.size(),
                  " values");
  if (skip != nullptr && *skip != 0.0f) return;
  exec.for_chunks(index.size(), sparse_chunk, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t j = lo; j < hi; ++j) acc[static_cast<std::size_t>(index[j])] += value[j];
  });
}

/// One sparse vector to read: ascending, distinct indices and their values.
template <class Index>
struct sparse_view {
  std::span<const Index> index;
  std::span<const float> value;
};

/// Elements per task of scatter_average.
inline constexpr std::size_t average_chunk = std::size_t{1} << 16;

/// The workspace scatter_average needs for W parts and n elements: one cursor per part and task.
[[nodiscard]] constexpr std::size_t scatter_average_cursors(std::size_t parts, std::size_t n) noexcept {
  return parts * ((n + average_chunk - 1) / average_chunk);
}

/// out = (1/W) * the sum, part by part in order from 0.0f, of the W parts scattered into n zeros
/// (W = parts.size() >= 1; each part's indices ascending, distinct, below out.size()). The same
/// bits as filling out with zeros, scatter_add of each part in order and dividing every element
/// by W, in one write of `out`: each tile of `average_tile` elements is summed in a buffer on the
/// stack (in the first-level cache), divided, and copied out whole. One part is the fill and one
/// scatter_add, which measured faster: the fill writes `out` without reading it first, the copy of
/// a tile does not. `cursors` holds scatter_average_cursors(W, n) positions.
template <class Index>
void scatter_average(executor& exec, std::span<float> out, std::span<const sparse_view<Index>> parts,
                     std::span<std::size_t> cursors) {
  const std::size_t w = parts.size(), n = out.size();
  BELLOWS_EXPECTS(w >= 1 && cursors.size() >= scatter_average_cursors(w, n), "scatter_average: ", w, " parts with ",
                  cursors.size(), " cursors for ", n, " elements");
  for (const sparse_view<Index>& p : parts)
    BELLOWS_EXPECTS(p.index.size() == p.value.size(), "scatter_average: ", p.index.size(), " indices, ", p.value.size(),
                    " values");
  if (w == 1) {  // the same sum, and x / 1 is x
    fill(exec, out, 0.0f);
    scatter_add(exec, out, parts[0].index, parts[0].value);
    return;
  }
  exec.for_chunks(n, average_chunk, [&](std::size_t lo, std::size_t hi) {
    const std::span<std::size_t> at = cursors.subspan(lo / average_chunk * w, w);
    for (std::size_t r = 0; r < w; ++r)
      at[r] = static_cast<std::size_t>(std::ranges::lower_bound(parts[r].index, lo) - parts[r].index.begin());
    alignas(64) float tile[average_tile];
    for (std::size_t t0 = lo; t0 < hi; t0 += average_tile) {
      const std::size_t t1 = std::min(hi, t0 + average_tile), len = t1 - t0;
      std::fill(tile, tile + len, 0.0f);
      for (std::size_t r = 0; r < w; ++r) {
        const Index* index = parts[r].index.data();
        const float* value = parts[r].value.data();
        std::size_t j = at[r];
        for (const std::size_t end = parts[r].index.size(); j < end && index[j] < t1; ++j)
          tile[static_cast<std::size_t>(index[j]) - t0] += value[j];
        at[r] = j;
      }
      detail::divide_by_count(tile, len, w);
      std::copy(tile, tile + len, out.data() + t0);
    }
  });
}

}  // namespace bellows::cpu
