// SPDX-License-Identifier: Apache-2.0
// QSGD's quantisation (Alistarh et al., NeurIPS 2017) as docs/spec.md#qsgd fixes it: per bucket of d
// elements a scale (L2 norm or largest magnitude), then for each element a sign and a level
// floor(s |v_i| / scale + u_i) in [0, s], s = 2^(b-1) - 1, with u_i uniform in [0, 1) from word i
// of a Philox stream; codes of b bits (sign in the top bit), packed little-endian within bytes.
//
// Arithmetic, fixed here so that every backend computes the same bits:
//  - L2 scale: the squares summed in float over `lane_width` interleaved partial sums added in a
//    fixed tree; when that sum is not within [2^-100, 2^100] (underflow, overflow, NaN) the bucket
//    is summed again in double. The scale is the square root rounded to float.
//  - level = min(int(|v_i| * (s / scale) + u_i), s): one division per bucket; the clamp catches
//    the rounding of values at the top level. u_i = philox::to_uniform(word i).
//  - A bucket whose scale is 0, below 2^-100 or not finite gets scale 0 (not finite: left as is,
//    the caller flags the payload) and all-zero codes. A code has its sign bit set only when its
//    level is not 0, so zero is always code 0.
//  - decoded value = sign * level * (scale / s), one division per bucket.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "bellows/core/error.hpp"
#include "bellows/core/philox.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/cpu/isa.hpp"
#include "bellows/cpu/payload_slots.hpp"
#include "bellows/cpu/philox_lanes.hpp"
#include "bellows/plan/codes.hpp"
#include "bellows/plan/payload_slots.hpp"

#if BELLOWS_X86_VERSIONS
#include <immintrin.h>
#endif

