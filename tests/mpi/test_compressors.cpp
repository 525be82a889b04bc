// SPDX-License-Identifier: Apache-2.0
// Runs under mpirun (-np 2, 4 and 5 in ctest). Every compressor through the MPI adapter against
// the local collective on the same per-rank inputs, which every process computes for itself by
// simulating all ranks as threads; and a Synchronizer with Accordion over MPI against the same
// run on threads.
//
// Every example configuration of every compressor of compressors/list.hpp is checked. With
// mpi_sum_order::rank the adapter adds the ranks in the local collective's order, so every result
// must be the same bits. With mpi_sum_order::library (MPI_Allreduce) only the exchanges by
// allgather are bitwise equal (the payloads are decoded in rank order on each rank); a
// configuration that calls allreduce (seen through the counting collective on threads) may
// differ in the last bits, so it is held to a
// relative gap of 1e-5 of the largest value (float rounding of sums of 4 terms, carried through a
// few steps of error memory and PowerSGD's orthogonalisation). The scatter
// exchange (an alltoall, MPI_Alltoall and MPI_Alltoallv, then an allgather) is bitwise equal too.
#include "mpi_main.hpp"

#include <bellows/collectives/counting.hpp>
#include <bellows/collectives/local.hpp>
#include <bellows/collectives/mpi.hpp>
#include <bellows/compressors/list.hpp>
#include <bellows/regime/accordion.hpp>
#include <bellows/sync/synchronizer.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../support/random.hpp"

namespace {

using bellows::collectives::mpi_sum_order;

constexpr int steps = 3;
const bellows::shape layer_shape{40, 50};

std::vector<float> input(std::size_t n, std::size_t rank, int step) {
  return bellows::testing::normal_floats(n, 31 * static_cast<std::uint64_t>(step) + rank);
}

/// Rank `me`'s outputs of `steps` reduce calls of make() through the local collective of w
/// threads; `allreduces` is set when any call was an allreduce.
template <class Make>
std::vector<std::vector<float>> local_reference(std::size_t w, std::size_t me, Make make, bool& allreduces) {
  std::vector<std::vector<float>> out(steps);
  bellows::collectives::local_group group(w);
  std::atomic<bool> summed{false};
  group.run([&](bellows::collectives::local& inner) {
    bellows::collectives::counting comm(inner);
    auto c = make();
    auto st = c.make_state({1, "layer", layer_shape});
    for (int s = 0; s < steps; ++s) {
      auto x = input(layer_shape.size(), comm.rank(), s);
      REQUIRE(c.reduce(st, x, comm).status == bellows::step_status::ok);
      if (comm.rank() == me) out[static_cast<std::size_t>(s)] = x;
    }
    if (comm.allreduce().calls > 0) summed = true;
  });
  allreduces = summed;
  return out;
}

/// max |a - b| relative to the largest |b|.
double relative_gap(const std::vector<float>& a, const std::vector<float>& b) {
  double gap = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    gap = std::max(gap, std::abs(double{a[i]} - b[i]));
    scale = std::max(scale, std::abs(double{b[i]}));
  }
  return scale > 0 ? gap / scale : gap;
}

/// make()'s results over MPI in both sum orders against the local collective's. A compressor
/// that exchanges only by allgather gives the same bits even in the library's order.
template <class Make>
void check_against_local(Make make) {
  for (const mpi_sum_order order : {mpi_sum_order::rank, mpi_sum_order::library}) {
    bellows::collectives::mpi comm(MPI_COMM_WORLD, order);
    bool allreduces = false;
    const auto expected = local_reference(comm.size(), comm.rank(), make, allreduces);
    const bool by_allgather = !allreduces;
    auto c = make();
    auto st = c.make_state({1, "layer", layer_shape});
    for (int s = 0; s < steps; ++s) {
      CAPTURE(s);
      CAPTURE(static_cast<int>(order));
      auto x = input(layer_shape.size(), comm.rank(), s);
      REQUIRE(c.reduce(st, x, comm).status == bellows::step_status::ok);
      const std::vector<float>& want = expected[static_cast<std::size_t>(s)];
      if (order == mpi_sum_order::rank || by_allgather)
        CHECK(x == want);
      else
        CHECK(relative_gap(x, want) < 1e-5);
    }
  }
}

}  // namespace

TEST_CASE("mpi adapter: rank-order sums are those of the local collective, bit for bit") {
  bellows::collectives::mpi comm(MPI_COMM_WORLD, mpi_sum_order::rank);
  CHECK(comm.sum_order() == mpi_sum_order::rank);
  const std::size_t w = comm.size();
  // Lengths below, at and above the rank count: slices of 0 elements on some ranks.
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, w - 1, w, 3 * w + 1, std::size_t{1000}}) {
    CAPTURE(n);
    std::vector<float> expected(n);
    for (std::size_t i = 0; i < n; ++i) {
      float sum = input(n, 0, 7)[i];
      for (std::size_t r = 1; r < w; ++r) sum += input(n, r, 7)[i];
      expected[i] = sum;
    }
    auto v = input(n, comm.rank(), 7);
    comm.allreduce_sum(v);
    CHECK(v == expected);
  }
}

