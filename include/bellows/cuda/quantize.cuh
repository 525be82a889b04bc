// SPDX-License-Identifier: Apache-2.0
// QSGD's quantisation on the device: the scales and packed codes of cpu/quantize.hpp, bit for
// bit (the arithmetic that file's header fixes, with every product and sum rounded on its own:
// no fused multiply-add), and their decoding.
//
// quantize_pack: one warp per group of four buckets (a group's codes start on a byte boundary
// for every width, so no byte is shared between warps). Eight lanes per bucket sum the squares
// in the eight interleaved partial sums the CPU uses, combined in its tree; then the warp codes
// the group's elements four at a time (one Philox block gives the four uniforms), reading them a
// second time from the cache rather than from memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "bellows/core/error.hpp"
#include "bellows/core/philox.hpp"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/launch.cuh"
#include "bellows/cuda/payload_slots.cuh"
#include "bellows/cuda/scaled_payload.cuh"
#include "bellows/plan/codes.hpp"
#include "bellows/plan/payload_slots.hpp"

namespace bellows::cuda {

namespace detail {

inline constexpr unsigned quantize_threads = 256;
inline constexpr unsigned buckets_per_warp = 4;

/// The scale of bucket [lo, hi) for the eight lanes 8q .. 8q + 7 of the calling warp (`lane8`
/// = lane % 8; all 32 lanes call). Equal to cpu::detail::bucket_scale.
__device__ inline float bucket_scale(const float* v, std::size_t lo, std::size_t hi, bucket_norm norm, unsigned lane8) {
  const unsigned base = threadIdx.x % 32 - lane8;
  if (norm == bucket_norm::max_abs) {
    std::uint32_t top = 0;
    for (std::size_t i = lo + lane8; i < hi; i += 8) top = max(top, __float_as_uint(v[i]) & 0x7FFFFFFFu);
    for (unsigned d = 1; d < 8; d *= 2) top = max(top, __shfl_xor_sync(0xFFFFFFFFu, top, d, 8));
    return __uint_as_float(top);
  }
  const std::size_t body = lo + (hi - lo) / 8 * 8;
  float acc = 0.0f;
  for (std::size_t i = lo + lane8; i < body; i += 8) acc = __fadd_rn(acc, __fmul_rn(v[i], v[i]));
  float a[8];
  for (unsigned l = 0; l < 8; ++l) a[l] = __shfl_sync(0xFFFFFFFFu, acc, static_cast<int>(base + l));
  float sum = __fadd_rn(__fadd_rn(__fadd_rn(a[0], a[1]), __fadd_rn(a[2], a[3])),
                        __fadd_rn(__fadd_rn(a[4], a[5]), __fadd_rn(a[6], a[7])));
  for (std::size_t i = body; i < hi; ++i) sum = __fadd_rn(sum, __fmul_rn(v[i], v[i]));
  if (sum >= 0x1p-100f && sum <= 0x1p100f) return sqrtf(sum);  // IEEE-rounded (-prec-sqrt=true)
  double wide = 0.0;  // rare: every lane of the bucket sums the whole bucket, in order
  for (std::size_t i = lo; i < hi; ++i) {
    const double x = v[i];
    wide = __dadd_rn(wide, __dmul_rn(x, x));
  }
  return static_cast<float>(sqrt(wide));
}

/// cpu::detail::code_of.
__device__ inline std::uint32_t code_of(float v, float inv, float u, std::int32_t s, unsigned bits) {
  const std::uint32_t b = __float_as_uint(v);
  const float x = __fadd_rn(__fmul_rn(__uint_as_float(b & 0x7FFFFFFFu), inv), u);
  const std::int32_t level = min(static_cast<std::int32_t>(x), s);
  const std::uint32_t sign = level != 0 ? (b >> 31) << (bits - 1) : 0u;
  return sign | static_cast<std::uint32_t>(level);
}

template <unsigned Bits>
__global__ void quantize_kernel(const float* in, std::size_t n, std::size_t bucket, bucket_norm norm,
                                philox::stream rng, float* scales, std::uint8_t* codes, std::size_t code_bytes,
                                unsigned* non_finite) {
  __shared__ float inv_of[quantize_threads / 32][buckets_per_warp];
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::size_t group = (blockIdx.x * std::size_t{blockDim.x} + threadIdx.x) / 32;
  const std::size_t group_lo = group * buckets_per_warp * bucket;
  if (group_lo >= n) return;  // whole warps leave together
  const std::size_t group_hi = min(n, group_lo + buckets_per_warp * bucket);
  const auto s = static_cast<std::int32_t>((1u << (Bits - 1)) - 1);

  // Scales: lanes 8q .. 8q + 7 measure bucket q of the group.
  const unsigned q = lane / 8;
  const std::size_t lo = min(n, group_lo + q * bucket), hi = min(n, lo + bucket);
  float scale = bucket_scale(in, lo, hi, norm, lane % 8);
  const bool finite = isfinite(scale);
  if (!(scale >= bellows::detail::smallest_scale)) scale = finite ? 0.0f : scale;
  if (lane % 8 == 0 && lo < hi) {
    scales[group * buckets_per_warp + q] = scale;
    if (!finite) *non_finite = 1u;
    inv_of[warp][q] = scale == 0.0f || !finite ? 0.0f : __fdiv_rn(static_cast<float>(s), scale);
  }
  __syncwarp();

  // Codes, four elements (one Philox block) per lane and step; inv 0 marks an all-zero bucket.
  constexpr unsigned per_byte = 8 / Bits;
  for (std::size_t i0 = group_lo + 4 * lane; i0 < group_hi; i0 += 4 * 32) {
    const philox::u32x4 w = rng.block(static_cast<std::uint32_t>(i0 / 4));
    std::uint32_t packed = 0;  // the quad's 4 * Bits bits
    for (unsigned t = 0; t < 4; ++t) {
      const std::size_t i = i0 + t;
      if (i >= group_hi) break;
      const float inv = inv_of[warp][(i - group_lo) / bucket];
      const std::uint32_t c = inv == 0.0f ? 0u : code_of(in[i], inv, philox::to_uniform(w.v[t]), s, Bits);
      packed |= c << (t * Bits);
    }
    const std::size_t byte = i0 * Bits / 8;  // a quad fills Bits / 2 bytes
    if (i0 + 4 <= n && reinterpret_cast<std::uintptr_t>(codes + byte) % (Bits / 2) == 0) {
      if constexpr (Bits == 8)
        *reinterpret_cast<std::uint32_t*>(codes + byte) = packed;
      else if constexpr (Bits == 4)
        *reinterpret_cast<std::uint16_t*>(codes + byte) = static_cast<std::uint16_t>(packed);
      else
        codes[byte] = static_cast<std::uint8_t>(packed);
    } else {  // the last, short quad (only the bytes of the array), or codes not aligned
      for (unsigned b = 0; b < 4 / per_byte && byte + b < code_bytes; ++b)
        codes[byte + b] = static_cast<std::uint8_t>(packed >> (8 * b));
    }
  }
}

/// The value of element i of a payload's codes (cpu::detail::decode_code, step scale / s).
template <unsigned Bits>
__device__ inline float decoded(const float* scales, const std::uint8_t* codes, std::size_t i, std::size_t bucket) {
  constexpr std::uint32_t mask = (1u << Bits) - 1, magnitude = mask >> 1;
  const std::uint32_t c = (std::uint32_t{codes[i * Bits / 8]} >> (i * Bits % 8)) & mask;
  const float step = __fdiv_rn(scales[i / bucket], static_cast<float>(magnitude));
  const float level = __fmul_rn(static_cast<float>(c & magnitude), step);
  return __uint_as_float(__float_as_uint(level) ^ ((c >> (Bits - 1)) << 31));
}

/// decoded<Bits> as a function object of (scales, codes, i), for the kernels of scaled_payload.cuh.
template <unsigned Bits>
struct code_decoder {
  std::size_t bucket;
  __device__ float operator()(const float* scales, const std::uint8_t* codes, std::size_t i) const {
    return decoded<Bits>(scales, codes, i, bucket);
  }
};

template <unsigned Bits>
__global__ void dequantize_kernel(const float* scales, const std::uint8_t* codes, std::size_t n, std::size_t bucket,
                                  float* out, bool accumulate) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float value = decoded<Bits>(scales, codes, i, bucket);
    out[i] = accumulate ? __fadd_rn(out[i], value) : value;
  }
}

}  // namespace detail