namespace bellows::cpu {

namespace detail {

/// Elements per step of the quantise and dequantise loops: the words of one philox_lanes call.
inline constexpr std::size_t code_block = philox_lane_words;

/// The scale of one bucket, as the header comment fixes it.
[[nodiscard]] inline float bucket_scale(const float* v, std::size_t d, bucket_norm norm) noexcept {
  if (norm == bucket_norm::max_abs) {
    std::uint32_t top = 0;  // |v| as bits: integer order is float order, and NaN sorts above Inf
    for (std::size_t i = 0; i < d; ++i) top = std::max(top, std::bit_cast<std::uint32_t>(v[i]) & 0x7FFFFFFFu);
    return std::bit_cast<float>(top);
  }
  float acc[8] = {};
  const std::size_t body = d / 8 * 8;
  for (std::size_t i = 0; i < body; i += 8)
    for (std::size_t l = 0; l < 8; ++l) acc[l] += v[i + l] * v[i + l];
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (std::size_t i = body; i < d; ++i) sum += v[i] * v[i];
  if (sum >= 0x1p-100f && sum <= 0x1p100f) return std::sqrt(sum);
  double wide = 0.0;
  for (std::size_t i = 0; i < d; ++i) wide += static_cast<double>(v[i]) * v[i];
  return static_cast<float>(std::sqrt(wide));
}

/// The whole code blocks inside [lo, hi): [first, last), both multiples of code_block (or both
/// hi when there is none); the elements outside them are the bucket's edges.
struct block_span {
  std::size_t first, last;
};
[[nodiscard]] inline block_span whole_blocks(std::size_t lo, std::size_t hi) noexcept {
  const std::size_t first = std::min(hi, (lo + code_block - 1) / code_block * code_block);
  return {first, std::max(first, hi / code_block * code_block)};
}

/// The code of one element: sign bit (only with a non-zero level) above the level.
[[nodiscard]] inline std::uint32_t code_of(float v, float inv, float u, std::int32_t s, unsigned bits) noexcept {
  const std::uint32_t bitsv = std::bit_cast<std::uint32_t>(v);
  const float x = std::bit_cast<float>(bitsv & 0x7FFFFFFFu) * inv + u;
  const std::int32_t level = std::min(static_cast<std::int32_t>(x), s);
  const std::uint32_t sign = level != 0 ? (bitsv >> 31) << (bits - 1) : 0u;
  return sign | static_cast<std::uint32_t>(level);
}

/// Codes of elements [i0, i0 + code_block) of one bucket (i0 a multiple of code_block), packed;
/// word[t] is the stream's word for element i0 + t. Each step is a loop of independent lanes,
/// the codes and then the packing, so that the compiler vectorises both.
template <unsigned Bits>
inline void quantize_block(const float* v, std::size_t i0, float inv, std::int32_t s, const std::uint32_t* word,
                           std::uint8_t* codes) noexcept {
  std::uint32_t c[code_block];
  for (std::size_t t = 0; t < code_block; ++t) {
    // philox::to_uniform, with the conversion from a signed integer (exact: below 2^24) that
    // vector units provide
    const float u = static_cast<float>(static_cast<std::int32_t>(word[t] >> 8)) * 0x1p-24f;
    c[t] = code_of(v[t], inv, u, s, Bits);
  }
  constexpr std::size_t per_byte = 8 / Bits;
  std::uint8_t* out = codes + i0 * Bits / 8;
  for (std::size_t b = 0; b < code_block / per_byte; ++b) {
    std::uint32_t byte = 0;
    for (std::size_t k = 0; k < per_byte; ++k) byte |= c[b * per_byte + k] << (k * Bits);
    out[b] = static_cast<std::uint8_t>(byte);
  }
}

/// Zeroes the code bytes of elements [from, to) that an earlier bucket did not write: from the
/// first byte that starts at or after element `from` (a byte shared with the previous bucket
/// holds its codes already; that bucket zeroed it) to the byte of element to - 1. Buckets are
/// visited in order, and a task's first bucket starts on a byte (buckets_per_task), so every
/// byte is zeroed once, before any code is OR-ed into it.
template <unsigned Bits>
inline void zero_code_bytes(std::uint8_t* codes, std::size_t from, std::size_t to) noexcept {
  std::fill(codes + (from * Bits + 7) / 8, codes + (to * Bits + 7) / 8, std::uint8_t{0});
}

/// One bucket [lo, hi): whole code blocks by quantize_block, which writes whole bytes, and the
/// edges element by element, OR-ed into bytes zeroed here (an edge byte may be shared with the
/// next bucket).
template <unsigned Bits>
inline void quantize_bucket(const float* in, std::size_t lo, std::size_t hi, float inv, std::int32_t s,
                            const philox::stream& rng, philox_lanes_fn draw_words, std::uint8_t* codes) noexcept {
  const auto [first, last] = whole_blocks(lo, hi);
  zero_code_bytes<Bits>(codes, lo, first);
  zero_code_bytes<Bits>(codes, last, hi);
  const auto one = [&](std::size_t i) {
    const float u = philox::to_uniform(rng.word(i));
    codes[i * Bits / 8] |= static_cast<std::uint8_t>(code_of(in[i], inv, u, s, Bits) << (i * Bits % 8));
  };
  for (std::size_t i = lo; i < first; ++i) one(i);
  for (std::size_t i = first; i < last; i += code_block) {
    std::uint32_t word[code_block];
    draw_words(rng, static_cast<std::uint32_t>(i / 4), word);
    quantize_block<Bits>(in + i, i, inv, s, word, codes);
  }
  for (std::size_t i = last; i < hi; ++i) one(i);
}

/// Buckets per task: about 2^16 elements, and a multiple of 4 buckets so that no byte of codes
/// is shared between tasks (4 is the most 2-bit codes a byte holds).
[[nodiscard]] inline std::size_t buckets_per_task(std::size_t bucket) noexcept {
  const std::size_t b = std::max<std::size_t>(1, (std::size_t{1} << 16) / bucket);
  return (b + 3) / 4 * 4;
}

template <unsigned Bits>
void quantize_range(std::span<const float> in, const code_layout& layout, bucket_norm norm, const philox::stream& rng,
                    philox_lanes_fn draw_words, std::span<float> scales, std::uint8_t* codes, std::size_t b0,
                    std::size_t b1) noexcept {
  const auto s = static_cast<std::int32_t>(layout.levels());
  for (std::size_t b = b0; b < b1; ++b) {
    const std::size_t i = b * layout.bucket, j = std::min(layout.n, i + layout.bucket);
    float scale = bucket_scale(in.data() + i, j - i, norm);
    if (!(scale >= bellows::detail::smallest_scale)) scale = std::isfinite(scale) ? 0.0f : scale;
    scales[b] = scale;
    if (scale == 0.0f || !std::isfinite(scale)) {
      zero_code_bytes<Bits>(codes, i, j);
      continue;
    }
    quantize_bucket<Bits>(in.data(), i, j, static_cast<float>(s) / scale, s, rng, draw_words, codes);
  }
}

/// The value of one code: sign * level * step.
template <unsigned Bits>
[[nodiscard]] inline float decode_code(std::uint32_t c, float step) noexcept {
  constexpr std::uint32_t magnitude = (1u << (Bits - 1)) - 1;
  const float value = static_cast<float>(static_cast<std::int32_t>(c & magnitude)) * step;
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(value) ^ ((c >> (Bits - 1)) << 31));
}

template <bool Add>
inline void store(float* out, float value) noexcept {
  if constexpr (Add)
    *out += value;
  else
    *out = value;
}

/// Writes (or adds) the decoded values of elements [i0, i0 + code_block) of one bucket: the
/// codes are first spread one to a byte (the low bits of a byte hold its first code), then
/// each becomes decode_code's value.
template <unsigned Bits, bool Add>
inline void dequantize_block(const std::uint8_t* codes, std::size_t i0, float step, float* out) noexcept {
  constexpr std::size_t per_byte = 8 / Bits;
  // The codes are copied out first: stores to `out` could otherwise alias the code bytes, which
  // would keep the compiler from vectorising.
  std::uint8_t bytes[code_block / per_byte];
  std::memcpy(bytes, codes + i0 * Bits / 8, sizeof(bytes));
  std::uint8_t c[code_block];
  for (std::size_t b = 0; b < code_block / per_byte; ++b)
    for (std::size_t k = 0; k < per_byte; ++k)
      c[b * per_byte + k] = static_cast<std::uint8_t>((bytes[b] >> (k * Bits)) & ((1u << Bits) - 1));
  for (std::size_t t = 0; t < code_block; ++t) store<Add>(out + t, decode_code<Bits>(c[t], step));
}

template <unsigned Bits, bool Add>
void dequantize_range(std::span<const float> scales, const std::uint8_t* codes, const code_layout& layout,
                      std::span<float> out, std::size_t b0, std::size_t b1, bool negate = false) noexcept {
  constexpr std::uint32_t mask = (1u << Bits) - 1;
  const auto s = static_cast<float>(layout.levels());
  for (std::size_t b = b0; b < b1; ++b) {
    const std::size_t lo = b * layout.bucket, hi = std::min(layout.n, lo + layout.bucket);
    const float step = negate ? -(scales[b] / s) : scales[b] / s;
    const auto [first, last] = whole_blocks(lo, hi);
    const auto one = [&](std::size_t i) {
      const std::uint32_t c = (std::uint32_t{codes[i * Bits / 8]} >> (i * Bits % 8)) & mask;
      store<Add>(out.data() + i, decode_code<Bits>(c, step));
    };
    for (std::size_t i = lo; i < first; ++i) one(i);
    for (std::size_t i = first; i < last; i += code_block) dequantize_block<Bits, Add>(codes, i, step, out.data() + i);
    for (std::size_t i = last; i < hi; ++i) one(i);
  }
}

/// Adds the decoded values of 8-bit codes [i, i + code_block) of bucket b of every payload, in
/// payload order, to sum[0, code_block): decode_code<8>'s arithmetic, the same bits.
using sum_codes8_fn = void (*)(std::span<const code_arrays> parts, std::size_t b, std::size_t i, float s,
                               float* sum) noexcept;

inline void sum_codes8_baseline(std::span<const code_arrays> parts, std::size_t b, std::size_t i, float s,
                                float* sum) noexcept {
  for (const code_arrays& p : parts) dequantize_block<8, true>(p.codes.data(), i, p.scales[b] / s, sum);
}

#if BELLOWS_X86_VERSIONS
// sum_codes8 in AVX2's and AVX-512's vectors, the block's sums held in registers across the
// payloads. Each lane does decode_code<8>'s steps: the level converted from a 32-bit integer,
// one product with the step, the sign bit XOR-ed in, one sum; nothing is fused or reordered.

[[gnu::target("avx2")]] inline void sum_codes8_avx2(std::span<const code_arrays> parts, std::size_t b, std::size_t i,
                                                    float s, float* sum) noexcept {
  constexpr std::size_t vectors = code_block / 8;
  __m256 acc[vectors];
  for (std::size_t v = 0; v < vectors; ++v) acc[v] = _mm256_loadu_ps(sum + 8 * v);
  const __m256i magnitude = _mm256_set1_epi32(0x7F);
  for (const code_arrays& p : parts) {
    const __m256 step = _mm256_set1_ps(p.scales[b] / s);
    const std::uint8_t* codes = p.codes.data() + i;
    for (std::size_t v = 0; v < vectors; ++v) {
      const __m256i code = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + 8 * v)));
      const __m256 value = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(code, magnitude)), step);
      const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(code, 7), 31);
      acc[v] = _mm256_add_ps(acc[v], _mm256_xor_ps(value, _mm256_castsi256_ps(sign)));
    }
  }
  for (std::size_t v = 0; v < vectors; ++v) _mm256_storeu_ps(sum + 8 * v, acc[v]);
}

