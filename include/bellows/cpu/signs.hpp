// SPDX-License-Identifier: Apache-2.0
// EF-signSGD's kernels (Karimireddy et al., ICML 2019; docs/signsgd.md): per bucket a scale, the
// mean |p_i| of its elements, and per element a sign bit (p_i < 0); the decoded value of element
// i is -scale or +scale. Packed sign bits: element i in bit i % 8 of byte i / 8.
//
// Arithmetic, fixed here so that every backend (cuda/signs.cuh too) computes the same bits:
//  - A bucket is cut into chunks of 1024 elements from its start (the last one possibly short).
//    In a chunk, lane j (0 .. 31) sums in float, from 0.0f in increasing index order, |p_i| of
//    the chunk's elements whose offset in the chunk is j mod 32; the 32 lanes then combine as a
//    warp's shuffle-down reduction does: for d = 16, 8, 4, 2, 1, lane[j] = lane[j] + lane[j + d]
//    for j < d; lane[0] is the chunk's sum.
//  - The chunk sums are added in double, in chunk order, from 0.0; the scale is
//    float(sum / double(bucket length)). A NaN or Inf anywhere in a bucket makes its scale
//    non-finite (so can a float lane that overflows).
//  - sign bit i = (p_i < 0): +0, -0, positive values and NaN give 0.
//  - decoded value = the scale with its sign bit flipped when the element's bit is 1.
// The explicit AVX2 paths (sums, sign packing, decoding) compute the same lanes in the same order as
// the scalar ones; tasks are fixed ranges of buckets or elements, so results depend neither on
// the thread count nor on the instruction set.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "bellows/core/error.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/cpu/payload_slots.hpp"
#include "bellows/plan/payload_slots.hpp"
#include "bellows/plan/signs.hpp"

#if BELLOWS_X86_VERSIONS
#include <immintrin.h>
#endif

namespace bellows::cpu {

namespace detail {

/// Elements per task of the sign kernels (64 chunks); fixed, so results never depend on threads.
inline constexpr std::size_t sign_task = std::size_t{1} << 16;
inline constexpr std::size_t sign_chunks_per_task = sign_task / sign_layout::chunk;

[[nodiscard]] inline float magnitude(float x) noexcept {
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(x) & 0x7FFFFFFFu);
}

/// The scale with its sign flipped when `bit` (0 or 1) is set: the decoded value of an element.
[[nodiscard]] inline float signed_scale(float scale, std::uint32_t bit) noexcept {
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(scale) ^ (bit << 31));
}

/// The fixed tree over the 32 lane sums (a warp's shuffle-down reduction); returns lane 0.
[[nodiscard]] inline float lane_tree(float* lane) noexcept {
  for (std::size_t d = sign_layout::lanes / 2; d >= 1; d /= 2)
    for (std::size_t j = 0; j < d; ++j) lane[j] = lane[j] + lane[j + d];
  return lane[0];
}

/// The sum of |p_i| over one chunk of len <= 1024 elements, in the order the header fixes.
[[nodiscard]] inline float chunk_sum_scalar(const float* p, std::size_t len) noexcept {
  float lane[sign_layout::lanes] = {};
  const std::size_t full = len / sign_layout::lanes * sign_layout::lanes;
  for (std::size_t i = 0; i < full; i += sign_layout::lanes)
    for (std::size_t j = 0; j < sign_layout::lanes; ++j) lane[j] += magnitude(p[i + j]);
  for (std::size_t i = full; i < len; ++i) lane[i - full] += magnitude(p[i]);
  return lane_tree(lane);
}

/// Sign bytes [first, last): byte k holds (p_i < 0) of elements i = 8k .. 8k + 7 below n.
inline void pack_signs_scalar(const float* p, std::size_t n, std::size_t first, std::size_t last,
                              std::uint8_t* signs) noexcept {
  for (std::size_t k = first; k < last; ++k) {
    const std::size_t i0 = 8 * k, m = std::min<std::size_t>(8, n - i0);
    std::uint32_t byte = 0;
    for (std::size_t t = 0; t < m; ++t) byte |= static_cast<std::uint32_t>(p[i0 + t] < 0.0f) << t;
    signs[k] = static_cast<std::uint8_t>(byte);
  }
}

