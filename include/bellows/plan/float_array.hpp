// SPDX-License-Identifier: Apache-2.0
// Which float array a backend keeps its per-layer data in, for the code written once over
// executors (the Synchronizer's finiteness vote and gradient norms, Accordion's gradient sums):
// float_array_for<cpu::executor> is cpu::float_array (cpu/float_array.hpp), host memory;
// float_array_for<cuda::executor> is cuda::float_array (cuda/float_array.cuh), device memory.
// Both have the same members: a zeroed array of n elements made with the executor, span() over
// it (in the backend's memory), size(), host(exec, staging) to read it (on the device a wait),
// send(exec, to) to copy it into host_values (below) without a wait, and assign(exec, values) to
// write it from the host.
//
// host_values_for<Exec, T> is where a backend's copy_word delivers words of type T to the host
// without waiting for anything: cpu::host_values<T> (plain memory) and cuda::host_values<T>
// (pinned memory, which a copy from the device fills asynchronously, where one into pageable
// memory would wait for the stream). Both are made value-initialised from the executor and a
// count, and indexed on the host.
#pragma once

namespace bellows {

/// Specialised beside each backend's float_array.
template <class Exec>
struct float_array_of;

template <class Exec>
using float_array_for = typename float_array_of<Exec>::type;

/// Specialised beside each backend's host_values.
template <class Exec, class T>
struct host_values_of;

template <class Exec, class T>
using host_values_for = typename host_values_of<Exec, T>::type;

}  // namespace bellows