// GCC 12's AVX-512 headers leave an internal operand undefined on purpose, which its own
// -Wmaybe-uninitialized reports in every caller.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
[[gnu::target("avx512f")]] inline void sum_codes8_avx512(std::span<const code_arrays> parts, std::size_t b,
                                                         std::size_t i, float s, float* sum) noexcept {
  constexpr std::size_t vectors = code_block / 16;
  __m512 acc[vectors];
  for (std::size_t v = 0; v < vectors; ++v) acc[v] = _mm512_loadu_ps(sum + 16 * v);
  const __m512i magnitude = _mm512_set1_epi32(0x7F);
  for (const code_arrays& p : parts) {
    const __m512 step = _mm512_set1_ps(p.scales[b] / s);
    const std::uint8_t* codes = p.codes.data() + i;
    for (std::size_t v = 0; v < vectors; ++v) {
      const __m512i code = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * v)));
      const __m512 value = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(code, magnitude)), step);
      const __m512i sign = _mm512_slli_epi32(_mm512_srli_epi32(code, 7), 31);
      acc[v] = _mm512_add_ps(acc[v], _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(value), sign)));
    }
  }
  for (std::size_t v = 0; v < vectors; ++v) _mm512_storeu_ps(sum + 16 * v, acc[v]);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

/// The widest sum_codes8 this processor runs (chosen once).
[[nodiscard]] inline sum_codes8_fn sum_codes8_for_this_cpu() noexcept {
  static const sum_codes8_fn chosen = [] {
#if BELLOWS_X86_VERSIONS
    if (__builtin_cpu_supports("avx512f")) return &sum_codes8_avx512;
    if (__builtin_cpu_supports("avx2")) return &sum_codes8_avx2;
#endif
    return &sum_codes8_baseline;
  }();
  return chosen;
}