#if BELLOWS_X86_VERSIONS
// The same lanes in AVX2's vectors: four vectors of eight are lanes 0 .. 31; each sum is one
// vector addition per 32 elements, in index order; nothing is fused or reordered.
[[gnu::target("avx2")]] inline float chunk_sum_avx2(const float* p, std::size_t len) noexcept {
  const __m256 mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  const std::size_t full = len / sign_layout::lanes * sign_layout::lanes;
  for (std::size_t i = 0; i < full; i += sign_layout::lanes) {
    a0 = _mm256_add_ps(a0, _mm256_and_ps(_mm256_loadu_ps(p + i), mask));
    a1 = _mm256_add_ps(a1, _mm256_and_ps(_mm256_loadu_ps(p + i + 8), mask));
    a2 = _mm256_add_ps(a2, _mm256_and_ps(_mm256_loadu_ps(p + i + 16), mask));
    a3 = _mm256_add_ps(a3, _mm256_and_ps(_mm256_loadu_ps(p + i + 24), mask));
  }
  alignas(32) float lane[sign_layout::lanes];
  _mm256_store_ps(lane, a0);
  _mm256_store_ps(lane + 8, a1);
  _mm256_store_ps(lane + 16, a2);
  _mm256_store_ps(lane + 24, a3);
  for (std::size_t i = full; i < len; ++i) lane[i - full] += magnitude(p[i]);
  return lane_tree(lane);
}

/// pack_signs_scalar, eight elements a byte by a comparison and a movemask (ordered less-than:
/// NaN and -0 give 0, as p < 0 does).
[[gnu::target("avx2")]] inline void pack_signs_avx2(const float* p, std::size_t n, std::size_t first, std::size_t last,
                                                    std::uint8_t* signs) noexcept {
  const __m256 zero = _mm256_setzero_ps();
  std::size_t k = first;
  for (; k + 4 <= last && 8 * (k + 4) <= n; k += 4) {
    const float* q = p + 8 * k;
    const auto m0 = static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(q), zero, _CMP_LT_OQ)));
    const auto m1 =
        static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(q + 8), zero, _CMP_LT_OQ)));
    const auto m2 =
        static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(q + 16), zero, _CMP_LT_OQ)));
    const auto m3 =
        static_cast<std::uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(q + 24), zero, _CMP_LT_OQ)));
    const std::uint32_t word = m0 | m1 << 8 | m2 << 16 | m3 << 24;  // little-endian: byte k first
    std::memcpy(signs + k, &word, 4);
  }
  for (; k < last && 8 * (k + 1) <= n; ++k)
    signs[k] =
        static_cast<std::uint8_t>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(p + 8 * k), zero, _CMP_LT_OQ)));
  pack_signs_scalar(p, n, k, last, signs);
}
#endif

/// The encode kernels of one instruction set.
struct sign_encoders {
  float (*chunk_sum)(const float*, std::size_t) noexcept;
  void (*pack_signs)(const float*, std::size_t, std::size_t, std::size_t, std::uint8_t*) noexcept;
};

inline constexpr sign_encoders sign_encoders_baseline{&chunk_sum_scalar, &pack_signs_scalar};

/// The widest encode kernels this processor runs (chosen once).
[[nodiscard]] inline const sign_encoders& sign_encoders_for_this_cpu() noexcept {
  static const sign_encoders chosen = [] {
#if BELLOWS_X86_VERSIONS
    if (__builtin_cpu_supports("avx2")) return sign_encoders{&chunk_sum_avx2, &pack_signs_avx2};
#endif
    return sign_encoders_baseline;
  }();
  return chosen;
}

/// Elements [lo, hi) of one bucket, lo at a chunk boundary of the bucket: the sums of its chunks
/// into sums[0, 1, ...], and the sign bytes whose first element lies in [lo, hi) (so the ranges
/// of the tasks, which partition [0, n), write every byte once).
inline void encode_range(const float* in, std::size_t n, std::size_t lo, std::size_t hi, float* sums,
                         std::uint8_t* signs, const sign_encoders& k) noexcept {
  for (std::size_t c = lo, j = 0; c < hi; c += sign_layout::chunk, ++j) {
    const std::size_t e = std::min(hi, c + sign_layout::chunk);
    sums[j] = k.chunk_sum(in + c, e - c);
    k.pack_signs(in, n, (c + 7) / 8, (e + 7) / 8, signs);
  }
}

/// A bucket's scale from its chunk sums: added in double in chunk order from 0.0, divided by
/// the bucket's length, rounded to float.
[[nodiscard]] inline float scale_from_sums(const float* sums, std::size_t length) noexcept {
  const std::size_t chunks = (length + sign_layout::chunk - 1) / sign_layout::chunk;
  double sum = 0.0;
  for (std::size_t c = 0; c < chunks; ++c) sum += static_cast<double>(sums[c]);
  return static_cast<float>(sum / static_cast<double>(length));
}

