// SPDX-License-Identifier: Apache-2.0
// Runs under mpirun (-np 2 and -np 4 in ctest): the Fashion-MNIST example's training with one
// worker per rank (fmnist::on_rank over bellows::collectives::mpi) against the same configuration
// on threads (rank 0 trains that too). With rank-order sums everything must be the same bits:
// weights, losses, accuracies, traffic and Accordion's levels. With MPI_Allreduce's order the
// float sums of the gradients differ in their last bits, and training carries the difference on:
// the levels must still agree, the accuracies within 2 test images of 128, the weights within
// 1e-3 of the largest weight (measured: well below; see the message). And a checkpoint saved by
// the thread run resumes under MPI to the thread run's end.
#include "mpi_main.hpp"

#include <bellows/collectives/mpi.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "../examples/fmnist_data.hpp"
#include "fmnist/runs.hpp"

namespace {

/// 3 epochs of 256 training and 128 test images, batch 16 per worker, Accordion every epoch.
fmnist::comparison_config tiny(std::size_t workers) {
  fmnist::comparison_config config = fmnist::testing::small_comparison(
      3, 256,
      {{fmnist::method::powersgd, fmnist::policy::accordion}, {fmnist::method::topk, fmnist::policy::accordion}});
  config.train.workers = workers;
  return config;
}

}  // namespace

TEST_CASE("fmnist over MPI: the thread run's training, bit for bit in rank order") {
  const fmnist::dataset* data = fmnist::testing::real_data();
  if (data == nullptr) return;
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

TEST_CASE("fmnist over MPI: a checkpoint of the thread run resumes under MPI to the thread run's end") {
  const fmnist::dataset* data = fmnist::testing::real_data();
  if (data == nullptr) return;
  int rank = 0, size = 0, owner = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  fmnist::comparison_config config = tiny(static_cast<std::size_t>(size));
  config.runs = {{fmnist::method::powersgd, fmnist::policy::accordion}};
  // Only rank 0 reads the file; the others need to know that there is one.
  if (rank == 0) owner = static_cast<int>(::getpid());
  MPI_Bcast(&owner, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("bellows_mpi_fmnist_resume_" + std::to_string(owner));
  fmnist::run_result whole;
  if (rank == 0) {
    whole = fmnist::run_comparison(*data, config).at(0);
    // The thread run stops with an error right after the save of epoch 0.
    fmnist::comparison_config saving = config;
    saving.train.checkpoint = path;
    CHECK_THROWS_WITH(
        fmnist::run_comparison(*data, saving, [](const fmnist::run_result&) { throw std::runtime_error("stop"); }),
        "stop");
  }
  config.train.resume = path;
  bellows::collectives::mpi comm(MPI_COMM_WORLD, bellows::collectives::mpi_sum_order::rank);
  const fmnist::run_result resumed =
      fmnist::run_comparison(*data, config, {}, fmnist::on_rank<bellows::collectives::mpi>{&comm}).at(0);
  if (rank != 0) return;
  std::filesystem::remove(path);
  REQUIRE(resumed.epochs.size() == whole.epochs.size());  // the checkpoint's epoch 0 and the ones trained
  CHECK(resumed.epochs.front().report.test_accuracy == whole.epochs.front().report.test_accuracy);
  CHECK(resumed.weights == whole.weights);
  CHECK(resumed.epochs.back().report.test_accuracy == whole.epochs.back().report.test_accuracy);
  CHECK(resumed.epochs.back().levels == whole.epochs.back().levels);
}
