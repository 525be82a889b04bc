// SPDX-License-Identifier: Apache-2.0
// A DeviceCollective over any host Collective: collectives::staged<Inner> copies device memory
// to host buffers, runs Inner's operation on them, and copies the result back, so the device
// compressors and the device Synchronizer run over a transport that reads only host memory:
// the local collective's threads sharing one GPU (the Fashion-MNIST demo's --backend cuda), or an
// MPI that is not CUDA-aware. The sums are Inner's, bit for bit (the local collective's rank
// order), at the price of two copies and a wait per exchange; where a GPU transport exists,
// collectives::nccl moves device memory in place instead.
//
// Host memory passes straight to Inner. The host buffers grow to the largest exchange seen and are
// reused: a steady loop stops allocating after its first step. One staged adapter per rank and
// thread, as the collective it wraps.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "bellows/concepts.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/gather_buffer.hpp"
#include "bellows/cuda/check.cuh"

namespace bellows::collectives {

template <Collective Inner>
class staged {
public:
  /// Exchanges through `inner` (which must outlive this adapter); device copies on `stream`.
  staged(Inner& inner, cudaStream_t stream) : inner_(&inner), stream_(stream) {}

  [[nodiscard]] std::size_t rank() const { return inner_->rank(); }
  [[nodiscard]] std::size_t size() const { return inner_->size(); }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

  /// Inner's sum, in place; device memory is staged through the host (waits for the stream).
  void allreduce_sum(std::span<float> v) {
    if (v.empty() || !cuda::on_device(v.data())) {
      inner_->allreduce_sum(v);
      return;
    }
    floats_.resize(std::max(floats_.size(), v.size()));
    const std::span<float> host(floats_.data(), v.size());
    copy(host.data(), v.data(), v.size_bytes(), cudaMemcpyDeviceToHost);
    inner_->allreduce_sum(host);
    copy(v.data(), host.data(), v.size_bytes(), cudaMemcpyHostToDevice);
  }

  /// Inner's gather into host memory; `mine` may be device memory (staged).
  void allgather(std::span<const std::byte> mine, gather_buffer& out) { inner_->allgather(host_copy(mine), out); }

  /// Rank r's `mine` (device memory, at most `slot` bytes) lands at `slots` + r * slot (device
  /// memory), through Inner's gather in host memory; waits for the stream.
  void allgather_slots(std::span<const std::byte> mine, std::span<std::byte> slots, std::size_t slot) {
    BELLOWS_EXPECTS(mine.size() <= slot && slots.size() >= size() * slot, "staged::allgather_slots: ", mine.size(),
                    " bytes for slots of ", slot, " in ", slots.size(), " bytes for ", size(), " ranks");
    inner_->allgather(host_copy(mine), gathered_);
    for (std::size_t r = 0; r < gathered_.blocks(); ++r) {
      const std::span<const std::byte> block = gathered_.block(r);
      BELLOWS_EXPECTS(block.size() <= slot, "staged::allgather_slots: rank ", r, " sent ", block.size(),
                      " bytes for slots of ", slot);
      if (!block.empty()) copy(slots.data() + r * slot, block.data(), block.size(), cudaMemcpyHostToDevice);
    }
  }

  /// Inner's alltoall into host memory (where Inner has one); `blocks` may be device memory (staged).
  void alltoall(std::span<const std::byte> blocks, std::span<const std::size_t> sizes,
                gather_buffer& out) requires AlltoallCollective<Inner> {
    inner_->alltoall(host_copy(blocks), sizes, out);
  }

private:
  /// `bytes` readable on the host: itself, or a copy of device memory.
  std::span<const std::byte> host_copy(std::span<const std::byte> bytes) {
    if (bytes.empty() || !cuda::on_device(bytes.data())) return bytes;
    bytes_.resize(std::max(bytes_.size(), bytes.size()));
    copy(bytes_.data(), bytes.data(), bytes.size(), cudaMemcpyDeviceToHost);
    return {bytes_.data(), bytes.size()};
  }

  /// A copy on the stream, complete on return (after the work enqueued before it).
  void copy(void* to, const void* from, std::size_t n, cudaMemcpyKind kind) const {
    BELLOWS_CUDA_CHECK(cudaMemcpyAsync(to, from, n, kind, stream_));
    BELLOWS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  Inner* inner_;
  cudaStream_t stream_;
  std::vector<float> floats_;
  std::vector<std::byte> bytes_;
  gather_buffer gathered_;
};

static_assert(DeviceCollective<staged<archetypes::collective>>, "collectives::staged must model DeviceCollective");
static_assert(!AlltoallCollective<staged<archetypes::collective>>,
              "collectives::staged offers alltoall only where its inner collective has it");

}  // namespace bellows::collectives
