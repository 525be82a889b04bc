// SPDX-License-Identifier: Apache-2.0
// fmnist_demo: the Accordion comparison on the real Fashion-MNIST data. Trains an MLP data-parallel
// on four workers (threads) with the gradients averaged uncompressed, by PowerSGD and by top-k,
// each at a static low level, a static high level and switched by Accordion, for every seed;
// prints one line per epoch and writes results.json, results.md and SVG plots into a folder.
// With --ablation it trains the grid of ablation.hpp instead.
// fmnist_mpi (mpi.cpp) trains the same on the ranks of MPI_COMM_WORLD.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <vector>

#include "ablation.hpp"
#include "cli.hpp"
#include "idx.hpp"
#include "report.hpp"
#include "runs.hpp"

int main(int argc, char** argv) {
  try {
    const fmnist::cli::command c = fmnist::cli::parse(argc, argv);
    if (c.help) {
      std::printf("usage: fmnist_demo [--out DIR] [--quick] [options]\n%s", fmnist::cli::options_usage);
      return 0;
    }
    const std::filesystem::path folder = fmnist::data_dir(c.data);
    const fmnist::dataset data = fmnist::load(folder);
    std::printf("Fashion-MNIST from %s: %s\n", folder.c_str(), fmnist::describe(c.config, data).c_str());
    std::fflush(stdout);
    const auto print = [&](const fmnist::run_result& run) { fmnist::cli::print_epoch(run, c.config); };
    if (c.ablation) {
      (void)fmnist::run_ablation(data, c.config, c.out, print);
      std::printf("wrote %s/results.md and a results.json per group\n", c.out.c_str());
      return 0;
    }
    const std::vector<fmnist::run_result> results = fmnist::run_comparison(data, c.config, print);
    fmnist::cli::write_outputs(c, data, results);
    return 0;
  } catch (const fmnist::cli::usage_error& e) {
    std::fprintf(stderr, "fmnist_demo: %s\nusage: fmnist_demo [--out DIR] [--quick] [options]\n%s", e.what(),
                 fmnist::cli::options_usage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fmnist_demo: %s\n", e.what());
    return 1;
  }
}