/// cpu::quantize_pack on the device (in, scales and codes in device memory): the same scales
/// and code bytes for the same input and stream. Instead of returning whether every scale is
/// finite, sets *non_finite (device memory) to 1 when one is not, and leaves it otherwise.
inline void quantize_pack(executor& exec, std::span<const float> in, const code_layout& layout, bucket_norm norm,
                          const philox::stream& rng, std::span<float> scales, std::span<std::uint8_t> codes,
                          unsigned* non_finite) {
  bellows::detail::check_codes("cuda::quantize_pack", layout, in.size(), scales.size(), codes.size());
  BELLOWS_EXPECTS(in.size() / 4 < std::size_t{1} << 32, "cuda::quantize_pack: ", in.size(),
                  " elements overrun the 2^34-word Philox stream");
  if (in.empty()) return;
  const std::size_t groups = (layout.buckets() + detail::buckets_per_warp - 1) / detail::buckets_per_warp;
  const unsigned blocks = blocks_for(groups * 32, detail::quantize_threads);
  const auto run = [&](auto kernel) {
    detail::launch(kernel, blocks, detail::quantize_threads, exec.stream(), in.data(), in.size(), layout.bucket, norm,
                   rng, scales.data(), codes.data(), codes.size(), non_finite);
  };
  switch (layout.bits) {
    case 2: run(&detail::quantize_kernel<2>); break;
    case 4: run(&detail::quantize_kernel<4>); break;
    default: run(&detail::quantize_kernel<8>); break;
  }
}

