// SPDX-License-Identifier: Apache-2.0
// The one way CUDA runtime calls are checked: BELLOWS_CUDA_CHECK raises bellows::cuda_error
// naming the call, the file and line, and CUDA's own error string. Device code never throws.
#pragma once

#include <cuda_runtime.h>

#include "bellows/core/error.hpp"

namespace bellows::cuda {

/// Raises cuda_error for a failed CUDA runtime call; `what` is the call's source text.
inline void check(cudaError_t status, const char* what, const char* file, int line) {
  if (status != cudaSuccess)
    bellows::fail<cuda_error>(file, ":", line, ": ", what, " failed: ", cudaGetErrorName(status), " (",
                              cudaGetErrorString(status), ")");
}

/// Number of CUDA devices this process can use; 0 when there is none or no driver (never throws,
/// so tests can skip cleanly on machines without a GPU).
[[nodiscard]] inline int device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

/// True when p points to device (or managed) memory, which a device collective reads in place.
[[nodiscard]] inline bool on_device(const void* p) {
  cudaPointerAttributes a{};
  check(cudaPointerGetAttributes(&a, p), "cudaPointerGetAttributes(&a, p)", __FILE__, __LINE__);
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

}  // namespace bellows::cuda

#define BELLOWS_CUDA_CHECK(call) ::bellows::cuda::check((call), #call, __FILE__, __LINE__)
