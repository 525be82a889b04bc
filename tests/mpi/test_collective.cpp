// SPDX-License-Identifier: Apache-2.0
// Runs under mpirun (-np 2 and -np 4 in ctest). Each compressor through the MPI adapter must give
// what the local collective gives for the same per-rank inputs, which every process computes for
// itself by simulating all ranks as threads.
#define DOCTEST_CONFIG_IMPLEMENT
#include <bellows/collectives/local.hpp>
#include <bellows/collectives/mpi.hpp>
#include <bellows/compressors/identity.hpp>

#include <doctest/doctest.h>
#include <mpi.h>

#include <cmath>
#include <vector>

#include "../support/random.hpp"

namespace {

std::vector<float> input(std::size_t n, std::size_t rank, int step) {
  return bellows::testing::normal_floats(n, 31 * static_cast<std::uint64_t>(step) + rank);
}

/// All ranks' outputs of `steps` reduce calls through the local collective, as rank `me` sees them.
template <class C>
std::vector<std::vector<float>> local_reference(std::size_t w, std::size_t me, const bellows::shape& shp,
                                                int steps) {
  std::vector<std::vector<float>> out(static_cast<std::size_t>(steps));
  bellows::collectives::local_group group(w);
  group.run([&](bellows::collectives::local& comm) {
    C c;
    auto st = c.make_state({1, "layer", shp});
    for (int s = 0; s < steps; ++s) {
      auto x = input(shp.size(), comm.rank(), s);
      (void)c.reduce(st, x, comm);
      if (comm.rank() == me) out[static_cast<std::size_t>(s)] = x;
    }
  });
  return out;
}

/// max |a - b| relative to the largest |b|: the sums' order differs between MPI and local.
double relative_gap(const std::vector<float>& a, const std::vector<float>& b) {
  double gap = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    gap = std::max(gap, std::abs(double{a[i]} - b[i]));
    scale = std::max(scale, std::abs(double{b[i]}));
  }
  return scale > 0 ? gap / scale : gap;
}

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

TEST_CASE("mpi adapter: identity equals the local collective's result") {
  bellows::collectives::mpi comm(MPI_COMM_WORLD);
  const bellows::shape shp{30, 40};
  const auto expected = local_reference<bellows::identity<>>(comm.size(), comm.rank(), shp, 3);
  bellows::identity<> c;
  auto st = c.make_state({1, "layer", shp});
  for (int s = 0; s < 3; ++s) {
    auto x = input(shp.size(), comm.rank(), s);
    CHECK(c.reduce(st, x, comm).status == bellows::step_status::ok);
    // float sums of W normal values in another order: a few ulps of the largest value
    CHECK(relative_gap(x, expected[static_cast<std::size_t>(s)]) < 1e-6);
  }
}

TEST_CASE("mpi adapter: a NaN on one rank gives non_finite on every rank") {
  bellows::collectives::mpi comm(MPI_COMM_WORLD);
  bellows::identity<> c;
  auto st = c.make_state({0, "layer", bellows::shape{64}});
  auto x = input(64, comm.rank(), 0);
  const auto before = x;
  if (comm.rank() == comm.size() - 1) x[10] = std::nanf("");
  const auto r = c.reduce(st, x, comm);
  CHECK(r.status == bellows::step_status::non_finite);
  if (comm.rank() != comm.size() - 1) CHECK(x == before);
  CHECK(st.step == 0);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context context(argc, argv);
  if (rank != 0) context.setOption("out", "/dev/null");  // one report, from rank 0
  int failed = context.run();
  // Every rank's verdict counts.
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed;
}
