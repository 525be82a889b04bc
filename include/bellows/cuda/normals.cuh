// SPDX-License-Identifier: Apache-2.0
// cpu/normals.hpp on the device: normal numbers of a Philox stream, numbered as the CPU numbers
// them, from the same words and the same double-precision Box-Muller (philox::to_normals). The
// two agree but where the device's libm rounds log, sin or cos differently in the last bit of a
// double (then one float apart at most); the CPU emulation of the tests gives the CPU's bits.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "bellows/core/error.hpp"
#include "bellows/core/philox.hpp"
#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/launch.cuh"

namespace bellows::cuda {

namespace detail {

/// Normal numbers first .. first + count - 1 of stream s into out, as cpu::fill_normals numbers
/// them (number i is the first (i even) or second (i odd) of the pair from words 2 (i / 2) and
/// 2 (i / 2) + 1); thread `thread` of `threads` takes every threads-th pair.
__device__ inline void normals_range(float* out, std::size_t count, const philox::stream& s, std::uint64_t first,
                                     std::uint64_t thread, std::uint64_t threads) {
  const std::uint64_t end = first + count;
  for (std::uint64_t pair = first / 2 + thread; 2 * pair < end; pair += threads) {
    const std::uint64_t i = 2 * pair;
    const philox::normal_pair z = philox::to_normals(s.word(i), s.word(i + 1));
    if (i >= first) out[i - first] = z.first;
    if (i + 1 < end) out[i + 1 - first] = z.second;
  }
}

__global__ void normals_kernel(float* out, std::size_t count, philox::stream s, std::uint64_t first) {
  normals_range(out, count, s, first, blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x,
                std::uint64_t{gridDim.x} * blockDim.x);
}

/// Block j copies column j (m floats) of the previous query into the next one and, when all of
/// it is zero, draws it instead: normals j m .. j m + m - 1 of stream s, as the first draw did.
__global__ void warm_query_kernel(const float* query, float* next, std::size_t m, philox::stream s) {
  const std::size_t j = blockIdx.x;
  bool nonzero = false;
  for (std::size_t i = threadIdx.x; i < m; i += blockDim.x) {
    const float v = query[j * m + i];
    next[j * m + i] = v;
    nonzero |= v != 0.0f;
  }
  if (__syncthreads_or(nonzero)) return;
  normals_range(next + j * m, m, s, j * m, threadIdx.x, blockDim.x);
}

}  // namespace detail

/// cpu::fill_normals on the device: out[t] = normal number first + t of stream s (see the
/// file's comment for how closely the two agree). One launch on the executor's stream.
inline void fill_normals(executor& exec, std::span<float> out, const philox::stream& s, std::uint64_t first) {
  BELLOWS_EXPECTS(2 * (first + out.size()) <= philox::stream::max_words, "cuda::fill_normals: normals ", first, " .. ",
                  first + out.size(), " overrun the stream");
  if (out.empty()) return;
  detail::launch(&detail::normals_kernel, detail::stride_blocks(out.size() / 2 + 1), detail::elementwise_threads,
                 exec.stream(), out.data(), out.size(), s, first);
}

/// cpu::warm_query on the device: next = query column by column, an all-zero column drawn
/// instead as the first draw drew it. One launch, a block per column.
inline void warm_query(executor& exec, std::span<const float> query, std::span<float> next, std::size_t m,
                       const philox::stream& s) {
  BELLOWS_EXPECTS(m != 0 && next.size() % m == 0 && query.size() >= next.size(), "cuda::warm_query: a query of ",
                  query.size(), " floats for ", next.size(), " in columns of ", m);
  if (next.empty()) return;
  detail::launch(&detail::warm_query_kernel, static_cast<unsigned>(next.size() / m), detail::elementwise_threads,
                 exec.stream(), query.data(), next.data(), m, s);
}

}  // namespace bellows::cuda
