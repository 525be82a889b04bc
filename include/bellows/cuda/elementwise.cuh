// SPDX-License-Identifier: Apache-2.0
// CUDA kernels that touch each element once, under the names of cpu/elementwise.hpp (the same
// arguments, with the CUDA executor and spans over device memory), plus the compensation step
// of error feedback fused with its finiteness check. Every kernel is enqueued on the executor's
// stream; none synchronises. Arithmetic is rounded as on the CPU (no fused multiply-add).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "bellows/core/error.hpp"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/launch.cuh"

namespace bellows::cuda {

namespace detail {

inline constexpr unsigned elementwise_threads = 256;

/// True for NaN and +-Inf (an exponent field of all ones).
__device__ inline bool non_finite(float x) noexcept { return (__float_as_uint(x) & 0x7F800000u) == 0x7F800000u; }

/// out[i] = op(i) over a grid-stride loop, unless `skip` points to a float that is not 0.
template <class Op>
__global__ void map_kernel(float* out, std::size_t n, Op op, const float* skip) {
  if (skip != nullptr && *skip != 0.0f) return;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = op(i);
}

/// Blocks of the grid-stride kernels: enough to fill any current GPU, fewer for small n.
[[nodiscard]] inline unsigned stride_blocks(std::size_t n) noexcept {
  const unsigned b = blocks_for(n, elementwise_threads);
  return b < 4096u ? b : 4096u;
}

template <class Op>
void map(executor& exec, std::span<float> out, Op op, const float* skip = nullptr) {
  if (out.empty()) return;
  launch(&map_kernel<Op>, stride_blocks(out.size()), elementwise_threads, exec.stream(), out.data(), out.size(), op,
         skip);
}

struct constant_op {
  float value;
  __device__ float operator()(std::size_t) const noexcept { return value; }
};
struct quotient_op {
  const float* x;
  float d;
  __device__ float operator()(std::size_t i) const noexcept { return __fdiv_rn(x[i], d); }
};
struct product_op {
  const float* x;
  float s;
  __device__ float operator()(std::size_t i) const noexcept { return __fmul_rn(x[i], s); }
};
struct sum_op {
  const float* a;
  const float* b;
  __device__ float operator()(std::size_t i) const noexcept { return __fadd_rn(a[i], b[i]); }
};
struct difference_op {
  const float* a;
  const float* b;
  __device__ float operator()(std::size_t i) const noexcept { return __fsub_rn(a[i], b[i]); }
};
/// m = g + e, raising *flag when m is not finite.
struct compensate_op {
  const float* g;
  const float* e;
  float* flag;
  __device__ float operator()(std::size_t i) const noexcept {
    const float m = __fadd_rn(g[i], e[i]);
    if (non_finite(m)) *flag = 1.0f;
    return m;
  }
};
/// Raises *flag when an element of x is not finite; reads only.
__global__ void flag_to_float_kernel(const unsigned* flag, float* out) { *out = *flag != 0 ? 1.0f : 0.0f; }

template <class Float, class Flag>
__global__ void flag_kernel(const Float* x, std::size_t n, Flag* flag) {
  bool bad = false;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    bad |= non_finite(x[i]);
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = Flag{1};
}

inline void same_lengths(const char* who, std::size_t a, std::size_t b) {
  BELLOWS_EXPECTS(a == b, who, ": lengths differ, ", a, " and ", b);
}

}  // namespace detail

/// Sets *flag (device memory) to 1 when an element of x is NaN or +-Inf; leaves it otherwise,
/// so one flag can collect several checks. The device form of cpu::all_finite: the answer stays
/// on the device until the caller reads it.
inline void flag_non_finite(executor& exec, std::span<const float> x, unsigned* flag) {
  if (x.empty()) return;
  detail::launch(&detail::flag_kernel<float, unsigned>, detail::stride_blocks(x.size()), detail::elementwise_threads,
                 exec.stream(), x.data(), x.size(), flag);
}

/// Sets *flag (device memory) to 1.0f when an element of x is NaN or +-Inf; leaves it otherwise:
/// a flag that is itself a float of an allreduce (the Synchronizer's finiteness vote).
inline void flag_non_finite(executor& exec, std::span<const float> x, float* flag) {
  if (x.empty()) return;
  detail::launch(&detail::flag_kernel<float, float>, detail::stride_blocks(x.size()), detail::elementwise_threads,
                 exec.stream(), x.data(), x.size(), flag);
}

/// *out = 1.0f when *flag (device memory) is set, else 0.0f: a flag as the last float of an
/// allreduce, whose sum then says whether any rank had set it.
inline void flag_to_float(executor& exec, const unsigned* flag, float* out) {
  detail::launch(&detail::flag_to_float_kernel, 1u, 1u, exec.stream(), flag, out);
}

/// x[i] = value.
inline void fill(executor& exec, std::span<float> x, float value) { detail::map(exec, x, detail::constant_op{value}); }

/// As fill(exec, x, value), unless *skip (device memory) is not 0, read on the device.
inline void fill(executor& exec, std::span<float> x, float value, const float* skip) {
  detail::map(exec, x, detail::constant_op{value}, skip);
}

/// x[i] = x[i] / d (division, as docs/spec.md#averages fixes it).
inline void divide(executor& exec, std::span<float> x, float d) {
  detail::map(exec, x, detail::quotient_op{x.data(), d});
}

/// out[i] = x[i] / d (same lengths).
inline void divide(executor& exec, std::span<float> out, std::span<const float> x, float d) {
  detail::same_lengths("divide", out.size(), x.size());
  detail::map(exec, out, detail::quotient_op{x.data(), d});
}

/// As divide(exec, out, x, d), unless *skip (device memory) is not 0: read on the device, so
/// that a step's verdict gates its last writes without a wait.
inline void divide(executor& exec, std::span<float> out, std::span<const float> x, float d, const float* skip) {
  detail::same_lengths("divide", out.size(), x.size());
  detail::map(exec, out, detail::quotient_op{x.data(), d}, skip);
}

/// x[i] = x[i] * s.
inline void scale(executor& exec, std::span<float> x, float s) {
  detail::map(exec, x, detail::product_op{x.data(), s});
}

/// x[i] = x[i] + y[i] (same lengths).
inline void add_into(executor& exec, std::span<float> x, std::span<const float> y) {
  detail::same_lengths("add_into", x.size(), y.size());
  detail::map(exec, x, detail::sum_op{x.data(), y.data()});
}

/// out[i] = a[i] + b[i] (same lengths; out may alias a or b).
inline void add(executor& exec, std::span<float> out, std::span<const float> a, std::span<const float> b) {
  detail::same_lengths("add", out.size(), a.size());
  detail::same_lengths("add", a.size(), b.size());
  detail::map(exec, out, detail::sum_op{a.data(), b.data()});
}

/// out[i] = a[i] - b[i] (same lengths; out may alias a): error feedback's update e = m - c.
inline void subtract(executor& exec, std::span<float> out, std::span<const float> a, std::span<const float> b) {
  detail::same_lengths("subtract", out.size(), a.size());
  detail::same_lengths("subtract", a.size(), b.size());
  detail::map(exec, out, detail::difference_op{a.data(), b.data()});
}

/// out[i] = x[i] (same lengths; device memory): one copy enqueued on the executor's stream.
inline void copy(executor& exec, std::span<float> out, std::span<const float> x) {
  detail::same_lengths("copy", out.size(), x.size());
  if (!out.empty())
    BELLOWS_CUDA_CHECK(
        cudaMemcpyAsync(out.data(), x.data(), out.size() * sizeof(float), cudaMemcpyDeviceToDevice, exec.stream()));
}

/// Error feedback's compensation m = g + e (same lengths; m may alias g or e) in the pass that
/// checks it: *flag (a float of device memory, as cpu::compensate's) is set to 1.0f when an
/// element of m is NaN or +-Inf, and left otherwise.
inline void compensate(executor& exec, std::span<float> m, std::span<const float> g, std::span<const float> e,
                       float* flag) {
  detail::same_lengths("compensate", m.size(), g.size());
  detail::same_lengths("compensate", g.size(), e.size());
  detail::map(exec, m, detail::compensate_op{g.data(), e.data(), flag});
}

}  // namespace bellows::cuda
