// SPDX-License-Identifier: Apache-2.0
// EF-signSGD's kernels on the device: the scales and sign bits of cpu/signs.hpp, bit for bit (the
// order of sums that file's header fixes, every sum rounded on its own), and their decoding.
//
// sign_encode: one warp per chunk of 1024 elements of a bucket, lane j summing |p| of the
// chunk's elements j, j + 32, ... in order, then the shuffle-down tree (written with xor
// shuffles, which give lanes j < d the same lane[j] + lane[j + d]); a bucket of one chunk has its
// scale written by that warp, larger ones have the chunk sums kept and added in double, in
// chunk order, by one thread per bucket. The sign bits are packed by one thread per byte.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "bellows/core/error.hpp"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/launch.cuh"
#include "bellows/cuda/payload_slots.cuh"
#include "bellows/cuda/scaled_payload.cuh"
#include "bellows/plan/payload_slots.hpp"
#include "bellows/plan/signs.hpp"

namespace bellows::cuda {

namespace detail {

inline constexpr unsigned sign_threads = 256;
inline constexpr unsigned sign_max_blocks = 8192;

__device__ inline float sign_magnitude(float x) { return __uint_as_float(__float_as_uint(x) & 0x7FFFFFFFu); }

/// The decoded value of element i: the scale of its bucket, its sign bit flipped when i's bit is set.
__device__ inline float sign_decoded(const float* scales, const std::uint8_t* signs, std::size_t i,
                                     std::size_t bucket_length) {
  const std::uint32_t bit = (std::uint32_t{signs[i / 8]} >> (i % 8)) & 1u;
  return __uint_as_float(__float_as_uint(scales[i / bucket_length]) ^ (bit << 31));
}

/// sign_decoded as a function object of (scales, signs, i), for the kernels of scaled_payload.cuh.
struct sign_decoder {
  std::size_t bucket_length;
  __device__ float operator()(const float* scales, const std::uint8_t* signs, std::size_t i) const {
    return sign_decoded(scales, signs, i, bucket_length);
  }
};

/// float(sum / double(length)), and *non_finite = 1 when that is not finite.
__device__ inline float sign_scale(double sum, std::size_t length, unsigned* non_finite) {
  const auto s = static_cast<float>(sum / static_cast<double>(length));
  if (!isfinite(s)) *non_finite = 1u;
  return s;
}

/// Chunk c of bucket c / per_bucket (its chunk c % per_bucket) per warp: its sum into sums[c],
/// or, when per_bucket is 1, the bucket's scale into scales[c].
__global__ void chunk_sums_kernel(const float* in, std::size_t n, std::size_t length, std::size_t per_bucket,
                                  std::size_t chunks, float* sums, float* scales, unsigned* non_finite) {
  const unsigned lane = threadIdx.x % 32;
  const std::size_t warps = std::size_t{gridDim.x} * (blockDim.x / 32);
  for (std::size_t c = (blockIdx.x * std::size_t{blockDim.x} + threadIdx.x) / 32; c < chunks; c += warps) {
    const std::size_t b = c / per_bucket, bucket_end = min(n, (b + 1) * length);
    const std::size_t lo = b * length + (c % per_bucket) * sign_layout::chunk;
    if (lo >= bucket_end) continue;  // past the end of a short last bucket: the whole warp
    const std::size_t hi = min(bucket_end, lo + sign_layout::chunk);
    float acc = 0.0f;
    for (std::size_t i = lo + lane; i < hi; i += 32) acc = __fadd_rn(acc, sign_magnitude(in[i]));
    for (int d = 16; d >= 1; d /= 2) acc = __fadd_rn(acc, __shfl_xor_sync(0xFFFFFFFFu, acc, d));
    if (lane == 0) {
      if (per_bucket == 1)
        scales[b] = sign_scale(static_cast<double>(acc), hi - lo, non_finite);
      else
        sums[c] = acc;
    }
  }
}

/// One thread per bucket: its chunk sums added in double, in order, from 0.0, into its scale.
__global__ void bucket_scales_kernel(const float* sums, std::size_t n, std::size_t length, std::size_t per_bucket,
                                     std::size_t buckets, float* scales, unsigned* non_finite) {
  for (std::size_t b = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; b < buckets;
       b += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t lo = b * length, hi = min(n, lo + length);
    const std::size_t count = (hi - lo + sign_layout::chunk - 1) / sign_layout::chunk;
    double sum = 0.0;
    for (std::size_t k = 0; k < count; ++k) sum = __dadd_rn(sum, static_cast<double>(sums[b * per_bucket + k]));
    scales[b] = sign_scale(sum, hi - lo, non_finite);
  }
}

/// Byte k of the sign bits per thread: (p_i < 0) of elements 8k .. 8k + 7 below n.
__global__ void pack_signs_kernel(const float* in, std::size_t n, std::uint8_t* signs, std::size_t bytes) {
  for (std::size_t k = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; k < bytes;
       k += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t i0 = 8 * k, m = min(std::size_t{8}, n - i0);
    std::uint32_t byte = 0;
    for (std::size_t t = 0; t < m; ++t) byte |= static_cast<std::uint32_t>(in[i0 + t] < 0.0f) << t;
    signs[k] = static_cast<std::uint8_t>(byte);
  }
}

__global__ void sign_decode_kernel(const float* scales, const std::uint8_t* signs, std::size_t n,
                                   std::size_t bucket_length, float* out, bool accumulate) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float v = sign_decoded(scales, signs, i, bucket_length);
    out[i] = accumulate ? __fadd_rn(out[i], v) : v;
  }
}