/// Calls f(a, e, b) for each piece [a, e) of [lo, hi) that lies in one bucket b, in order.
template <class F>
inline void for_bucket_pieces(const sign_layout& l, std::size_t lo, std::size_t hi, F&& f) {
  const std::size_t len = l.bucket_length();
  for (std::size_t a = lo; a < hi;) {
    const std::size_t b = a / len, e = std::min(hi, (b + 1) * len);
    f(a, e, b);
    a = e;
  }
}

/// What a decode pass does with value v of an element: out = v, out = 0.0f + v (the first term
/// of a sum from 0.0f: -0.0 becomes +0), out += v, or out = m - v.
enum class decode_mode { write, first, add, residual };

template <decode_mode Mode>
inline void decode_one(float* out, const float* m, std::size_t k, float v) noexcept {
  if constexpr (Mode == decode_mode::write)
    out[k] = v;
  else if constexpr (Mode == decode_mode::first)
    out[k] = 0.0f + v;
  else if constexpr (Mode == decode_mode::add)
    out[k] += v;
  else
    out[k] = m[k] - v;
}

/// Elements [i0, i1) (multiples of 8) of one bucket of scale s, a byte of signs at a time; out
/// and m point at element i0.
template <decode_mode Mode>
inline void decode_bytes_scalar(const std::uint8_t* signs, std::size_t i0, std::size_t i1, float s, float* out,
                                const float* m) noexcept {
  for (std::size_t i = i0; i < i1; i += 8) {
    const std::uint32_t byte = signs[i / 8];
    for (std::uint32_t t = 0; t < 8; ++t) decode_one<Mode>(out, m, i - i0 + t, signed_scale(s, (byte >> t) & 1u));
  }
}

#if BELLOWS_X86_VERSIONS
/// decode_bytes_scalar in AVX2's vectors: a byte's eight bits spread to eight lanes' sign bits,
/// XOR-ed into the scale; the same sums and differences, one rounding each.
template <decode_mode Mode>
[[gnu::target("avx2")]] inline void decode_bytes_avx2(const std::uint8_t* signs, std::size_t i0, std::size_t i1,
                                                      float s, float* out, const float* m) noexcept {
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 scale = _mm256_set1_ps(s);
  for (std::size_t i = i0; i < i1; i += 8) {
    const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(signs[i / 8]), bit), bit);
    const __m256 v = _mm256_xor_ps(scale, _mm256_castsi256_ps(_mm256_slli_epi32(set, 31)));
    float* o = out + (i - i0);
    if constexpr (Mode == decode_mode::write)
      _mm256_storeu_ps(o, v);
    else if constexpr (Mode == decode_mode::first)
      _mm256_storeu_ps(o, _mm256_add_ps(_mm256_setzero_ps(), v));
    else if constexpr (Mode == decode_mode::add)
      _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), v));
    else
      _mm256_storeu_ps(o, _mm256_sub_ps(_mm256_loadu_ps(m + (i - i0)), v));
  }
}
#endif

/// Whether the AVX2 decode runs here (checked once).
[[nodiscard]] inline bool decode_avx2() noexcept {
#if BELLOWS_X86_VERSIONS
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

/// Elements [a, e), all of one bucket of scale s: whole bytes eight elements at a time, the
/// edges one by one. out and m (used by `residual` only) point at element a.
template <decode_mode Mode>
inline void decode_piece(const std::uint8_t* signs, std::size_t a, std::size_t e, float s, float* out, const float* m,
                         bool avx2) noexcept {
  const std::size_t first = std::min(e, (a + 7) / 8 * 8), last = std::max(first, e / 8 * 8);
  const auto one = [&](std::size_t i) {
    decode_one<Mode>(out, m, i - a, signed_scale(s, (std::uint32_t{signs[i / 8]} >> (i % 8)) & 1u));
  };
  for (std::size_t i = a; i < first; ++i) one(i);
  if (first < last) {
    const float* mm = Mode == decode_mode::residual ? m + (first - a) : nullptr;  // m is null otherwise
#if BELLOWS_X86_VERSIONS
    if (avx2)
      decode_bytes_avx2<Mode>(signs, first, last, s, out + (first - a), mm);
    else
#endif
      decode_bytes_scalar<Mode>(signs, first, last, s, out + (first - a), mm);
  }
  for (std::size_t i = last; i < e; ++i) one(i);
  (void)avx2;
}

/// Elements [lo, hi) decoded from one payload's arrays into out (pointing at element lo), with
/// m (pointing at element lo) for `residual`.
template <decode_mode Mode>
inline void decode_range(const sign_arrays& p, const sign_layout& l, std::size_t lo, std::size_t hi, float* out,
                         const float* m, bool avx2) noexcept {
  for_bucket_pieces(l, lo, hi, [&](std::size_t a, std::size_t e, std::size_t b) {
    decode_piece<Mode>(p.signs.data(), a, e, p.scales[b], out + (a - lo), m == nullptr ? nullptr : m + (a - lo), avx2);
  });
}

}  // namespace detail