TEST_CASE("mpi adapter: every compressor equals the local collective's result") {
  bellows::for_each_method(bellows::compressor_methods{}, [](auto m) {
    using M = typename decltype(m)::type;
    for (const auto& params : M::examples) {
      CAPTURE(M::name);
      CAPTURE(&params - M::examples);
      check_against_local([&] { return M::make(params, bellows::cpu::executor::shared()); });
    }
  });
}

TEST_CASE("mpi adapter: the scatter exchange of every codec that offers it equals the local collective's result") {
  constexpr bellows::exchange scatter = bellows::exchange::scatter;
  check_against_local([] {
    return bellows::qsgd<>({.bits = 4, .bucket = 64, .exchange = scatter, .owner_memory = true},
                           bellows::cpu::executor::shared());
  });
  check_against_local(
      [] { return bellows::signsgd<>({.bucket = 0, .exchange = scatter}, bellows::cpu::executor::shared()); });
  check_against_local(
      [] { return bellows::topk<>({.ratio = 0.05, .exchange = scatter}, bellows::cpu::executor::shared()); });
  check_against_local([] {
    return bellows::randk<>({.ratio = 0.1, .mode = bellows::randk_mode::per_rank, .exchange = scatter},
                            bellows::cpu::executor::shared());
  });
}

namespace {

constexpr std::size_t sync_layers = 3, sync_epochs = 6, steps_per_epoch = 2;

/// The gradient of a layer at a step: normal values scaled per layer and epoch, so that the
/// norms jump for some layers at some checks and stay for others.
std::vector<float> sync_grad(std::size_t layer, std::size_t rank, std::size_t epoch, std::size_t step) {
  static constexpr float scale[sync_layers][sync_epochs] = {{1, 1, 0.2f, 0.2f, 0.2f, 1},
                                                            {1, 1, 1, 1, 1, 1},
                                                            {4, 1, 1, 0.5f, 0.5f, 0.5f}};
  auto g = input(layer_shape.size(), rank, static_cast<int>(100 * layer + 10 * epoch + step));
  for (float& v : g) v *= scale[layer][epoch];
  return g;
}

/// Trains the script above through a synchronizer (top-k ratio 0.5 / 0.1 switched by Accordion,
/// a check every epoch) and returns the levels after every epoch, one byte per layer.
template <class Coll>
std::vector<std::uint8_t> sync_decisions(Coll& comm, std::vector<float>* last_grad = nullptr) {
  bellows::synchronizer sync(bellows::topk<>({.ratio = 0.5}), bellows::topk<>({.ratio = 0.1}),
                             bellows::accordion({.eta = 0.5f, .interval = 1}));
  for (std::size_t l = 0; l < sync_layers; ++l) sync.add_layer("layer" + std::to_string(l), layer_shape);
  std::vector<std::uint8_t> decisions;
  std::vector<std::vector<float>> grads(sync_layers);
  std::vector<std::span<float>> spans(sync_layers);
  for (std::size_t e = 0; e < sync_epochs; ++e) {
    for (std::size_t s = 0; s < steps_per_epoch; ++s) {
      for (std::size_t l = 0; l < sync_layers; ++l) {
        grads[l] = sync_grad(l, comm.rank(), e, s);
        spans[l] = grads[l];
      }
      for (const bellows::step_status st : sync.step(spans, comm)) REQUIRE(st == bellows::step_status::ok);
    }
    for (const bellows::regime r : sync.end_epoch(0.1f, comm)) decisions.push_back(static_cast<std::uint8_t>(r));
  }
  if (last_grad) *last_grad = grads[0];
  return decisions;
}

}  // namespace

TEST_CASE("synchronizer with Accordion over MPI: the same decisions on every rank and on threads") {
  std::vector<std::uint8_t> threads;
  std::vector<float> threads_grad;
  {
    bellows::collectives::mpi world(MPI_COMM_WORLD);
    bellows::collectives::local_group group(world.size());
    group.run([&](bellows::collectives::local& comm) {
      std::vector<float> g;
      auto d = sync_decisions(comm, &g);
      if (comm.rank() == world.rank()) {
        threads = std::move(d);
        threads_grad = std::move(g);
      }
    });
  }
  // Both levels occur in the script, or the comparison would say little.
  CHECK(std::count(threads.begin(), threads.end(), std::uint8_t(bellows::regime::critical)) > 0);
  CHECK(std::count(threads.begin(), threads.end(), std::uint8_t(bellows::regime::normal)) > 0);

  for (const mpi_sum_order order : {mpi_sum_order::rank, mpi_sum_order::library}) {
    CAPTURE(static_cast<int>(order));
    bellows::collectives::mpi comm(MPI_COMM_WORLD, order);
    std::vector<float> g;
    const std::vector<std::uint8_t> mine = sync_decisions(comm, &g);
    CHECK(mine == threads);
    if (order == mpi_sum_order::rank) CHECK(g == threads_grad);
    // Every rank's decisions, gathered, are rank 0's.
    bellows::gather_buffer all;
    comm.allgather(std::as_bytes(std::span<const std::uint8_t>(mine)), all);
    for (std::size_t r = 0; r < comm.size(); ++r) {
      const auto block = all.block(r);
      CHECK(std::equal(block.begin(), block.end(), std::as_bytes(std::span<const std::uint8_t>(mine)).begin(),
                       std::as_bytes(std::span<const std::uint8_t>(mine)).end()));
    }
  }
}