/// cpu::unpack_dequantize on the device: out[i] = value_i, or out[i] += value_i when
/// `accumulate` (the decode of each rank's payload into one sum), bit for bit as on the CPU.
inline void unpack_dequantize(executor& exec, std::span<const float> scales, std::span<const std::uint8_t> codes,
                              const code_layout& layout, std::span<float> out, bool accumulate) {
  bellows::detail::check_codes("cuda::unpack_dequantize", layout, out.size(), scales.size(), codes.size());
  if (out.empty()) return;
  std::size_t blocks = (out.size() + 255) / 256;
  if (blocks > 4096) blocks = 4096;
  const auto run = [&](auto kernel) {
    detail::launch(kernel, static_cast<unsigned>(blocks), 256u, exec.stream(), scales.data(), codes.data(), out.size(),
                   layout.bucket, out.data(), accumulate);
  };
  switch (layout.bits) {
    case 2: run(&detail::dequantize_kernel<2>); break;
    case 4: run(&detail::dequantize_kernel<4>); break;
    default: run(&detail::dequantize_kernel<8>); break;
  }
}

/// cpu::average_payloads of QSGD on the device: the average of every rank's decoded payload into
/// `out`, and, when `e` is not empty, e = m - this rank's decoded payload, in one pass (the
/// CPU's sums and quotients). Enqueued.
inline void average_payloads(executor& exec, const payload_slots& slots, const code_layout& layout,
                             const scaled_payload& shape, std::size_t rank, std::span<float> out,
                             std::span<const float> m, std::span<float> e) {
  switch (layout.bits) {
    case 2: average_scaled(exec, slots, shape, rank, detail::code_decoder<2>{layout.bucket}, out, m, e); break;
    case 4: average_scaled(exec, slots, shape, rank, detail::code_decoder<4>{layout.bucket}, out, m, e); break;
    default: average_scaled(exec, slots, shape, rank, detail::code_decoder<8>{layout.bucket}, out, m, e); break;
  }
}

}  // namespace bellows::cuda
