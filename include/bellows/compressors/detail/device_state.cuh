// SPDX-License-Identifier: Apache-2.0
// What the device compressors (compressors/*.cuh) share around a layer's state: the checks made
// before a step enqueues anything, the error memory a state starts with, and the checkpoint
// record of compressors/detail/step_record.hpp read from and written to device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "bellows/compressors/detail/step_record.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/cuda/buffer.cuh"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/transfer.cuh"
#include "bellows/plan/feedback.hpp"

namespace bellows::detail {

/// Raises bellows::error, naming `who` and the layer, when a buffer of `size` elements does not
/// fit the layer, or when the collective enqueues on `stream` and the executor on another (their
/// work would then race).
inline void check_step(std::string_view who, const layer_info& layer, std::size_t size, cudaStream_t stream,
                       const cuda::executor& exec) {
  BELLOWS_EXPECTS(size == layer.size(), who, ": layer '", layer.name, "' of shape ", layer.shape.to_string(), " has ",
                  layer.size(), " elements, the buffer ", size);
  BELLOWS_EXPECTS(stream == exec.stream(), who, ": layer '", layer.name,
                  "': the collective and the executor enqueue on different streams; give both the same one");
}

/// Raises bellows::error when a state's memory does not fit feedback `kind` (a state made by a
/// compressor with or without a memory, used by one of the other kind).
inline void check_memory(std::string_view who, const layer_info& layer, const cuda::device_buffer<float>& memory,
                         feedback kind) {
  BELLOWS_EXPECTS((memory.size() == 0) == (kind == feedback::none || layer.size() == 0), who, ": layer '", layer.name,
                  "' has a state made ", memory.size() == 0 ? "without" : "with",
                  " an error memory, used by a compressor with feedback ", to_string(kind));
}

/// A layer's error memory for feedback `kind`: n zeros (the clearing enqueued on the executor's
/// stream), or no memory for feedback::none.
[[nodiscard]] inline cuda::device_buffer<float> zero_memory(feedback kind, std::size_t n, const cuda::executor& exec) {
  if (kind == feedback::none) return {};
  cuda::device_buffer<float> e(n);
  if (n != 0) BELLOWS_CUDA_CHECK(cudaMemsetAsync(e.data(), 0, n * sizeof(float), exec.stream()));
  return e;
}

/// The device form of error_memory::rescale: a `scaled` memory multiplied by lr_old / lr_new
/// (the quotient in float, each element rounded as cpu::scale rounds it), enqueued; any other
/// memory left as it is. Raises bellows::error, naming `who`, for a rate that is not > 0.
inline void rescale_memory(std::string_view who, cuda::executor& exec, cuda::device_buffer<float>& memory,
                           feedback kind, float lr_old, float lr_new) {
  BELLOWS_EXPECTS(lr_old > 0 && lr_new > 0, who, ": learning rates must be > 0, got ", lr_old, " and ", lr_new);
  if (kind == feedback::scaled && lr_old != lr_new) cuda::scale(exec, memory.span(), lr_old / lr_new);
}

/// Appends the step record of a state whose error memory is in device memory (empty without
/// one). Waits for the executor's stream.
inline void save_step_record(cuda::executor& exec, std::uint64_t step, const cuda::device_buffer<float>& memory,
                             checkpoint_writer& out) {
  const std::vector<float> e = cuda::to_host(exec, memory);
  write_step_record(out, step, e);
}

/// Reads a step record (written by either backend) into `step` and the device `memory`,
/// checking all of it before either changes. Waits for the stream.
inline void load_step_record(cuda::executor& exec, std::uint64_t& step, cuda::device_buffer<float>& memory,
                             checkpoint_reader& in, std::string_view what_step, std::string_view what_memory) {
  const step_record rec = read_step_record(in, memory.size(), what_step, what_memory);
  memory = cuda::to_device(exec, rec.memory);
  step = rec.step;
}

}  // namespace bellows::detail