/// Buckets [b0, b1) of the average of W payloads: each element's decoded values summed in
/// payload order from 0.0f, then divided by W, as dequantize_range accumulating every payload
/// into zeros and a division would compute them. Elements are summed, in order, in a tile on the
/// stack (code blocks whole, bucket edges one by one), which is divided and copied out whole
/// each time it fills: one write of `out`.
/// For 8 bits, whole code blocks are summed by `sum_codes8` (a vector version where the processor
/// has one).
template <unsigned Bits>
void average_range(std::span<const code_arrays> parts, const code_layout& layout, std::span<float> out, std::size_t b0,
                   std::size_t b1, sum_codes8_fn sum_codes8) noexcept {
  constexpr std::uint32_t mask = (1u << Bits) - 1;
  const auto s = static_cast<float>(layout.levels());
  alignas(64) float tile[average_tile];
  std::fill(tile, tile + average_tile, 0.0f);       // zeroed whole, then again where it was used
  std::size_t t0 = b0 * layout.bucket, filled = 0;  // tile[j] is out[t0 + j]
  const auto flush = [&](std::size_t room) {
    if (filled + room <= average_tile) return;
    divide_by_count(tile, filled, parts.size());
    std::copy(tile, tile + filled, out.data() + t0);
    std::fill(tile, tile + filled, 0.0f);
    t0 += filled;
    filled = 0;
  };
  for (std::size_t b = b0; b < b1; ++b) {
    const std::size_t lo = b * layout.bucket, hi = std::min(layout.n, lo + layout.bucket);
    const auto [first, last] = whole_blocks(lo, hi);
    const auto one = [&](std::size_t i) {
      flush(1);
      float& sum = tile[filled++];
      for (const code_arrays& p : parts)
        sum += decode_code<Bits>((std::uint32_t{p.codes[i * Bits / 8]} >> (i * Bits % 8)) & mask, p.scales[b] / s);
    };
    for (std::size_t i = lo; i < first; ++i) one(i);
    for (std::size_t i = first; i < last; i += code_block) {
      flush(code_block);
      if constexpr (Bits == 8)
        sum_codes8(parts, b, i, s, tile + filled);
      else
        for (const code_arrays& p : parts)
          dequantize_block<Bits, true>(p.codes.data(), i, p.scales[b] / s, tile + filled);
      filled += code_block;
    }
    for (std::size_t i = last; i < hi; ++i) one(i);
  }
  flush(average_tile + 1);
}

}  // namespace detail

