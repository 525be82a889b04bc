// SPDX-License-Identifier: Apache-2.0
// A DeviceCollective of one rank on the default stream, for timing the device compressors'
// whole steps without a transport: a rank's payload already sits in slot 0 and its allreduce
// is itself, so there is nothing to move.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <span>

#include "bellows/core/error.hpp"
#include "bellows/core/gather_buffer.hpp"

namespace bellows::bench {

struct one_rank {
  [[nodiscard]] std::size_t rank() const noexcept { return 0; }
  [[nodiscard]] std::size_t size() const noexcept { return 1; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return nullptr; }
  void allreduce_sum(std::span<float>) noexcept {}
  void allgather(std::span<const std::byte>, gather_buffer&) {
    fail<error>("one_rank: the device steps gather slots only");
  }
  void allgather_slots(std::span<const std::byte>, std::span<std::byte>, std::size_t) noexcept {}
};

}  // namespace bellows::bench
