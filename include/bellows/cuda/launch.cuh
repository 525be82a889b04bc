// SPDX-License-Identifier: Apache-2.0
// Kernel launches, written once: enqueue on a stream, then check the launch. Every kernel of
// bellows starts here, which is also the one place the CPU emulation of CUDA used by the tests
// (tests/emulation) takes over: there the kernel runs at once, its blocks one after another,
// each thread a fiber.
#pragma once

#include <cuda_runtime.h>

#include "bellows/cuda/check.cuh"

namespace bellows::cuda::detail {

/// Enqueues kernel<<<blocks, threads, 0, stream>>>(args...) and raises bellows::cuda_error when
/// the launch fails (a bad configuration; errors inside the kernel surface later, on the stream).
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), unsigned blocks, unsigned threads, cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "launch: one argument per kernel parameter");
#if defined(__CUDACC__)
  kernel<<<blocks, threads, 0, stream>>>(static_cast<Params>(args)...);
#else
  ::bellows_emulation::launch(kernel, blocks, threads, stream, static_cast<Params>(args)...);
#endif
  BELLOWS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace bellows::cuda::detail
