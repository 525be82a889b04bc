// SPDX-License-Identifier: Apache-2.0
// The MPI collective: an adapter over a communicator the caller owns (target bellows::mpi).
// bellows never calls MPI_Init or MPI_Finalize.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "bellows/concepts.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/gather_buffer.hpp"

namespace bellows::collectives {

/// The order in which the MPI adapter's allreduce_sum adds the ranks' values.
enum class mpi_sum_order : unsigned char {
  /// MPI_Allreduce: the MPI library picks the algorithm and with it the order of the additions
  /// (Open MPI gives every rank the same bits, which may differ in the last bits from a sum in
  /// rank order when there are more than two ranks).
  library,
  /// rank 0 + rank 1 + ... + rank W-1 for every element, the order of collectives::local, so a
  /// run gives the same bits under mpirun as on threads: each rank receives one slice of every
  /// rank's vector (MPI_Alltoallv), sums it in rank order and the sums are gathered back
  /// (MPI_Allgatherv). It moves as many bytes as a ring allreduce, but through MPI's generic
  /// exchanges rather than its tuned reduction.
  rank,
};

/// A Collective over MPI. It works on a duplicate of the given communicator, with MPI_ERRORS_RETURN
/// set on the duplicate only, so a failed call raises bellows::collective_error carrying MPI's
/// error string while the caller's communicator and its error handler stay as they were.
/// Construction and destruction are collective over the communicator (MPI_Comm_dup/free).
class mpi {
public:
  explicit mpi(MPI_Comm comm, mpi_sum_order order = mpi_sum_order::library) : order_(order) {
    check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    int r = 0, s = 0;
    check(MPI_Comm_rank(comm_, &r), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &s), "MPI_Comm_size");
    rank_ = static_cast<std::size_t>(r);
    size_ = static_cast<std::size_t>(s);
    counts_.resize(size_);
    displs_.resize(size_);
    sizes_.resize(size_);
    slice_counts_.resize(size_);
    slice_displs_.resize(size_);
    receive_counts_.resize(size_);
    receive_displs_.resize(size_);
    send_counts_.resize(size_);
    send_displs_.resize(size_);
  }
  mpi(const mpi&) = delete;
  mpi& operator=(const mpi&) = delete;
  ~mpi() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  [[nodiscard]] std::size_t rank() const noexcept { return rank_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// The duplicated communicator this adapter talks on.
  [[nodiscard]] MPI_Comm comm() const noexcept { return comm_; }
  [[nodiscard]] mpi_sum_order sum_order() const noexcept { return order_; }

  /// The sum over ranks in place, in the order chosen at construction (see mpi_sum_order).
  void allreduce_sum(std::span<float> v) {
    const int n = count_of(v.size(), "allreduce_sum");
    if (order_ == mpi_sum_order::library) {
      check(MPI_Allreduce(MPI_IN_PLACE, v.data(), n, MPI_FLOAT, MPI_SUM, comm_), "MPI_Allreduce");
      return;
    }
    // Rank r owns elements [n r / W, n (r + 1) / W), the slices of collectives::local.
    const std::size_t w = size_;
    for (std::size_t r = 0; r < w; ++r) {
      const std::size_t lo = v.size() * r / w, hi = v.size() * (r + 1) / w;
      slice_displs_[r] = static_cast<int>(lo);
      slice_counts_[r] = static_cast<int>(hi - lo);
    }
    const int mine = slice_counts_[rank_];
    for (std::size_t r = 0; r < w; ++r) {
      receive_counts_[r] = mine;
      receive_displs_[r] = static_cast<int>(r) * mine;
    }
    received_.resize(w * static_cast<std::size_t>(mine));  // grows once, then is reused
    check(MPI_Alltoallv(v.data(), slice_counts_.data(), slice_displs_.data(), MPI_FLOAT, received_.data(),
                        receive_counts_.data(), receive_displs_.data(), MPI_FLOAT, comm_),
          "MPI_Alltoallv");
    float* sum = v.data() + slice_displs_[rank_];
    const std::size_t m = static_cast<std::size_t>(mine);
    std::copy(received_.begin(), received_.begin() + static_cast<std::ptrdiff_t>(m), sum);
    for (std::size_t r = 1; r < w; ++r) {
      const float* x = received_.data() + r * m;
      for (std::size_t i = 0; i < m; ++i) sum[i] += x[i];
    }
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, v.data(), slice_counts_.data(), slice_displs_.data(),
                         MPI_FLOAT, comm_),
          "MPI_Allgatherv");
  }

  /// Sizes by MPI_Allgather, then the bytes by MPI_Allgatherv into 8-byte aligned blocks.
  void allgather(std::span<const std::byte> mine, gather_buffer& out) {
    const int len = count_of(mine.size(), "allgather");
    check(MPI_Allgather(&len, 1, MPI_INT, counts_.data(), 1, MPI_INT, comm_), "MPI_Allgather");
    std::byte* base = receive_blocks(out, "allgather offset");
    check(MPI_Allgatherv(mine.data(), len, MPI_BYTE, base, counts_.data(), displs_.data(), MPI_BYTE, comm_),
          "MPI_Allgatherv");
  }

  /// Blocks of one size on every rank (a bucket's payloads, Collective 5): one MPI_Allgather
  /// straight into `slots`, rank r's `mine` at byte r * slot; a `mine` shorter than its slot is
  /// sent padded with zeros.
  void allgather_slots(std::span<const std::byte> mine, std::span<std::byte> slots, std::size_t slot) {
    BELLOWS_EXPECTS(mine.size() <= slot && slots.size() >= size_ * slot, "mpi allgather_slots: ", mine.size(),
                    " bytes into ", slots.size(), " bytes of ", size_, " slots of ", slot);
    const int len = count_of(slot, "allgather_slots");
    const std::span<std::byte> own = slots.subspan(rank_ * slot, slot);
    if (mine.size() == slot && mine.data() != own.data()) {
      check(MPI_Allgather(mine.data(), len, MPI_BYTE, slots.data(), len, MPI_BYTE, comm_), "MPI_Allgather");
      return;
    }
    if (!mine.empty()) std::memmove(own.data(), mine.data(), mine.size());  // `mine` may lie in its slot already
    std::ranges::fill(own.subspan(mine.size()), std::byte{0});
    check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, slots.data(), len, MPI_BYTE, comm_), "MPI_Allgather");
  }

  /// W blocks of `slot` bytes, block j for rank j (AlltoallCollective 3): one MPI_Alltoall
  /// straight into `slots`, what rank i sent at byte i * slot.
  void alltoall_slots(std::span<const std::byte> blocks, std::span<std::byte> slots, std::size_t slot) {
    BELLOWS_EXPECTS(blocks.size() == size_ * slot && slots.size() >= size_ * slot,
                    "mpi alltoall_slots: ", blocks.size(), " bytes into ", slots.size(), " bytes of ", size_,
                    " slots of ", slot);
    const int len = count_of(slot, "alltoall_slots");
    check(MPI_Alltoall(blocks.data(), len, MPI_BYTE, slots.data(), len, MPI_BYTE, comm_), "MPI_Alltoall");
  }

  /// Sizes by MPI_Alltoall, then the bytes by MPI_Alltoallv into 8-byte aligned blocks
  /// (concepts.hpp, AlltoallCollective).
  void alltoall(std::span<const std::byte> blocks, std::span<const std::size_t> sizes, gather_buffer& out) {
    check_alltoall_blocks("mpi alltoall", blocks, sizes, size_);
    std::size_t at = 0;
    for (std::size_t r = 0; r < size_; ++r) {
      send_counts_[r] = count_of(sizes[r], "alltoall");
      send_displs_[r] = count_of(at, "alltoall offset");
      at += sizes[r];
    }
    check(MPI_Alltoall(send_counts_.data(), 1, MPI_INT, counts_.data(), 1, MPI_INT, comm_), "MPI_Alltoall");
    std::byte* base = receive_blocks(out, "alltoall offset");
    check(MPI_Alltoallv(blocks.data(), send_counts_.data(), send_displs_.data(), MPI_BYTE, base, counts_.data(),
                        displs_.data(), MPI_BYTE, comm_),
          "MPI_Alltoallv");
  }

  /// MPI_Bcast of `data` from `root`; every rank passes the same length.
  void broadcast(std::span<std::byte> data, std::size_t root) {
    BELLOWS_EXPECTS(root < size_, "mpi broadcast: root ", root, " is not a rank of ", size_);
    check(MPI_Bcast(data.data(), count_of(data.size(), "broadcast"), MPI_BYTE, static_cast<int>(root), comm_),
          "MPI_Bcast");
  }

