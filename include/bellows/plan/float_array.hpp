// SPDX-License-Identifier: Apache-2.0
// Which float array a backend keeps its per-layer data in, for the code written once over
// executors (the Synchronizer's finiteness vote and gradient norms, Accordion's gradient sums):
// float_array_for<cpu::executor> is cpu::float_array (cpu/float_array.hpp), host memory;
// float_array_for<cuda::executor> is cuda::float_array (cuda/float_array.cuh), device memory.
// Both have the same members: a zeroed array of n elements made with the executor, span() over
// it (in the backend's memory), size(), host(exec, staging) to read it and assign(exec, values)
// to write it from the host.
#pragma once

namespace bellows {

/// Specialised beside each backend's float_array.
template <class Exec>
struct float_array_of;

template <class Exec>
using float_array_for = typename float_array_of<Exec>::type;

}  // namespace bellows