/// Floats of the workspace sign_encode needs for a layout: the chunk sums of buckets longer than
/// one task (2^16 elements), 0 for shorter ones.
[[nodiscard]] inline std::size_t sign_workspace(const sign_layout& l) noexcept {
  return l.bucket_length() > detail::sign_task ? l.buckets() * l.chunks_per_bucket() : 0;
}

/// Encodes `in` into one scale per bucket and the packed sign bits, as the header fixes them.
/// Returns false when some scale is not finite (the input held NaN or Inf, or a lane's float sum
/// overflowed): the caller must then flag the payload. Tasks are groups of whole buckets of at
/// most 2^16 elements, or pieces of 2^16 elements of a larger bucket, whose chunk sums are then
/// kept in `workspace` (sign_workspace(l) floats at least) and added per bucket afterwards; so
/// the result depends neither on the thread count nor on the instruction set. No allocation.
inline bool sign_encode(executor& exec, std::span<const float> in, const sign_layout& l, std::span<float> scales,
                        std::span<std::uint8_t> signs, std::span<float> workspace) {
  bellows::detail::check_signs("sign_encode", l, in.size(), scales.size(), signs.size());
  BELLOWS_EXPECTS(workspace.size() >= sign_workspace(l), "sign_encode: workspace of ", workspace.size(),
                  " floats where ", sign_workspace(l), " are needed");
  const std::size_t buckets = l.buckets(), len = l.bucket_length();
  if (buckets == 0) return true;
  const detail::sign_encoders& k = detail::sign_encoders_for_this_cpu();
  if (len <= detail::sign_task) {
    exec.for_chunks(buckets, std::max<std::size_t>(1, detail::sign_task / len), [&](std::size_t b0, std::size_t b1) {
      float sums[detail::sign_chunks_per_task];
      for (std::size_t b = b0; b < b1; ++b) {
        const std::size_t lo = l.begin(b), hi = l.end(b);
        detail::encode_range(in.data(), l.n, lo, hi, sums, signs.data(), k);
        scales[b] = detail::scale_from_sums(sums, hi - lo);
      }
    });
  } else {
    const std::size_t per_bucket = l.chunks_per_bucket();
    const std::size_t pieces = (per_bucket + detail::sign_chunks_per_task - 1) / detail::sign_chunks_per_task;
    float* sums = workspace.data();
    exec.parallel_for(buckets * pieces, [&](std::size_t t) {
      const std::size_t b = t / pieces, piece = t % pieces;
      const std::size_t lo = l.begin(b) + piece * detail::sign_task, hi = std::min(l.end(b), lo + detail::sign_task);
      if (lo < hi)
        detail::encode_range(in.data(), l.n, lo, hi, sums + b * per_bucket + piece * detail::sign_chunks_per_task,
                             signs.data(), k);
    });
    for (std::size_t b = 0; b < buckets; ++b)
      scales[b] = detail::scale_from_sums(sums + b * per_bucket, l.end(b) - l.begin(b));
  }
  return std::ranges::all_of(scales, [](float s) { return std::isfinite(s); });
}

/// sign_workspace in the form the code written once over executors calls.
[[nodiscard]] inline std::size_t sign_workspace(executor& /*exec*/, const sign_layout& l) noexcept {
  return sign_workspace(l);
}

/// sign_encode in the form the device's takes: *non_finite = 1 when some scale is not finite,
/// else unchanged.
inline void sign_encode(executor& exec, std::span<const float> in, const sign_layout& l, std::span<float> scales,
                        std::span<std::uint8_t> signs, std::span<float> workspace, unsigned* non_finite) {
  if (!sign_encode(exec, in, l, scales, signs, workspace)) *non_finite = 1u;
}

