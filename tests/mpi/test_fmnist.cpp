// SPDX-License-Identifier: Apache-2.0
// Runs under mpirun (-np 2 and -np 4 in ctest): the Fashion-MNIST example's training with one
// worker per rank (fmnist::on_rank over bellows::collectives::mpi) against the same configuration
// on threads (rank 0 trains that too). With rank-order sums everything must be the same bits:
// weights, losses, accuracies, traffic and Accordion's levels. With MPI_Allreduce's order the
// float sums of the gradients differ in their last bits, and training carries the difference on:
// the levels must still agree, the accuracies within 2 test images of 128, the weights within
// 1e-3 of the largest weight (measured: well below; see the message).
#include "mpi_main.hpp"

#include <bellows/collectives/mpi.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "../examples/fmnist_data.hpp"
#include "fmnist/runs.hpp"

namespace {

/// 3 epochs of 256 training and 128 test images, batch 16 per worker, Accordion every epoch.
fmnist::comparison_config tiny(std::size_t workers) {
  fmnist::comparison_config config = fmnist::quick_comparison();
  fmnist::set_epochs(config, 3);
  config.train.train_limit = 256;
  config.train.test_limit = 128;
  config.train.batch = 16;
  config.train.workers = workers;
  config.runs = {{fmnist::method::powersgd, fmnist::policy::accordion}, {fmnist::method::topk, fmnist::policy::accordion}};
  return config;
}

}  // namespace

TEST_CASE("fmnist over MPI: the thread run's training, bit for bit in rank order") {
  const fmnist::dataset* data = fmnist::testing::real_data();
  if (data == nullptr) {
    MESSAGE("skipped: no Fashion-MNIST in " << fmnist::package_dir << " (apt-get install dataset-fashion-mnist)");
    return;
  }
  using bellows::collectives::mpi_sum_order;
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const fmnist::comparison_config config = tiny(static_cast<std::size_t>(size));
  std::vector<fmnist::run_result> threads;
  if (rank == 0) threads = fmnist::run_comparison(*data, config);

  for (const mpi_sum_order order : {mpi_sum_order::rank, mpi_sum_order::library}) {
    CAPTURE(static_cast<int>(order));
    bellows::collectives::mpi comm(MPI_COMM_WORLD, order);
    const std::vector<fmnist::run_result> ranks =
        fmnist::run_comparison(*data, config, {}, fmnist::on_rank<bellows::collectives::mpi>{&comm});
    REQUIRE(ranks.size() == config.runs.size());
    // Every rank ends with rank 0's weights.
    for (const fmnist::run_result& r : ranks) {
      std::vector<float> first = r.weights;
      comm.broadcast(std::as_writable_bytes(std::span<float>(first)), 0);
      CHECK(first == r.weights);
    }
    if (rank != 0) continue;
    for (std::size_t k = 0; k < ranks.size(); ++k) {
      const fmnist::run_result &got = ranks[k], &want = threads[k];
      CAPTURE(got.spec.id());
      REQUIRE(got.epochs.size() == want.epochs.size());
      for (std::size_t e = 0; e < got.epochs.size(); ++e) {
        const fmnist::epoch_report &g = got.epochs[e].report, &w = want.epochs[e].report;
        CHECK(got.epochs[e].levels == want.epochs[e].levels);
        CHECK(g.sent == w.sent);
        if (order == mpi_sum_order::rank) {
          CHECK(g.test_accuracy == w.test_accuracy);
          CHECK(g.test_loss == w.test_loss);
          CHECK(g.train_loss == w.train_loss);
        } else {
          CHECK(std::abs(g.test_accuracy - w.test_accuracy) <= 2.0 / 128);
        }
      }
      if (order == mpi_sum_order::rank) {
        CHECK(got.weights == want.weights);
      } else {
        double gap = 0, scale = 0;
        for (std::size_t i = 0; i < got.weights.size(); ++i) {
          gap = std::max(gap, std::abs(double{got.weights[i]} - want.weights[i]));
          scale = std::max(scale, std::abs(double{want.weights[i]}));
        }
        MESSAGE(got.spec.id() << " with MPI_Allreduce's order: largest weight difference " << gap / scale
                              << " of the largest weight");
        CHECK(gap / scale < 1e-3);
      }
    }
  }
}