/// Quantises `in` into one scale per bucket and packed codes, with u_i = to_uniform(word i of
/// `rng`). Returns false when some bucket's scale is not finite (the input held NaN or Inf, or
/// its L2 norm overflows float): the caller must then flag the payload, whose codes are
/// meaningless. Tasks are groups of buckets, so the result does not depend on the thread count.
inline bool quantize_pack(executor& exec, std::span<const float> in, const code_layout& layout, bucket_norm norm,
                          const philox::stream& rng, std::span<float> scales, std::span<std::uint8_t> codes) {
  bellows::detail::check_codes("quantize_pack", layout, in.size(), scales.size(), codes.size());
  BELLOWS_EXPECTS(in.size() / 4 < std::size_t{1} << 32, "quantize_pack: ", in.size(),
                  " elements overrun the 2^34-word Philox stream");
  const philox_lanes_fn draw_words = philox_lanes_for_this_cpu();
  exec.for_chunks(layout.buckets(), detail::buckets_per_task(layout.bucket), [&](std::size_t b0, std::size_t b1) {
    run_widest([&] {
      switch (layout.bits) {
        case 2: detail::quantize_range<2>(in, layout, norm, rng, draw_words, scales, codes.data(), b0, b1); break;
        case 4: detail::quantize_range<4>(in, layout, norm, rng, draw_words, scales, codes.data(), b0, b1); break;
        default: detail::quantize_range<8>(in, layout, norm, rng, draw_words, scales, codes.data(), b0, b1); break;
      }
    });
  });
  return std::ranges::all_of(scales, [](float s) { return std::isfinite(s); });
}

/// quantize_pack in the form the device's takes: *non_finite = 1 when some scale is not finite,
/// else unchanged.
inline void quantize_pack(executor& exec, std::span<const float> in, const code_layout& layout, bucket_norm norm,
                          const philox::stream& rng, std::span<float> scales, std::span<std::uint8_t> codes,
                          unsigned* non_finite) {
  if (!quantize_pack(exec, in, layout, norm, rng, scales, codes)) *non_finite = 1u;
}