/// Decodes a payload's arrays: out[i] = value_i, or out[i] += value_i when `accumulate`. Scales
/// must be finite and >= 0 (the codec's validation checks them).
inline void sign_decode(executor& exec, const sign_arrays& p, const sign_layout& l, std::span<float> out,
                        bool accumulate) {
  bellows::detail::check_signs("sign_decode", l, out.size(), p.scales.size(), p.signs.size());
  const bool avx2 = detail::decode_avx2();
  exec.for_chunks(l.n, detail::sign_task, [&](std::size_t lo, std::size_t hi) {
    if (accumulate)
      detail::decode_range<detail::decode_mode::add>(p, l, lo, hi, out.data() + lo, nullptr, avx2);
    else
      detail::decode_range<detail::decode_mode::write>(p, l, lo, hi, out.data() + lo, nullptr, avx2);
  });
}

/// sign_decode of the arrays `scales` and `signs`, the device's form.
inline void sign_decode(executor& exec, std::span<const float> scales, std::span<const std::uint8_t> signs,
                        const sign_layout& l, std::span<float> out, bool accumulate) {
  sign_decode(exec, sign_arrays{scales, signs}, l, out, accumulate);
}

/// The error memory of a step: e[i] = m[i] - value_i of this rank's own payload.
inline void sign_residual(executor& exec, const sign_arrays& p, const sign_layout& l, std::span<const float> m,
                          std::span<float> e) {
  bellows::detail::check_signs("sign_residual", l, m.size(), p.scales.size(), p.signs.size());
  BELLOWS_EXPECTS(e.size() == m.size(), "sign_residual: memory of ", e.size(), " for ", m.size(), " values");
  const bool avx2 = detail::decode_avx2();
  exec.for_chunks(l.n, detail::sign_task, [&](std::size_t lo, std::size_t hi) {
    detail::decode_range<detail::decode_mode::residual>(p, l, lo, hi, e.data() + lo, m.data() + lo, avx2);
  });
}

/// out = (1/W) * the sum, in payload order from 0.0f, of the decoded values of W payloads
/// (W = parts.size() >= 1), the division as QSGD's average_dequantize does it
/// (detail::divide_by_count). One pass over `out`: each block of `average_tile` elements (16 KiB,
/// which stays in the first-level cache) gets 0.0f + payload 0's values, then the other
/// payloads' added in order, then the division. Scales must be finite and >= 0.
inline void sign_average(executor& exec, std::span<const sign_arrays> parts, const sign_layout& l,
                         std::span<float> out) {
  BELLOWS_EXPECTS(!parts.empty(), "sign_average: no payload to average");
  for (const sign_arrays& p : parts)
    bellows::detail::check_signs("sign_average", l, out.size(), p.scales.size(), p.signs.size());
  const bool avx2 = detail::decode_avx2();
  exec.for_chunks(l.n, detail::sign_task, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t t0 = lo; t0 < hi; t0 += average_tile) {
      const std::size_t t1 = std::min(hi, t0 + average_tile);
      float* block = out.data() + t0;
      detail::decode_range<detail::decode_mode::first>(parts[0], l, t0, t1, block, nullptr, avx2);
      for (std::size_t r = 1; r < parts.size(); ++r)
        detail::decode_range<detail::decode_mode::add>(parts[r], l, t0, t1, block, nullptr, avx2);
      detail::divide_by_count(block, t1 - t0, parts.size());
    }
  });
}

/// The next error memory of a step, written as soon as this rank's payload is, in place: `me`
/// holds m (the compensated gradient, still in cache) and becomes the sign_residual of `payload`
/// against it (each element reads m before it writes e, so the two may be one array).
inline void stage_memory(executor& exec, std::span<const std::byte> payload, const sign_layout& l,
                         const scaled_payload& shape, std::span<float> me) {
  sign_residual(exec, payload_slots<sign_arrays>::scaled_parts(payload, shape), l, me, me);
}

/// The average of a step of gathered payloads, validated: out = the sign_average of every rank's
/// payload. The memory was staged already (stage_memory): rank, m and e are the device's.
inline void average_payloads(executor& exec, payload_slots<sign_arrays>& slots, const sign_layout& l,
                             const scaled_payload& shape, std::size_t /*rank*/, std::span<float> out,
                             std::span<const float> /*m*/, std::span<float> /*e*/) {
  sign_average(exec, slots.parts(shape), l, out);
}

}  // namespace bellows::cpu
