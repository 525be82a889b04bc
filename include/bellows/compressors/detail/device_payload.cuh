// SPDX-License-Identifier: Apache-2.0
// What the device compressors' PayloadCodec members (compressors/{topk,randk,qsgd,signsgd}.cuh)
// share: the checks of the caller's device spans, and the validation of one payload in device
// memory by the codec's own kernel (the one its steps run over every rank's slot), with the
// CPU's validation run on a host copy wherever the device refuses the payload or cannot judge it,
// so that the caller gets the CPU's status, or the CPU's wire_error with its message.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

#include "bellows/core/error.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/payload_slots.cuh"

namespace bellows::detail {

/// Raises bellows::error, naming `who` and the layer, when the device storage `out` of an
/// encode cannot hold a payload of `bytes` (too short, or not starting at a multiple of 8 bytes).
inline void check_payload_storage(std::string_view who, const layer_info& layer, std::span<const std::byte> out,
                                  std::size_t bytes) {
  BELLOWS_EXPECTS(out.size() >= bytes, who, ": layer '", layer.name, "': storage of ", out.size(),
                  " bytes for a payload of up to ", bytes, " (max_payload_bytes)");
  BELLOWS_EXPECTS(reinterpret_cast<std::uintptr_t>(out.data()) % wire::body_alignment == 0, who, ": layer '",
                  layer.name, "': payload storage must start at a multiple of ", wire::body_alignment, " bytes");
}

/// The status of one payload in device memory, as the CPU's validation gives it.
///  - `full`: the bytes of a payload with entries; `flagged`: those of one flagged non-finite.
///  - `launch(words)` enqueues the codec's validation kernel over the payload as the one slot
///    of one rank, OR-ing into words.verdicts[0] and [1] (zeroed here); it runs only when the
///    payload has `full` bytes and starts at a multiple of 8, so its reads stay inside it.
///  - `host(bytes)` is the CPU's validation of host bytes: returns its status or raises
///    bellows::wire_error.
/// The device's verdict is copied back: one wait for the executor's stream. A payload the kernel
/// finds malformed, or one of another size or alignment (a flagged top-k payload is its header
/// alone), is copied back and judged by `host` (a second wait, on that path only): it raises the
/// CPU's wire_error, or returns the CPU's status. Should the host and the device disagree, raises
/// bellows::error, since that is a bug of bellows.
template <class Launch, class Host>
[[nodiscard]] step_status validate_device_payload(std::string_view who, const layer_info& layer, cuda::executor& exec,
                                                  std::span<const std::byte> payload, std::size_t full,
                                                  std::size_t flagged, Launch&& launch, Host&& host) {
  const bool fits =
      payload.size() == full && reinterpret_cast<std::uintptr_t>(payload.data()) % wire::body_alignment == 0;
  unsigned verdict = 0;
  if (fits) {
    const cuda::payload_words words(exec.workspace());
    BELLOWS_CUDA_CHECK(cudaMemsetAsync(words.verdicts, 0, 2 * sizeof(unsigned), exec.stream()));
    launch(words);
    BELLOWS_CUDA_CHECK(
        cudaMemcpyAsync(&verdict, words.verdicts, sizeof(unsigned), cudaMemcpyDeviceToHost, exec.stream()));
    exec.synchronize();
    if (verdict == 0) return step_status::ok;
    if (verdict == cuda::payload_non_finite && full == flagged) return step_status::non_finite;
  }
  const step_status s = cuda::with_host_copy(exec, payload, std::forward<Host>(host));
  // the host accepted what the device refused, or a payload the device could not judge with
  // entries: a payload with entries has `full` bytes
  if (fits || s == step_status::ok)
    fail<error>(who, ": layer '", layer.name, "': the device and the host disagree on a payload of ", payload.size(),
                " bytes (a bug in bellows)");
  return s;
}

}  // namespace bellows::detail
