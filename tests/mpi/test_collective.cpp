// SPDX-License-Identifier: Apache-2.0
// Runs under mpirun (-np 2, 4 and 5 in ctest): the adapter's operations and its error path.
// test_compressors.cpp compares the compressors through it with the local collective.
#include "mpi_main.hpp"

#include <bellows/collectives/mpi.hpp>
#include <bellows/compressors/identity.hpp>

#include <cmath>
#include <span>
#include <vector>

#include "../support/alltoall_blocks.hpp"
#include "../support/random.hpp"

namespace {

std::vector<float> input(std::size_t n, std::size_t rank) { return bellows::testing::normal_floats(n, rank); }

}  // namespace

TEST_CASE("mpi adapter: rank, size, allreduce, variable allgather and broadcast") {
  bellows::collectives::mpi comm(MPI_COMM_WORLD);
  const std::size_t w = comm.size(), me = comm.rank();
  std::vector<float> v(1000, static_cast<float>(me + 1));
  comm.allreduce_sum(v);
  CHECK(v[999] == static_cast<float>(w * (w + 1) / 2));

  bellows::gather_buffer out;
  std::vector<std::byte> mine(3 * me + 1, std::byte(me));
  comm.allgather(mine, out);
  REQUIRE(out.blocks() == w);
  for (std::size_t r = 0; r < w; ++r) {
    CHECK(out.block(r).size() == 3 * r + 1);
    CHECK(out.block(r)[0] == std::byte(r));
    CHECK(reinterpret_cast<std::uintptr_t>(out.block(r).data()) % 8 == 0);
  }
  std::vector<std::byte> b(5, std::byte(me));
  comm.broadcast(b, w - 1);
  CHECK(b[4] == std::byte(w - 1));
}

TEST_CASE("mpi adapter: alltoall delivers, in rank order, the block each rank sent this one") {
  static_assert(bellows::AlltoallCollective<bellows::collectives::mpi>);
  bellows::collectives::mpi comm(MPI_COMM_WORLD);
  bellows::gather_buffer out;
  for (std::size_t round = 0; round < 3; ++round) {
    const bellows::testing::alltoall_send send(comm.rank(), comm.size(), round);
    comm.alltoall(send.blocks, send.sizes, out);
    CHECK(bellows::testing::alltoall_received(out, comm.rank(), comm.size(), round));
  }
  const std::vector<std::byte> blocks(3);
  const std::vector<std::size_t> short_sizes{1};  // one size for W ranks: refused before MPI is called
  if (comm.size() != 1)
    CHECK_THROWS_WITH_AS(comm.alltoall(blocks, short_sizes, out), doctest::Contains("mpi alltoall:"), bellows::error);
}

TEST_CASE("mpi adapter: the slot calls deliver, a slot apart, what allgather and alltoall deliver") {
  bellows::collectives::mpi comm(MPI_COMM_WORLD);
  const std::size_t w = comm.size(), me = comm.rank();
  const auto byte_of = [](std::size_t from, std::size_t to, std::size_t k) {
    return std::byte(static_cast<unsigned char>(from * 61 + to * 17 + k));
  };
  // allgather_slots: a full slot, a shorter `mine` (padded with zeros), `mine` already in its slot.
  constexpr std::size_t slot = 24;
  for (const std::size_t len : {slot, std::size_t{5}, std::size_t{0}}) {
    CAPTURE(len);
    std::vector<std::byte> mine(len), slots(w * slot, std::byte{0xee});
    for (std::size_t k = 0; k < len; ++k) mine[k] = byte_of(me, 0, k);
    comm.allgather_slots(mine, slots, slot);
    for (std::size_t r = 0; r < w; ++r)
      for (std::size_t k = 0; k < slot; ++k)
        REQUIRE(slots[r * slot + k] == (k < len ? byte_of(r, 0, k) : std::byte{0}));
  }
  std::vector<std::byte> slots(w * slot);
  for (std::size_t k = 0; k < slot; ++k) slots[me * slot + k] = byte_of(me, 1, k);
  comm.allgather_slots(std::span(slots).subspan(me * slot, slot), slots, slot);
  for (std::size_t r = 0; r < w; ++r)
    for (std::size_t k = 0; k < slot; ++k) REQUIRE(slots[r * slot + k] == byte_of(r, 1, k));

  // alltoall_slots: block j of this rank's W blocks to rank j, what rank i sent at i * slot.
  std::vector<std::byte> blocks(w * slot), received(w * slot);
  for (std::size_t to = 0; to < w; ++to)
    for (std::size_t k = 0; k < slot; ++k) blocks[to * slot + k] = byte_of(me, to, k);
  comm.alltoall_slots(blocks, received, slot);
  for (std::size_t from = 0; from < w; ++from)
    for (std::size_t k = 0; k < slot; ++k) REQUIRE(received[from * slot + k] == byte_of(from, me, k));

  // Sizes that do not fit are refused before MPI is called, on the rank that passed them.
  CHECK_THROWS_WITH_AS(comm.allgather_slots(std::vector<std::byte>(slot + 8), slots, slot),
                       doctest::Contains("mpi allgather_slots: 32 bytes"), bellows::error);
  CHECK_THROWS_WITH_AS(comm.alltoall_slots(std::span(blocks).first(slot * w - 8), received, slot),
                       doctest::Contains("mpi alltoall_slots:"), bellows::error);
}

TEST_CASE("mpi adapter: a NaN on one rank gives non_finite on every rank") {
  bellows::collectives::mpi comm(MPI_COMM_WORLD);
  bellows::identity<> c;
  auto st = c.make_state({0, "layer", bellows::shape{64}});
  auto x = input(64, comm.rank());
  const auto before = x;
  if (comm.rank() == comm.size() - 1) x[10] = std::nanf("");
  const auto r = c.reduce(st, x, comm);
  CHECK(r.status == bellows::step_status::non_finite);
  if (comm.rank() != comm.size() - 1) CHECK(x == before);
  CHECK(st.step == 0);
}