/// Decodes packed codes and their scales: out[i] = value_i, or out[i] += value_i when
/// `accumulate`; with `negate`, -value_i in place of value_i (exactly: a negated step makes
/// every product the negated one), so that accumulating gives out[i] - value_i bit for bit.
/// Codes are not checked here (every b-bit pattern is a sign and a level <= s); scales must be
/// finite and >= 0 (the codec's validation checks them).
inline void unpack_dequantize(executor& exec, std::span<const float> scales, std::span<const std::uint8_t> codes,
                              const code_layout& layout, std::span<float> out, bool accumulate, bool negate = false) {
  bellows::detail::check_codes("unpack_dequantize", layout, out.size(), scales.size(), codes.size());
  exec.for_chunks(layout.buckets(), detail::buckets_per_task(layout.bucket), [&](std::size_t b0, std::size_t b1) {
    const auto run = [&]<unsigned Bits>() {
      if (accumulate)
        detail::dequantize_range<Bits, true>(scales, codes.data(), layout, out, b0, b1, negate);
      else
        detail::dequantize_range<Bits, false>(scales, codes.data(), layout, out, b0, b1, negate);
    };
    switch (layout.bits) {
      case 2: run.template operator()<2>(); break;
      case 4: run.template operator()<4>(); break;
      default: run.template operator()<8>(); break;
    }
  });
}

/// out = (1/W) * the sum, in payload order from 0.0f, of the decoded values of W payloads
/// (W = parts.size() >= 1): the bits of unpack_dequantize accumulating every payload in order
/// into zeros, then a division by W, in one pass that reads each payload once and writes each
/// element of `out` once. Scales must be finite and >= 0.
inline void average_dequantize(executor& exec, std::span<const code_arrays> parts, const code_layout& layout,
                               std::span<float> out) {
  BELLOWS_EXPECTS(!parts.empty(), "average_dequantize: no payload to average");
  for (const code_arrays& p : parts)
    bellows::detail::check_codes("average_dequantize", layout, out.size(), p.scales.size(), p.codes.size());
  const detail::sum_codes8_fn sum_codes8 = detail::sum_codes8_for_this_cpu();
  exec.for_chunks(layout.buckets(), detail::buckets_per_task(layout.bucket), [&](std::size_t b0, std::size_t b1) {
    // The baseline build, as unpack_dequantize (in run_widest's AVX2 build the compiler copies a
    // block's codes in 16-byte pieces and reads them back in 32-byte ones, which stalls on store
    // forwarding), but for 8 bits the blocks' sums are in vectors of the widest unit.
    switch (layout.bits) {
      case 2: detail::average_range<2>(parts, layout, out, b0, b1, nullptr); break;
      case 4: detail::average_range<4>(parts, layout, out, b0, b1, nullptr); break;
      default: detail::average_range<8>(parts, layout, out, b0, b1, sum_codes8); break;
    }
  });
}

/// The next error memory of a step, written as soon as this rank's payload is, in place:
/// `me` holds m (the compensated gradient, still in cache) and becomes e = m - the decoded
/// `payload`, each value added negated (m + (-v) is m - v, bit for bit).
inline void stage_memory(executor& exec, std::span<const std::byte> payload, const code_layout& layout,
                         const scaled_payload& shape, std::span<float> me) {
  const code_arrays own = payload_slots<code_arrays>::scaled_parts(payload, shape);
  unpack_dequantize(exec, own.scales, own.codes, layout, me, true, true);
}

/// The average of a step of gathered payloads, validated: out = the average_dequantize of every
/// rank's payload. The memory was staged already (stage_memory): rank, m and e are the device's.
inline void average_payloads(executor& exec, payload_slots<code_arrays>& slots, const code_layout& layout,
                             const scaled_payload& shape, std::size_t /*rank*/, std::span<float> out,
                             std::span<const float> /*m*/, std::span<float> /*e*/) {
  average_dequantize(exec, slots.parts(shape), layout, out);
}

}  // namespace bellows::cpu
