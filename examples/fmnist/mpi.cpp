// SPDX-License-Identifier: Apache-2.0
// fmnist_mpi: the Fashion-MNIST comparison of fmnist_demo with one worker per MPI rank, e.g.
//     mpirun -np 4 fmnist_mpi --quick --runs uncompressed,powersgd-accordion
// Every rank loads the data and trains its shard through bellows::collectives::mpi over
// MPI_COMM_WORLD; rank 0 prints the epochs and writes the results. The training loop is the one of
// the thread run (train.hpp), so with --sum-order rank (the default) a run gives the thread run's
// weights, accuracies and Accordion decisions bit for bit; --sum-order library uses MPI_Allreduce.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <bellows/collectives/mpi.hpp>

#include "cli.hpp"
#include "idx.hpp"
#include "report.hpp"
#include "runs.hpp"

namespace {

constexpr const char* usage_line =
    "usage: mpirun -np W fmnist_mpi [--sum-order rank|library] [--out DIR] [--quick] [options]\n"
    "  --sum-order O      rank: sums in rank order, the thread run's bits (default); library:\n"
    "                     MPI_Allreduce, the MPI library's order\n";

int run(int argc, char** argv, int rank) {
  try {
    bellows::collectives::mpi_sum_order order = bellows::collectives::mpi_sum_order::rank;
    const fmnist::cli::command parsed = fmnist::cli::parse(argc, argv, [&](std::string_view arg, int& i) {
      if (arg != "--sum-order") return false;
      const std::string value = fmnist::cli::value_of(i, argc, argv);
      if (value == "rank")
        order = bellows::collectives::mpi_sum_order::rank;
      else if (value == "library")
        order = bellows::collectives::mpi_sum_order::library;
      else
        throw fmnist::cli::usage_error("--sum-order: rank or library, not '" + value + "'");
      return true;
    });
    if (parsed.help) {
      if (rank == 0) std::printf("%s%s", usage_line, fmnist::cli::options_usage);
      return 0;
    }
    if (parsed.ablation) throw fmnist::cli::usage_error("--ablation runs on threads: use fmnist_demo");
    if (std::find(argv + 1, argv + argc, std::string_view("--workers")) != argv + argc)
      throw fmnist::cli::usage_error("--workers: fmnist_mpi trains one worker per rank; set them with mpirun -np");
    bellows::collectives::mpi comm(MPI_COMM_WORLD, order);
    fmnist::cli::command c = parsed;
    c.config.train.workers = comm.size();
    const std::filesystem::path folder = fmnist::data_dir(c.data);
    const fmnist::dataset data = fmnist::load(folder);
    if (rank == 0) {
      std::printf("Fashion-MNIST from %s: %s; %zu MPI ranks, sums in %s order\n", folder.c_str(),
                  fmnist::describe(c.config, data).c_str(), comm.size(),
                  order == bellows::collectives::mpi_sum_order::rank ? "rank" : "the MPI library's");
      std::fflush(stdout);
    }
    const std::vector<fmnist::run_result> results = fmnist::run_comparison(
        data, c.config, [&](const fmnist::run_result& r) { fmnist::cli::print_epoch(r, c.config); },
        fmnist::on_rank<bellows::collectives::mpi>{&comm});
    if (rank == 0) fmnist::cli::write_outputs(c, data, results);
    return 0;
  } catch (const fmnist::cli::usage_error& e) {
    if (rank == 0) std::fprintf(stderr, "fmnist_mpi: %s\n%s%s", e.what(), usage_line, fmnist::cli::options_usage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fmnist_mpi: rank %d: %s\n", rank, e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int status = run(argc, argv, rank);
  // A rank that failed while the others wait in a collective would hang them: end them all.
  if (status == 1) MPI_Abort(MPI_COMM_WORLD, status);
  MPI_Finalize();
  return status;
}
