// SPDX-License-Identifier: Apache-2.0
// Whole arrays between host and device memory, complete on return: for checkpoints and other
// rare copies, never for a step's hot path.
#pragma once

#include <cuda_runtime.h>

#include <span>
#include <vector>

#include "bellows/cuda/buffer.cuh"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/executor.cuh"

namespace bellows::cuda {

/// A device array copied back, after the work enqueued before on the executor's stream.
[[nodiscard]] inline std::vector<float> to_host(executor& exec, const device_buffer<float>& d) {
  std::vector<float> h(d.size());
  if (!h.empty())
    BELLOWS_CUDA_CHECK(
        cudaMemcpyAsync(h.data(), d.data(), h.size() * sizeof(float), cudaMemcpyDeviceToHost, exec.stream()));
  exec.synchronize();
  return h;
}

/// A device copy of h, complete on return (so a buffer it replaces is idle).
[[nodiscard]] inline device_buffer<float> to_device(executor& exec, std::span<const float> h) {
  device_buffer<float> d(h.size());
  if (!h.empty())
    BELLOWS_CUDA_CHECK(
        cudaMemcpyAsync(d.data(), h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice, exec.stream()));
  exec.synchronize();
  return d;
}

}  // namespace bellows::cuda