[[nodiscard]] inline unsigned sign_blocks(std::size_t items) noexcept {
  const unsigned b = blocks_for(items, sign_threads);
  return b < sign_max_blocks ? b : sign_max_blocks;
}

}  // namespace detail

/// Floats of the workspace sign_encode needs for a layout: the chunk sums of buckets of more
/// than one chunk (0 otherwise).
[[nodiscard]] inline std::size_t sign_workspace(const sign_layout& l) noexcept {
  return l.chunks_per_bucket() > 1 ? l.buckets() * l.chunks_per_bucket() : 0;
}

/// sign_workspace in the form the code written once over executors calls.
[[nodiscard]] inline std::size_t sign_workspace(executor& /*exec*/, const sign_layout& l) noexcept {
  return sign_workspace(l);
}

/// cpu::sign_encode on the device (in, scales, signs and workspace in device memory): the same
/// scales and sign bytes for the same input. Instead of returning whether every scale is finite,
/// sets *non_finite (device memory) to 1 when one is not, and leaves it otherwise. `workspace`
/// holds sign_workspace(l) floats.
inline void sign_encode(executor& exec, std::span<const float> in, const sign_layout& l, std::span<float> scales,
                        std::span<std::uint8_t> signs, std::span<float> workspace, unsigned* non_finite) {
  bellows::detail::check_signs("cuda::sign_encode", l, in.size(), scales.size(), signs.size());
  BELLOWS_EXPECTS(workspace.size() >= sign_workspace(l), "cuda::sign_encode: workspace of ", workspace.size(),
                  " floats where ", sign_workspace(l), " are needed");
  if (in.empty()) return;
  const std::size_t per_bucket = l.chunks_per_bucket(), chunks = l.buckets() * per_bucket;
  detail::launch(&detail::chunk_sums_kernel, detail::sign_blocks(chunks * 32), detail::sign_threads, exec.stream(),
                 in.data(), l.n, l.bucket_length(), per_bucket, chunks, workspace.data(), scales.data(), non_finite);
  if (per_bucket > 1)
    detail::launch(&detail::bucket_scales_kernel, detail::sign_blocks(l.buckets()), detail::sign_threads, exec.stream(),
                   workspace.data(), l.n, l.bucket_length(), per_bucket, l.buckets(), scales.data(), non_finite);
  detail::launch(&detail::pack_signs_kernel, detail::sign_blocks(l.sign_bytes()), detail::sign_threads, exec.stream(),
                 in.data(), l.n, signs.data(), l.sign_bytes());
}

/// cpu::sign_decode on the device: out[i] = value_i, or out[i] += value_i when `accumulate`.
inline void sign_decode(executor& exec, std::span<const float> scales, std::span<const std::uint8_t> signs,
                        const sign_layout& l, std::span<float> out, bool accumulate) {
  bellows::detail::check_signs("cuda::sign_decode", l, out.size(), scales.size(), signs.size());
  if (out.empty()) return;
  detail::launch(&detail::sign_decode_kernel, detail::sign_blocks(l.n), detail::sign_threads, exec.stream(),
                 scales.data(), signs.data(), l.n, l.bucket_length(), out.data(), accumulate);
}

/// cpu::average_payloads of EF-signSGD on the device: the average of every rank's decoded payload
/// into `out`, and, when `e` is not empty, e = m - this rank's decoded payload, in one pass (the
/// CPU's sums and quotients). Enqueued.
inline void average_payloads(executor& exec, const payload_slots& slots, const sign_layout& l,
                             const scaled_payload& shape, std::size_t rank, std::span<float> out,
                             std::span<const float> m, std::span<float> e) {
  average_scaled(exec, slots, shape, rank, detail::sign_decoder{l.bucket_length()}, out, m, e);
}

}  // namespace bellows::cuda
