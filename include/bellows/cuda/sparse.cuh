// SPDX-License-Identifier: Apache-2.0
// Kept values put back into a dense buffer on the device: cpu/sparse.hpp's scatter-add, and the
// plain scatter of the dense top-k average (cpu::select_top_dense's writes).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "bellows/core/error.hpp"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/launch.cuh"

namespace bellows::cuda {

namespace detail {

inline constexpr unsigned scatter_threads = 256;

template <class Index>
__global__ void scatter_kernel(float* out, const Index* index, const float* value, std::size_t count, bool add) {
  for (std::size_t j = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; j < count;
       j += std::size_t{gridDim.x} * blockDim.x)
    out[index[j]] = add ? __fadd_rn(out[index[j]], value[j]) : value[j];
}

inline void scatter(executor& exec, std::span<float> out, std::span<const std::uint32_t> index,
                    std::span<const float> value, bool add) {
  BELLOWS_EXPECTS(value.size() == index.size(), "cuda::scatter: ", index.size(), " indices, ", value.size(), " values");
  if (index.empty()) return;
  const unsigned blocks = std::min(blocks_for(index.size(), scatter_threads), 4096u);
  launch(&scatter_kernel<std::uint32_t>, blocks, scatter_threads, exec.stream(), out.data(), index.data(), value.data(),
         index.size(), add);
}

}  // namespace detail

/// out[index[j]] = value[j] for distinct indices below out.size() (device memory).
inline void scatter(executor& exec, std::span<float> out, std::span<const std::uint32_t> index,
                    std::span<const float> value) {
  detail::scatter(exec, out, index, value, false);
}

/// acc[index[j]] += value[j] for distinct indices below acc.size() (device memory), as
/// cpu::scatter_add: distinct indices make every sum the CPU's.
inline void scatter_add(executor& exec, std::span<float> acc, std::span<const std::uint32_t> index,
                        std::span<const float> value) {
  detail::scatter(exec, acc, index, value, true);
}

}  // namespace bellows::cuda
