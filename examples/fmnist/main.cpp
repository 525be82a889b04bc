// SPDX-License-Identifier: Apache-2.0
// fmnist_demo: the Accordion comparison on the real Fashion-MNIST data. Trains an MLP data-parallel
// on four workers (threads) with the gradients averaged uncompressed, by PowerSGD and by top-k,
// each at a static low level, a static high level and switched by Accordion, for every seed;
// prints one line per epoch and writes results.json, results.md and SVG plots into a folder.
// With --ablation it trains the grid of ablation.hpp instead. With --backend cuda (built when CUDA
// is on) the compressed runs average through the device Synchronizer (device.hpp).
// fmnist_mpi (mpi.cpp) trains the same on the ranks of MPI_COMM_WORLD.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ablation.hpp"
#include "cli.hpp"
#include "idx.hpp"
#include "report.hpp"
#include "runs.hpp"

namespace {

constexpr const char* backend_usage =
    "  --backend B        where the compressed runs average: cpu, or cuda (the device Synchronizer,\n"
    "                     the gradients copied to the GPU and back each step; the same results) (cpu)\n";

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string backend = "cpu";
    fmnist::cli::command c = fmnist::cli::parse(argc, argv, [&](std::string_view arg, int& i) {
      if (arg != "--backend") return false;
      backend = fmnist::cli::value_of(i, argc, argv);
      return true;
    });
    if (c.help) {
      std::printf("usage: fmnist_demo [--out DIR] [--quick] [--backend cpu|cuda] [options]\n%s%s",
                  fmnist::cli::options_usage, backend_usage);
      return 0;
    }
    if (backend == "cuda") {
#if defined(FMNIST_CUDA)
      if (!fmnist::device_present()) throw std::runtime_error("--backend cuda: no CUDA device");
      c.config.on_device = true;
#else
      throw fmnist::cli::usage_error("--backend cuda: this fmnist_demo is built without CUDA");
#endif
    } else if (backend != "cpu") {
      throw fmnist::cli::usage_error("--backend: '" + backend + "' is neither cpu nor cuda");
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
    std::fprintf(stderr,
                 "fmnist_demo: %s\nusage: fmnist_demo [--out DIR] [--quick] [--backend cpu|cuda] [options]\n%s%s",
                 e.what(), fmnist::cli::options_usage, backend_usage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fmnist_demo: %s\n", e.what());
    return 1;
  }
}
