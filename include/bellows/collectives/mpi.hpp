// SPDX-License-Identifier: Apache-2.0
// The MPI collective: an adapter over a communicator the caller owns (target bellows::mpi).
// bellows never calls MPI_Init or MPI_Finalize.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "bellows/concepts.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/gather_buffer.hpp"

namespace bellows::collectives {

/// A Collective over MPI. It works on a duplicate of the given communicator, with MPI_ERRORS_RETURN
/// set on the duplicate only, so a failed call raises bellows::collective_error carrying MPI's
/// error string while the caller's communicator and its error handler stay as they were.
/// Construction and destruction are collective over the communicator (MPI_Comm_dup/free).
class mpi {
public:
  explicit mpi(MPI_Comm comm) {
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

  /// MPI_Allreduce with MPI_SUM in place. Open MPI gives every rank the same bits; the order of
  /// the sum is MPI's, so results may differ in the last bits from the local collective's.
  void allreduce_sum(std::span<float> v) {
    check(MPI_Allreduce(MPI_IN_PLACE, v.data(), count_of(v.size(), "allreduce_sum"), MPI_FLOAT,
                        MPI_SUM, comm_),
          "MPI_Allreduce");
  }

  /// Sizes by MPI_Allgather, then the bytes by MPI_Allgatherv into 8-byte aligned blocks.
  void allgather(std::span<const std::byte> mine, gather_buffer& out) {
    const int len = count_of(mine.size(), "allgather");
    check(MPI_Allgather(&len, 1, MPI_INT, counts_.data(), 1, MPI_INT, comm_), "MPI_Allgather");
    for (std::size_t r = 0; r < size_; ++r) sizes_[r] = static_cast<std::size_t>(counts_[r]);
    out.resize(sizes_);
    std::byte* base = size_ ? out.block(0).data() : nullptr;
    for (std::size_t r = 0; r < size_; ++r)
      displs_[r] = count_of(static_cast<std::size_t>(out.block(r).data() - base), "allgather offset");
    check(MPI_Allgatherv(mine.data(), len, MPI_BYTE, base, counts_.data(), displs_.data(), MPI_BYTE,
                         comm_),
          "MPI_Allgatherv");
  }

  /// MPI_Bcast of `data` from `root`; every rank passes the same length.
  void broadcast(std::span<std::byte> data, std::size_t root) {
    BELLOWS_EXPECTS(root < size_, "mpi broadcast: root ", root, " of ", size_, " ranks");
    check(MPI_Bcast(data.data(), count_of(data.size(), "broadcast"), MPI_BYTE, static_cast<int>(root),
                    comm_),
          "MPI_Bcast");
  }

private:
  static int count_of(std::size_t n, const char* op) {
    if (n > static_cast<std::size_t>(INT_MAX))
      detail::fail<collective_error>("mpi ", op, ": ", n, " elements exceed MPI's int count");
    return static_cast<int>(n);
  }

  static void check(int code, const char* call) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
    detail::fail<collective_error>("mpi: ", call, " failed: ", std::string_view(text, static_cast<std::size_t>(len)));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::size_t rank_ = 0, size_ = 1;
  std::vector<int> counts_, displs_;
  std::vector<std::size_t> sizes_;
};

static_assert(Collective<mpi>, "the MPI adapter must model Collective");

}  // namespace bellows::collectives
