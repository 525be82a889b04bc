// SPDX-License-Identifier: Apache-2.0
// The command line of the Fashion-MNIST programs (fmnist_demo on threads, fmnist_mpi on the ranks
// of MPI_COMM_WORLD): the options they share, the line printed per epoch, and the files written.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <bellows/core/error.hpp>
#include <bellows/plan/exchange.hpp>

#include "idx.hpp"
#include "report.hpp"
#include "runs.hpp"
#include "svg.hpp"

namespace fmnist::cli {

/// The options both programs take, for their --help.
inline constexpr const char* options_usage =
    "  --out DIR          folder for results.json, results.md and the plots (default demo-results)\n"
    "  --quick            the short configuration of the test suite: 1 seed, 6 epochs, 4800 images\n"
    "  --ablation         instead of the comparison, PowerSGD Accordion at lr 0.05 and 0.025, level\n"
    "                     change keep and reset, every PowerSGD pair, with static low beside it;\n"
    "                     a summary table in DIR/results.md, each cell's runs under DIR/lr*-*/\n"
    "  --epochs N         epochs per run (48); the learning rate drops x0.1 at 50% and 75% of them\n"
    "  --epoch-images N   images per epoch, a fresh shuffle of the training images each (10000; 0: all)\n"
    "  --seeds N          seeds 1 .. N (2)\n"
    "  --runs A,B,...     runs to train (all), of: uncompressed powersgd-low powersgd-high\n"
    "                     powersgd-accordion topk-low topk-high topk-accordion, and for the k-th\n"
    "                     PowerSGD low rank (k >= 2) powersgd-low-pairk powersgd-accordion-pairk;\n"
    "                     named only: qsgd-low qsgd-high signsgd-low signsgd-high\n"
    "  --powersgd-low R,.. PowerSGD low ranks, one pair of levels with the high rank each (4,2)\n"
    "  --powersgd-high R  PowerSGD high rank (1)\n"
    "  --topk-low X       top-k low level: ratio of elements kept (0.99)\n"
    "  --topk-high X      top-k high level (0.1)\n"
    "  --qsgd-low B       QSGD low level: bits per element, 2, 4 or 8 (8)\n"
    "  --qsgd-high B      QSGD high level (4)\n"
    "  --signsgd-low N    EF-signSGD low level: elements per scale, 0 for the whole layer (128)\n"
    "  --signsgd-high N   EF-signSGD high level (0)\n"
    "  --exchange E       how the top-k, QSGD and EF-signSGD runs' ranks average: gather (every\n"
    "                     rank's payload to every rank), leader (top-k only: one rank's indices per\n"
    "                     step, their values summed) or scatter (each chunk to its owner, averaged\n"
    "                     and compressed again there, then gathered) (gather)\n"
    "  --owner-memory M   under scatter: on or off, whether the chunks' owners keep the error of\n"
    "                     their second compression (each codec's default: on for top-k and\n"
    "                     EF-signSGD, off for QSGD)\n"
    "  --workers N        data-parallel workers (4); fmnist_mpi takes the number of MPI ranks\n"
    "  --level-change C   what a layer's state does when Accordion switches it: keep (its error\n"
    "                     memory, PowerSGD's shared query columns) or reset (memory zero, query\n"
    "                     drawn afresh, as the Accordion authors' code does) (keep)\n"
    "  --interval N       Accordion: check every N epochs (1)\n"
    "  --eta X            Accordion: relative change of a layer's gradient norm that marks a critical\n"
    "                     regime (0.5)\n"
    "  --lr X             initial learning rate (0.05)\n"
    "  --momentum X       SGD momentum (0.9)\n"
    "  --train-images N   train on the first N images (0: all 60000)\n"
    "  --test-images N    test on the first N images (0: all 10000)\n"
    "  --data DIR         folder of the four IDX files (default $BELLOWS_FMNIST_DIR, else the\n"
    "                     dataset-fashion-mnist package's /usr/share/datasets/fashion-mnist)\n"
    "  --checkpoint FILE  save the training state to FILE after every epoch (one run, one seed)\n"
    "  --resume FILE      continue the training saved in FILE (same options as when it was saved);\n"
    "                     the results and plots cover the whole run, the saved epochs included\n";

/// A command line that cannot be understood; the programs print it with the usage.
struct usage_error : bellows::error {
  using bellows::error::error;
};

/// The argument after option argv[i] (i moves onto it).
inline std::string value_of(int& i, int argc, char** argv) {
  if (i + 1 >= argc) throw usage_error(std::string(argv[i]) + " needs a value");
  return argv[++i];
}

inline std::size_t count_of(const std::string& text, const char* name) {
  std::size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || text[0] == '-')
    throw usage_error(std::string(name) + ": not a whole number: '" + text + "'");
  return static_cast<std::size_t>(v);
}

