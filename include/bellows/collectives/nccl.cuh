// SPDX-License-Identifier: Apache-2.0
// The NCCL collective: an adapter over a communicator and a stream the caller owns (target
// bellows::nccl). bellows never creates, aborts or destroys the communicator.
//
// Device memory is exchanged in place on the stream, without synchronisation. Host memory (what
// the CPU compressors hand a Collective) is staged through device buffers of this adapter, and
// those calls wait for the stream, since the host needs the result. The staging buffers grow to
// the largest call seen and are then reused: a steady loop stops allocating after its first step.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "bellows/concepts.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/gather_buffer.hpp"
#include "bellows/cuda/buffer.cuh"
#include "bellows/cuda/check.cuh"

// In bellows::detail, not a detail namespace of collectives, which would hide bellows::detail
// from collectives/local.hpp and mpi.hpp included after this file.
namespace bellows::detail {

/// Raises collective_error for a failed NCCL call; `what` is the call's source text.
inline void nccl_check(ncclResult_t status, const char* what, const char* file, int line) {
  if (status != ncclSuccess)
    fail<collective_error>(file, ":", line, ": ", what, " failed: ", ncclGetErrorString(status));
}

}  // namespace bellows::detail

#define BELLOWS_NCCL_CHECK(call) ::bellows::detail::nccl_check((call), #call, __FILE__, __LINE__)

namespace bellows::collectives {

/// A Collective over NCCL. Ranks are the communicator's. Every rank must call the same
/// operations in the same order with the same lengths, as NCCL requires; NCCL does not turn one
/// rank's failure into an error on the others (the caller may ncclCommAbort), so the Collective
/// concept's requirement 4 holds only as far as NCCL reports errors.
class nccl {
public:
  nccl(ncclComm_t comm, cudaStream_t stream) : comm_(comm), stream_(stream) {
    int r = 0, s = 0;
    BELLOWS_NCCL_CHECK(ncclCommUserRank(comm_, &r));
    BELLOWS_NCCL_CHECK(ncclCommCount(comm_, &s));
    rank_ = static_cast<std::size_t>(r);
    size_ = static_cast<std::size_t>(s);
    sizes_.resize(size_);
  }
  nccl(const nccl&) = delete;
  nccl& operator=(const nccl&) = delete;