private:
  /// `out` sized for the blocks of counts_ (one per rank, as received), and displs_ set to their
  /// offsets from the first; returns the first block's address (null for no ranks).
  std::byte* receive_blocks(gather_buffer& out, const char* op) {
    for (std::size_t r = 0; r < size_; ++r) sizes_[r] = static_cast<std::size_t>(counts_[r]);
    out.resize(sizes_);
    std::byte* base = size_ ? out.block(0).data() : nullptr;
    for (std::size_t r = 0; r < size_; ++r)
      displs_[r] = count_of(static_cast<std::size_t>(out.block(r).data() - base), op);
    return base;
  }

  static int count_of(std::size_t n, const char* op) {
    if (n > static_cast<std::size_t>(INT_MAX))
      fail<collective_error>("mpi ", op, ": ", n, " elements exceed MPI's int count");
    return static_cast<int>(n);
  }

  static void check(int code, const char* call) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
    fail<collective_error>("mpi: ", call, " failed: ", std::string_view(text, static_cast<std::size_t>(len)));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  mpi_sum_order order_;
  std::size_t rank_ = 0, size_ = 1;
  std::vector<int> counts_, displs_;
  std::vector<int> slice_counts_, slice_displs_, receive_counts_, receive_displs_;
  std::vector<int> send_counts_, send_displs_;  // alltoall's
  std::vector<float> received_;
  std::vector<std::size_t> sizes_;
};

static_assert(AlltoallCollective<mpi>, "the MPI adapter must model AlltoallCollective");

}  // namespace bellows::collectives