/// QSGD's bits per element: 2, 4 or 8.
inline unsigned bits_of(const std::string& text, const char* name) {
  const std::size_t b = count_of(text, name);
  if (b != 2 && b != 4 && b != 8) throw usage_error(std::string(name) + ": bits must be 2, 4 or 8, got '" + text + "'");
  return static_cast<unsigned>(b);
}

inline float real_of(const std::string& text, const char* name) {
  std::size_t used = 0;
  float v = 0;
  try {
    v = std::stof(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty()) throw usage_error(std::string(name) + ": not a number: '" + text + "'");
  return v;
}

/// The comma-separated items of a list.
inline std::vector<std::string> items_of(const std::string& list) {
  std::vector<std::string> items;
  std::size_t from = 0;
  while (from <= list.size()) {
    const std::size_t comma = std::min(list.find(',', from), list.size());
    items.push_back(list.substr(from, comma - from));
    from = comma + 1;
  }
  return items;
}

inline std::vector<run_spec> runs_of(const std::string& list, std::size_t powersgd_pairs) {
  std::vector<run_spec> runs;
  for (const std::string& id : items_of(list)) {
    bool found = false;
    for (const run_spec& r : known_runs(powersgd_pairs))
      if (r.id() == id) {
        runs.push_back(r);
        found = true;
      }
    if (!found) throw usage_error("--runs: no run named '" + id + "'");
  }
  return runs;
}

inline bellows::exchange exchange_of(const std::string& text) {
  for (const bellows::exchange x : {bellows::exchange::gather, bellows::exchange::leader, bellows::exchange::scatter})
    if (text == bellows::to_string(x)) return x;
  throw usage_error("--exchange: '" + text + "' is not gather, leader or scatter");
}

inline bool on_off_of(const std::string& text, const char* option) {
  if (text == "on" || text == "off") return text == "on";
  throw usage_error(std::string(option) + ": '" + text + "' is neither on nor off");
}

inline bellows::level_change level_change_of(const std::string& text) {
  for (const bellows::level_change c : {bellows::level_change::keep, bellows::level_change::reset})
    if (text == bellows::to_string(c)) return c;
  throw usage_error("--level-change: '" + text + "' is neither keep nor reset");
}

/// The levels of an epoch as one letter per layer: L low, H high, - dense.
inline std::string letters(const std::vector<level>& levels) {
  std::string s;
  for (const level l : levels) s += l == level::low ? 'L' : l == level::high ? 'H' : '-';
  return s;
}

/// What a command line asks for.
struct command {
  comparison_config config;
  std::filesystem::path out = "demo-results";
  std::string data;  ///< the --data folder (empty: data_dir's default)
  bool help = false;
  bool ablation = false;  ///< --ablation: the grid of ablation.hpp instead of the comparison
};

/// Reads the options of options_usage; `other(arg, i)` may take an option of the program's own
/// (reading its value with value_of) and returns whether it did. Raises usage_error otherwise.
inline command parse(int argc, char** argv, const std::function<bool(std::string_view, int&)>& other = {}) {
  command c;
  std::filesystem::path checkpoint, resume;
  bool quick = false;
  // Options given on the command line, applied over the full or the quick configuration.
  std::vector<std::pair<std::string_view, std::string>> given;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      c.help = true;
      return c;
    }
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--ablation") {
      c.ablation = true;
    } else if (arg == "--out") {
      c.out = value_of(i, argc, argv);
    } else if (arg == "--data") {
      c.data = value_of(i, argc, argv);
    } else if (arg == "--checkpoint") {
      checkpoint = value_of(i, argc, argv);
    } else if (arg == "--resume") {
      resume = value_of(i, argc, argv);
    } else if (arg == "--epochs" || arg == "--seeds" || arg == "--runs" || arg == "--interval" || arg == "--eta" ||
               arg == "--lr" || arg == "--train-images" || arg == "--test-images" || arg == "--epoch-images" ||
               arg == "--powersgd-low" || arg == "--powersgd-high" || arg == "--topk-low" || arg == "--topk-high" ||
               arg == "--qsgd-low" || arg == "--qsgd-high" || arg == "--signsgd-low" || arg == "--signsgd-high" ||
               arg == "--momentum" || arg == "--level-change" || arg == "--exchange" || arg == "--owner-memory" ||
               arg == "--workers") {
      given.emplace_back(arg, value_of(i, argc, argv));
    } else if (!other || !other(arg, i)) {
      throw usage_error("unknown option '" + std::string(arg) + "'");
    }
  }
  comparison_config& config = c.config;
  config = quick ? quick_comparison() : full_comparison();
  if (!given.empty()) config.rationale += " Changed on the command line:";
  const std::string* runs = nullptr;  // applied last: its names depend on --powersgd-low
  for (const auto& [name, value] : given) {
    const std::string option(name);
    config.rationale.append(" ").append(option).append(" ").append(value);
    if (name == "--runs") {
      runs = &value;
    } else if (name == "--powersgd-low") {
      config.powersgd_low_ranks.clear();
      for (const std::string& r : items_of(value)) config.powersgd_low_ranks.push_back(count_of(r, option.c_str()));
      config.runs = all_runs(config.powersgd_low_ranks.size());
    } else if (name == "--powersgd-high") {
      config.powersgd_high_rank = count_of(value, option.c_str());
    } else if (name == "--topk-low") {
      config.topk_low_ratio = real_of(value, option.c_str());
    } else if (name == "--topk-high") {
      config.topk_high_ratio = real_of(value, option.c_str());
    } else if (name == "--qsgd-low") {
      config.qsgd_low_bits = bits_of(value, option.c_str());
    } else if (name == "--qsgd-high") {
      config.qsgd_high_bits = bits_of(value, option.c_str());
    } else if (name == "--signsgd-low") {
      config.signsgd_low_bucket = count_of(value, option.c_str());
    } else if (name == "--signsgd-high") {
      config.signsgd_high_bucket = count_of(value, option.c_str());
    } else if (name == "--momentum") {
      config.train.momentum = real_of(value, option.c_str());
    } else if (name == "--level-change") {
      config.level_change = level_change_of(value);
    } else if (name == "--exchange") {
      config.exchange = exchange_of(value);
    } else if (name == "--owner-memory") {
      config.owner_memory = on_off_of(value, option.c_str());
    } else if (name == "--workers") {
      config.train.workers = count_of(value, option.c_str());
    } else if (name == "--epoch-images") {
      config.train.epoch_limit = count_of(value, option.c_str());
    } else if (name == "--epochs") {
      set_epochs(config, count_of(value, option.c_str()));
    } else if (name == "--seeds") {
      config.seeds.clear();
      for (std::size_t s = 1; s <= count_of(value, option.c_str()); ++s) config.seeds.push_back(s);
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
  if (runs != nullptr) config.runs = runs_of(*runs, config.powersgd_low_ranks.size());
  if (!given.empty()) config.rationale += ".";
  config.train.checkpoint = checkpoint;
  config.train.resume = resume;
  return c;
}

/// The line of a run's last epoch, on stdout.
inline void print_epoch(const run_result& run, const comparison_config& config) {
  const epoch_record& e = run.epochs.back();
  std::printf("%-24s seed %llu  epoch %2zu/%zu  loss %.4f  acc %6.2f%%  floats %10.4g  levels %s  %5.2f s\n",
              run.spec.id().c_str(), static_cast<unsigned long long>(run.seed), e.report.epoch + 1, config.train.epochs,
              e.report.train_loss, 100 * e.report.test_accuracy, static_cast<double>(e.report.sent.elements),
              letters(e.levels).c_str(), e.report.seconds);
  std::fflush(stdout);
}

/// Writes results.json, results.md and the plots into c.out, and prints the verdict.
inline void write_outputs(const command& c, const dataset& data, const std::vector<run_result>& results) {
  const comparison_config& config = c.config;
  std::filesystem::create_directories(c.out);
  write_results_json(c.out / "results.json", config, data, results);
  const summary sum = summarise(config, results);
  write_results_md(c.out / "results.md", config, data, sum);
  write_plots(c.out, config, results);
  std::printf("\n%swrote %s/{results.json,results.md,accuracy.svg,floats.svg,levels.svg}\n", verdict_lines(sum).c_str(),
              c.out.c_str());
}

}  // namespace fmnist::cli
