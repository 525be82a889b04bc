// SPDX-License-Identifier: Apache-2.0
// What the device compressors share around a layer's step: the checks made before a step
// enqueues anything, and the error memory a layer's state starts with.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string_view>

#include "bellows/core/error.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/cuda/buffer.cuh"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/feedback/error_feedback.hpp"

namespace bellows::cuda {

/// Raises bellows::error, naming `who` and the layer, when a buffer of `size` elements does not
/// fit the layer, or when the collective enqueues on `stream` and the executor on another (their
/// work would then race).
inline void check_step(std::string_view who, const layer_info& layer, std::size_t size, cudaStream_t stream,
                       const executor& exec) {
  BELLOWS_EXPECTS(size == layer.size(), who, ": layer '", layer.name, "' of shape ", layer.shape.to_string(), " has ",
                  layer.size(), " elements, the buffer ", size);
  BELLOWS_EXPECTS(stream == exec.stream(), who, ": layer '", layer.name,
                  "': the collective and the executor enqueue on different streams; give both the same one");
}

/// Raises bellows::error when a state's memory does not fit feedback `kind` (a state made by a
/// compressor with or without a memory, used by one of the other kind).
inline void check_memory(std::string_view who, const layer_info& layer, const device_buffer<float>& memory,
                         feedback kind) {
  BELLOWS_EXPECTS((memory.size() == 0) == (kind == feedback::none || layer.size() == 0), who, ": layer '", layer.name,
                  "' has a state made ", memory.size() == 0 ? "without" : "with",
                  " an error memory, used by a compressor with feedback ", to_string(kind));
}

/// A layer's error memory for feedback `kind`: n zeros (the clearing enqueued on the executor's
/// stream), or no memory for feedback::none.
[[nodiscard]] inline device_buffer<float> zero_memory(feedback kind, std::size_t n, const executor& exec) {
  if (kind == feedback::none) return {};
  device_buffer<float> e(n);
  if (n != 0) BELLOWS_CUDA_CHECK(cudaMemsetAsync(e.data(), 0, n * sizeof(float), exec.stream()));
  return e;
}

}  // namespace bellows::cuda
