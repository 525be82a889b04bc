// SPDX-License-Identifier: Apache-2.0
// Streaming stores: writing a buffer that is not read again soon without first reading it into
// the cache (the read a plain store of a whole cache line costs), for the kernels whose output is
// larger than the caches.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define BELLOWS_CPU_SSE2 1
#endif

namespace bellows::cpu {

/// Outputs of at least this many bytes are written with streaming stores by the kernels that
/// write a whole output (averages of payloads); smaller ones stay in the cache for whatever reads
/// them next.
inline constexpr std::size_t streaming_output_bytes = std::size_t{1} << 22;

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
#endif

/// Copies len floats from `from` to `to`: with streaming stores when `stream` (then `to` must be
/// 16-byte aligned; a tail of fewer than four floats is stored plainly), else with plain stores.
inline void copy_out(float* to, const float* from, std::size_t len, bool stream) noexcept {
  std::size_t i = 0;
#if defined(BELLOWS_CPU_SSE2)
  if (stream)
    for (; i + 4 <= len; i += 4) stream_store(to + i, _mm_loadu_ps(from + i));
#else
  (void)stream;
#endif
  std::copy(from + i, from + len, to + i);
}

/// Orders the streaming stores of this thread before whatever it does next.
inline void stream_fence() noexcept {
#if defined(BELLOWS_CPU_SSE2)
  _mm_sfence();
#endif
}

}  // namespace detail

/// Whether a kernel writing all of `out` (n floats) uses streaming stores: large enough and
/// aligned for them.
[[nodiscard]] inline bool streams_output(const float* out, std::size_t n) noexcept {
#if defined(BELLOWS_CPU_SSE2)
  return n * sizeof(float) >= streaming_output_bytes && detail::stream_aligned(out);
#else
  (void)out, (void)n;
  return false;
#endif
}

}  // namespace bellows::cpu
