// SPDX-License-Identifier: Apache-2.0
// Checkpoints of the device compressors' states: the record the CPU compressors write (the step
// counter, then the error memory), so either backend resumes from what the other saved.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "bellows/core/checkpoint.hpp"
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

/// Appends `step` and the device array `memory` (empty without a memory). Waits for the stream.
inline void save_step_and_memory(executor& exec, std::uint64_t step, const device_buffer<float>& memory,
                                 checkpoint_writer& out) {
  const std::vector<float> e = to_host(exec, memory);
  out.put(step);
  out.put_array(std::span<const float>(e));
}

/// Reads what save_step_and_memory (or a CPU compressor's save) wrote into `step` and `memory`,
/// checking all of it (raising wire_error that names `what`) before either changes. Waits for
/// the stream.
inline void load_step_and_memory(executor& exec, std::uint64_t& step, device_buffer<float>& memory,
                                 checkpoint_reader& in, std::string_view what_step, std::string_view what_memory) {
  const auto s = in.get<std::uint64_t>(what_step);
  std::vector<float> e(memory.size());
  in.get_finite_array(std::span<float>(e), what_memory);
  memory = to_device(exec, e);
  step = s;
}

}  // namespace bellows::cuda