  [[nodiscard]] std::size_t rank() const noexcept { return rank_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] ncclComm_t comm() const noexcept { return comm_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

  /// The sum over ranks in place (ncclAllReduce; NCCL's order of additions, the same bits on
  /// every rank). Device memory: enqueued, not waited for. Host memory: staged, and waited for.
  void allreduce_sum(std::span<float> v) {
    if (v.empty()) return;
    if (cuda::on_device(v.data())) {
      BELLOWS_NCCL_CHECK(ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat, ncclSum, comm_, stream_));
      return;
    }
    auto* d = reinterpret_cast<float*>(staging_.fit(v.size_bytes(), stream_));
    BELLOWS_CUDA_CHECK(cudaMemcpyAsync(d, v.data(), v.size_bytes(), cudaMemcpyHostToDevice, stream_));
    BELLOWS_NCCL_CHECK(ncclAllReduce(d, d, v.size(), ncclFloat, ncclSum, comm_, stream_));
    BELLOWS_CUDA_CHECK(cudaMemcpyAsync(v.data(), d, v.size_bytes(), cudaMemcpyDeviceToHost, stream_));
    BELLOWS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  /// The Collective concept's gather into host memory: the sizes first (ncclAllGather of one
  /// number per rank), then every rank's block padded to the largest (ncclAllGather), copied out
  /// into `out`. `mine` may be host or device memory. Waits for the stream (twice: the sizes
  /// decide the layout).
  void allgather(std::span<const std::byte> mine, gather_buffer& out) {
    const std::size_t w = size_;
    auto* counts = reinterpret_cast<std::uint64_t*>(counts_.fit(w * sizeof(std::uint64_t), stream_));
    const std::uint64_t len = mine.size();
    BELLOWS_CUDA_CHECK(cudaMemcpyAsync(counts + rank_, &len, sizeof(len), cudaMemcpyHostToDevice, stream_));
    BELLOWS_NCCL_CHECK(ncclAllGather(counts + rank_, counts, 1, ncclUint64, comm_, stream_));
    std::vector<std::uint64_t>& got = counts_host_;
    got.resize(w);
    BELLOWS_CUDA_CHECK(cudaMemcpyAsync(got.data(), counts, w * sizeof(std::uint64_t), cudaMemcpyDeviceToHost, stream_));
    BELLOWS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::uint64_t slot = 0;
    for (std::size_t r = 0; r < w; ++r) {
      sizes_[r] = static_cast<std::size_t>(got[r]);
      slot = std::max(slot, got[r]);
    }
    out.resize(sizes_);
    if (slot == 0) return;
    std::byte* all = gathered_.fit(w * slot, stream_);
    std::byte* send = all + rank_ * slot;
    BELLOWS_CUDA_CHECK(cudaMemcpyAsync(send, mine.data(), mine.size(), cudaMemcpyDefault, stream_));
    BELLOWS_NCCL_CHECK(ncclAllGather(send, all, slot, ncclUint8, comm_, stream_));
    for (std::size_t r = 0; r < w; ++r)
      if (sizes_[r] != 0)
        BELLOWS_CUDA_CHECK(
            cudaMemcpyAsync(out.block(r).data(), all + r * slot, sizes_[r], cudaMemcpyDeviceToHost, stream_));
    BELLOWS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  /// The gather for device payloads whose largest size every rank knows beforehand (a codec's
  /// max_payload_bytes): rank r's `mine` (at most `slot` bytes, device memory) lands at
  /// `slots` + r * slot (device memory, size() * slot bytes), the rest of its slot unspecified.
  /// One ncclAllGather, enqueued and not waited for; the payloads' own headers carry their sizes.
  void allgather_slots(std::span<const std::byte> mine, std::span<std::byte> slots, std::size_t slot) {
    BELLOWS_EXPECTS(mine.size() <= slot && slots.size() >= size_ * slot, "nccl::allgather_slots: ", mine.size(),
                    " bytes for slots of ", slot, " in ", slots.size(), " bytes for ", size_, " ranks");
    if (slot == 0) return;
    std::byte* send = slots.data() + rank_ * slot;
    if (mine.data() != send && !mine.empty())
      BELLOWS_CUDA_CHECK(cudaMemcpyAsync(send, mine.data(), mine.size(), cudaMemcpyDeviceToDevice, stream_));
    BELLOWS_NCCL_CHECK(ncclAllGather(send, slots.data(), slot, ncclUint8, comm_, stream_));
  }

  /// The AlltoallCollective's exchange into host memory (concepts.hpp): the sizes first, one
  /// number to each rank, then the blocks, each pair's by ncclSend / ncclRecv grouped into one
  /// call (this rank's own block is copied on the stream), copied out into `out`. `blocks` may be
  /// host or device memory. Waits for the stream twice (the sizes decide the layout).
  void alltoall(std::span<const std::byte> blocks, std::span<const std::size_t> sizes, gather_buffer& out) {
    const std::size_t w = size_;
    check_alltoall_blocks("nccl alltoall", blocks, sizes, w);
    // counts: what this rank sends each rank, then what each rank sends this one
    auto* counts = reinterpret_cast<std::uint64_t*>(counts_.fit(2 * w * sizeof(std::uint64_t), stream_));
    std::vector<std::uint64_t>& host = counts_host_;
    host.resize(2 * w);
    for (std::size_t r = 0; r < w; ++r) host[r] = sizes[r];
    BELLOWS_CUDA_CHECK(
        cudaMemcpyAsync(counts, host.data(), w * sizeof(std::uint64_t), cudaMemcpyHostToDevice, stream_));
    pairwise([&](std::size_t r) {
      return std::pair{ncclSend(counts + r, 1, ncclUint64, static_cast<int>(r), comm_, stream_),
                       ncclRecv(counts + w + r, 1, ncclUint64, static_cast<int>(r), comm_, stream_)};
    });
    BELLOWS_CUDA_CHECK(
        cudaMemcpyAsync(host.data() + w, counts + w, w * sizeof(std::uint64_t), cudaMemcpyDeviceToHost, stream_));
    BELLOWS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    host[w + rank_] = sizes[rank_];
    // where the block to, and the block from, each rank starts
    send_at_.assign(w + 1, 0);
    recv_at_.assign(w + 1, 0);
    for (std::size_t r = 0; r < w; ++r) {
      sizes_[r] = static_cast<std::size_t>(host[w + r]);
      send_at_[r + 1] = send_at_[r] + sizes[r];
      recv_at_[r + 1] = recv_at_[r] + sizes_[r];
    }
    out.resize(sizes_);
    const std::byte* send = blocks.data();
    if (!blocks.empty() && !cuda::on_device(send)) {
      std::byte* d = staging_.fit(blocks.size(), stream_);
      BELLOWS_CUDA_CHECK(cudaMemcpyAsync(d, send, blocks.size(), cudaMemcpyHostToDevice, stream_));
      send = d;
    }
    std::byte* recv = gathered_.fit(recv_at_[w], stream_);
    pairwise([&](std::size_t r) {
      const ncclResult_t sent =
          sizes[r] == 0 ? ncclSuccess
                        : ncclSend(send + send_at_[r], sizes[r], ncclUint8, static_cast<int>(r), comm_, stream_);
      const ncclResult_t got =
          sizes_[r] == 0 ? ncclSuccess
                         : ncclRecv(recv + recv_at_[r], sizes_[r], ncclUint8, static_cast<int>(r), comm_, stream_);
      return std::pair{sent, got};
    });
    if (sizes[rank_] != 0)
      BELLOWS_CUDA_CHECK(cudaMemcpyAsync(recv + recv_at_[rank_], send + send_at_[rank_], sizes[rank_],
                                         cudaMemcpyDeviceToDevice, stream_));
    for (std::size_t r = 0; r < w; ++r)
      if (sizes_[r] != 0)
        BELLOWS_CUDA_CHECK(
            cudaMemcpyAsync(out.block(r).data(), recv + recv_at_[r], sizes_[r], cudaMemcpyDeviceToHost, stream_));
    BELLOWS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

private:
  /// One NCCL group holding `calls(r)`'s send and receive for every other rank r; the group is
  /// closed even when a call in it fails, and the first failure raised after.
  template <class Calls>
  void pairwise(Calls calls) {
    BELLOWS_NCCL_CHECK(ncclGroupStart());
    ncclResult_t first = ncclSuccess;
    for (std::size_t r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const auto [sent, got] = calls(r);
      if (first == ncclSuccess) first = sent != ncclSuccess ? sent : got;
    }
    BELLOWS_NCCL_CHECK(ncclGroupEnd());
    BELLOWS_NCCL_CHECK(first);
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  std::size_t rank_ = 0, size_ = 0;
  std::vector<std::size_t> sizes_;
  std::vector<std::size_t> send_at_, recv_at_;  // alltoall's block offsets
  std::vector<std::uint64_t> counts_host_;
  cuda::device_buffer<std::byte> staging_, counts_, gathered_;
};

static_assert(AlltoallCollective<nccl>, "collectives::nccl must model AlltoallCollective");

}  // namespace bellows::collectives
