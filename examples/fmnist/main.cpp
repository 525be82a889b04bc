// SPDX-License-Identifier: Apache-2.0
// fmnist_demo: the Accordion comparison on the real Fashion-MNIST data. Trains an MLP data-parallel
// on four workers (threads) with the gradients averaged uncompressed, by PowerSGD and by top-k,
// each at a static low level, a static high level and switched by Accordion, for every seed;
// prints one line per epoch and writes results.json, results.md and SVG plots into a folder.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idx.hpp"
#include "report.hpp"
#include "runs.hpp"
#include "svg.hpp"

namespace {

constexpr const char* usage =
    "usage: fmnist_demo [--out DIR] [--quick] [options]\n"
    "  --out DIR          folder for results.json, results.md and the plots (default demo-results)\n"
    "  --quick            the short configuration of the test suite: 1 seed, 6 epochs, 4800 images\n"
    "  --epochs N         epochs per run (12); the learning rate drops x0.1 at 50% and 75% of them\n"
    "  --seeds N          seeds 1 .. N (2)\n"
    "  --runs A,B,...     runs to train (all), of: uncompressed powersgd-low powersgd-high\n"
    "                     powersgd-accordion topk-low topk-high topk-accordion\n"
    "  --interval N       Accordion: check every N epochs (2)\n"
    "  --eta X            Accordion: relative change of a layer's gradient norm that marks a critical\n"
    "                     regime (0.5)\n"
    "  --lr X             initial learning rate (0.05)\n"
    "  --train-images N   train on the first N images (0: all 60000)\n"
    "  --test-images N    test on the first N images (0: all 10000)\n"
    "  --data DIR         folder of the four IDX files (default $BELLOWS_FMNIST_DIR, else the\n"
    "                     dataset-fashion-mnist package's /usr/share/datasets/fashion-mnist)\n"
    "  --checkpoint FILE  save the training state to FILE after every epoch (one run, one seed)\n"
    "  --resume FILE      continue the training saved in FILE (same options as when it was saved);\n"
    "                     the results then hold the epochs trained after the resume, and no plots\n";

/// The argument after option argv[i] (i moves onto it).
std::string value_of(int& i, int argc, char** argv) {
  if (i + 1 >= argc) throw bellows::error(std::string(argv[i]) + " needs a value");
  return argv[++i];
}

std::size_t count_of(const std::string& text, const char* name) {
  std::size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || text[0] == '-')
    throw bellows::error(std::string(name) + ": not a whole number: '" + text + "'");
  return static_cast<std::size_t>(v);
}

