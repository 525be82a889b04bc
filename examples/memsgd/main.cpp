// SPDX-License-Identifier: Apache-2.0
// memsgd_demo: reproduces the convex experiments of "Sparsified SGD with Memory" (Stich,
// Cordonnier, Jaggi, NeurIPS 2018) on bellows' own compressors, and its lock-free parallel
// variant; writes results.json, results.md and SVG plots, and prints which claims held.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include "memsgd/experiment.hpp"
#include "memsgd/report.hpp"

int main(int argc, char** argv) {
  CLI::App app{"memsgd_demo: Mem-SGD (top-k / rand-k with memory) against SGD, sparsification without memory\n"
               "and QSGD on logistic regression (binary Fashion-MNIST and a synthetic sparse set), and the\n"
               "lock-free parallel variant. Writes results.json, results.md and SVG plots."};
  memsgd::experiment_options o;
  std::filesystem::path out = "memsgd-results";
  app.add_flag("--quick", o.quick, "smaller data and fewer epochs (under a minute)");
  app.add_option("--out", out, "folder for results.json, results.md and the plots")->capture_default_str();
  app.add_option("--data", o.fmnist_dir,
                 "folder of the Fashion-MNIST IDX files (default $BELLOWS_FMNIST_DIR, else the "
                 "dataset-fashion-mnist package's)");
  app.add_option("--seed", o.seed, "seed of the synthetic set, the samples and the compressors")->capture_default_str();
  app.add_option("--gamma", o.gamma, "gamma of both step-size schedules")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--shift-factor", o.shift_factor, "a = factor d / k in the shifted schedule")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--threads", o.threads,
                 "thread counts of the lock-free runs, the first the baseline of the speed-ups (default 1, 2, 4, "
                 "... up to the cores)")
      ->delimiter(',')
      ->check(CLI::Range(1, 1024));
  app.add_option("--jobs", o.jobs, "sequential runs at a time (0: one per hardware thread)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  o.log = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  try {
    const memsgd::experiment_results r = memsgd::run_experiment(o);
    const auto files = memsgd::write_results(r, out);
    std::printf("\nwrote %zu files to %s (results.json, results.md, SVG plots); %.1f s\n", files.size(),
                out.string().c_str(), r.seconds);
    for (const memsgd::claim& c : r.claims)
      std::printf("%s: %s\n  %s\n", c.held ? "HELD" : "NOT HELD", c.name.c_str(), c.evidence.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memsgd_demo: %s\n", e.what());
    return 1;
  }
}
