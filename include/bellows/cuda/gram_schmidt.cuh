// SPDX-License-Identifier: Apache-2.0
// cpu::orthogonalize on the device: modified Gram-Schmidt over the columns of PowerSGD's P or Q
// with the rules of cpu/gram_schmidt.hpp. Norms and projections are accumulated in double and
// rounded once to float; column j is divided by (its norm + eps); a column of norm 0 stays 0; a
// column that lost more than half its norm to the columns before it (among the first 64) has
// their projections removed a second time before it is normalised.
//
// One block of 1024 threads does the whole factor in one launch, so nothing waits on the host.
// Thread t owns elements t, t + 1024, ... of every column: it alone reads and writes them, so
// the only exchange between threads is the sum of each dot product, reduced in a fixed order
// (a butterfly within each warp, then one over the 32 warp sums), and the result is the same on
// every run. The work is O(rows * rank^2) on one multiprocessor: small beside the products for
// PowerSGD's factors (rows up to some 10^5), which live in the L2 cache.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <span>

#include "bellows/core/error.hpp"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/launch.cuh"

namespace bellows::cuda {

namespace detail {

inline constexpr unsigned orthogonalize_threads = 1024;
/// Columns whose first norm is remembered for the second-pass rule, as on the CPU; later
/// columns see plain MGS.
inline constexpr std::size_t remembered_columns = 64;

static_assert(orthogonalize_threads == 32 * 32, "block_sum gives each of a warp's lanes one warp's sum");

/// The sum of v over a warp by a butterfly: every lane ends with the same bits (a + b == b + a).
/// All 32 lanes call it.
template <class T>
__device__ inline T warp_sum(T v) {
#pragma unroll
  for (int d = 16; d > 0; d /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, d);
  return v;
}

/// The sum over the block of every thread's v, returned to every thread: each warp's sum, then
/// in every warp the same butterfly over the 32 warp sums (`warp_sums`: one double per warp).
/// Begins and ends with the block in step, so calls may follow each other.
__device__ inline double block_sum(double v, double* warp_sums) {
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  const double s = warp_sum(warp_sums[threadIdx.x % 32]);
  __syncthreads();
  return s;
}

/// sum_i a[i] * b[i] in double over the whole column (each thread its own elements).
__device__ inline double column_dot(const float* a, const float* b, std::size_t rows, double* warp_sums) {
  double s = 0.0;
  for (std::size_t i = threadIdx.x; i < rows; i += orthogonalize_threads)
    s = __fma_rn(static_cast<double>(a[i]), static_cast<double>(b[i]), s);  // the product is exact
  return block_sum(s, warp_sums);
}

/// d -= (c . d) c, the projection rounded to float first, as on the CPU.
__device__ inline void remove_projection(const float* c, float* d, std::size_t rows, double* warp_sums) {
  const auto projection = static_cast<float>(column_dot(c, d, rows, warp_sums));
  for (std::size_t i = threadIdx.x; i < rows; i += orthogonalize_threads)
    d[i] = __fsub_rn(d[i], __fmul_rn(projection, c[i]));
}

__global__ void __launch_bounds__(orthogonalize_threads)
    orthogonalize_kernel(float* cols, std::size_t rows, std::size_t rank, float eps) {
  __shared__ double warp_sums[orthogonalize_threads / 32];
  __shared__ double before[remembered_columns];
  for (std::size_t j = 0; j < rank && j < remembered_columns; ++j) {
    const float* c = cols + j * rows;
    const double norm2 = column_dot(c, c, rows, warp_sums);
    if (threadIdx.x == 0) before[j] = norm2;
  }
  __syncthreads();
  for (std::size_t j = 0; j < rank; ++j) {
    float* c = cols + j * rows;
    double norm2 = column_dot(c, c, rows, warp_sums);  // the same value in every thread
    if (j > 0 && j < remembered_columns && norm2 < 0.25 * before[j]) {
      for (std::size_t l = 0; l < j; ++l) remove_projection(cols + l * rows, c, rows, warp_sums);
      norm2 = column_dot(c, c, rows, warp_sums);
    }
    const auto norm = static_cast<float>(sqrt(norm2));
    if (norm == 0.0f) continue;  // a zero column stays zero; its projections are zero too
    const float divisor = __fadd_rn(norm, eps);
    for (std::size_t i = threadIdx.x; i < rows; i += orthogonalize_threads) c[i] = __fdiv_rn(c[i], divisor);
    for (std::size_t l = j + 1; l < rank; ++l) remove_projection(c, cols + l * rows, rows, warp_sums);
  }
}

}  // namespace detail

/// cpu::orthogonalize on the device: orthonormalises in place the cols.size() / rows columns of
/// `cols` (device memory, column j at j * rows). One kernel launch on the executor's stream; no
/// workspace.
inline void orthogonalize(executor& exec, std::span<float> cols, std::size_t rows, float eps) {
  if (rows == 0) return;
  BELLOWS_EXPECTS(cols.size() % rows == 0, "cuda::orthogonalize: ", cols.size(), " floats are not whole columns of ",
                  rows);
  BELLOWS_EXPECTS(eps >= 0.0f, "cuda::orthogonalize: eps must be >= 0, got ", eps);
  if (cols.empty()) return;
  detail::launch(&detail::orthogonalize_kernel, 1u, detail::orthogonalize_threads, exec.stream(), cols.data(), rows,
                 cols.size() / rows, eps);
}

}  // namespace bellows::cuda