float real_of(const std::string& text, const char* name) {
  std::size_t used = 0;
  float v = 0;
  try {
    v = std::stof(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty())
    throw bellows::error(std::string(name) + ": not a number: '" + text + "'");
  return v;
}

std::vector<fmnist::run_spec> runs_of(const std::string& list) {
  std::vector<fmnist::run_spec> runs;
  std::size_t from = 0;
  while (from <= list.size()) {
    const std::size_t comma = std::min(list.find(',', from), list.size());
    const std::string id = list.substr(from, comma - from);
    bool found = false;
    for (const fmnist::run_spec& r : fmnist::all_runs())
      if (r.id() == id) {
        runs.push_back(r);
        found = true;
      }
    if (!found) throw bellows::error("--runs: no run named '" + id + "'");
    from = comma + 1;
  }
  return runs;
}

/// The levels of an epoch as one letter per layer: L low, H high, - dense.
std::string letters(const std::vector<fmnist::level>& levels) {
  std::string s;
  for (const fmnist::level l : levels) s += l == fmnist::level::low ? 'L' : l == fmnist::level::high ? 'H' : '-';
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::filesystem::path out = "demo-results";
    std::string dir;
    std::filesystem::path checkpoint, resume;
    bool quick = false;
    // Options given on the command line, applied over the full or the quick configuration.
    std::vector<std::pair<std::string_view, std::string>> given;
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        std::fputs(usage, stdout);
        return 0;
      }
      if (arg == "--quick") {
        quick = true;
      } else if (arg == "--out") {
        out = value_of(i, argc, argv);
      } else if (arg == "--data") {
        dir = value_of(i, argc, argv);
      } else if (arg == "--checkpoint") {
        checkpoint = value_of(i, argc, argv);
      } else if (arg == "--resume") {
        resume = value_of(i, argc, argv);
      } else if (arg == "--epochs" || arg == "--seeds" || arg == "--runs" || arg == "--interval" ||
                 arg == "--eta" || arg == "--lr" || arg == "--train-images" || arg == "--test-images") {
        given.emplace_back(arg, value_of(i, argc, argv));
      } else {
        std::fprintf(stderr, "fmnist_demo: unknown option '%s'\n%s", argv[i], usage);
        return 2;
      }
    }
    fmnist::comparison_config config = quick ? fmnist::quick_comparison() : fmnist::full_comparison();
    if (!given.empty()) config.rationale += " Changed on the command line:";
    for (const auto& [name, value] : given) {
      const std::string option(name);
      config.rationale.append(" ").append(option).append(" ").append(value);
      if (name == "--epochs") {
        fmnist::set_epochs(config, count_of(value, option.c_str()));
      } else if (name == "--seeds") {
        config.seeds.clear();
        for (std::size_t s = 1; s <= count_of(value, option.c_str()); ++s) config.seeds.push_back(s);
      } else if (name == "--runs") {
        config.runs = runs_of(value);
      } else if (name == "--interval") {
        config.accordion.interval = count_of(value, option.c_str());
      } else if (name == "--eta") {
        config.accordion.eta = real_of(value, option.c_str());
      } else if (name == "--lr") {
        config.train.schedule.base = real_of(value, option.c_str());
      } else if (name == "--train-images") {
        config.train.train_limit = count_of(value, option.c_str());
      } else {
        config.train.test_limit = count_of(value, option.c_str());
      }
    }

    if (!given.empty()) config.rationale += ".";
    config.train.checkpoint = checkpoint;
    config.train.resume = resume;
    const std::filesystem::path folder = fmnist::data_dir(dir);
    const fmnist::dataset data = fmnist::load(folder);
    std::printf("Fashion-MNIST from %s: %s\n", folder.c_str(), fmnist::describe(config, data).c_str());
    std::fflush(stdout);
    const std::vector<fmnist::run_result> results =
        fmnist::run_comparison(data, config, [&](const fmnist::run_result& run) {
          const fmnist::epoch_record& e = run.epochs.back();
          std::printf("%-18s seed %llu  epoch %2zu/%zu  loss %.4f  acc %6.2f%%  floats %10.4g  levels %s  %5.2f s\n",
                      run.spec.id().c_str(), static_cast<unsigned long long>(run.seed),
                      e.report.epoch + 1, config.train.epochs, e.report.train_loss,
                      100 * e.report.test_accuracy, static_cast<double>(e.report.sent.elements),
                      letters(e.levels).c_str(), e.report.seconds);
          std::fflush(stdout);
        });
    if (results.front().epochs.empty()) {
      std::printf("%s holds all %zu epochs: nothing left to train\n", resume.c_str(), config.train.epochs);
      return 0;
    }
    std::filesystem::create_directories(out);
    fmnist::write_results_json(out / "results.json", config, data, results);
    const fmnist::summary sum = fmnist::summarise(config, results);
    fmnist::write_results_md(out / "results.md", config, data, sum);
    if (resume.empty()) {
      fmnist::write_plots(out, config, results);
      std::printf("\n%swrote %s/{results.json,results.md,accuracy.svg,floats.svg,levels.svg}\n",
                  fmnist::verdict_lines(sum).c_str(), out.c_str());
    } else {
      std::printf("\n%swrote %s/{results.json,results.md}\n", fmnist::verdict_lines(sum).c_str(), out.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fmnist_demo: %s\n", e.what());
    return 1;
  }
}
