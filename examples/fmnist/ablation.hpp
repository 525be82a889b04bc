// SPDX-License-Identifier: Apache-2.0
// The ablation of `scripts/demo.sh ablation`: PowerSGD Accordion under the comparison's schedule at
// two learning rates (0.05 and 0.025), with both level changes (keep and reset) and every PowerSGD
// pair of levels, each for every seed, beside static low at the same learning rate. It asks what
// the fall of accuracy after a switch to the high level depends on.
//
// One group per (learning rate, level change) is an ordinary comparison (runs.hpp) and writes its
// results.json into DIR/lr<rate>-<change>/; static low runs in the keep groups only (it never
// switches, so the level change does not touch it). DIR/results.md holds the summary table: per
// pair, rate and level change the final accuracy, static low's, the share of static low's floats
// and the deepest drop after a switch (report.hpp's deepest_drop).
#pragma once

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include <bellows/core/error.hpp>
#include <bellows/sync/synchronizer.hpp>

#include "idx.hpp"
#include "report.hpp"
#include "runs.hpp"

namespace fmnist {

/// The learning rates of the ablation.
inline constexpr float ablation_rates[] = {0.05f, 0.025f};
inline constexpr bellows::level_change ablation_changes[] = {bellows::level_change::keep, bellows::level_change::reset};

/// One group of the ablation: `base` at learning rate `lr` and level change `change`, training
/// PowerSGD Accordion for every pair (and static low for every pair under keep).
[[nodiscard]] inline comparison_config ablation_group(const comparison_config& base, float lr,
                                                      bellows::level_change change) {
  comparison_config config = base;
  config.train.schedule.base = lr;
  config.level_change = change;
  config.runs.clear();
  const std::size_t pairs = config.powersgd_low_ranks.size();
  if (change == bellows::level_change::keep)
    for (std::size_t k = 0; k < pairs; ++k) config.runs.push_back({method::powersgd, policy::static_low, k});
  for (std::size_t k = 0; k < pairs; ++k) config.runs.push_back({method::powersgd, policy::accordion, k});
  return config;
}

/// The folder of a group inside the ablation's folder: "lr0.05-keep", ...
[[nodiscard]] inline std::string ablation_folder(float lr, bellows::level_change change) {
  return detail::format("lr%g-%s", static_cast<double>(lr), bellows::to_string(change));
}

/// One row of the ablation's table.
struct ablation_row {
  float lr = 0;
  bellows::level_change change = bellows::level_change::keep;
  run_summary accordion;
  run_summary low;  ///< static low of the same pair and learning rate
  [[nodiscard]] double floats_share() const { return accordion.floats / low.floats; }
};

/// results.md of the ablation: the settings, the floor of each pair, and the table.
[[nodiscard]] inline std::string ablation_markdown(const comparison_config& base, const dataset& data,
                                                   const std::vector<ablation_row>& rows, double seconds) {
  using detail::format;
  std::string s = "# Ablation: PowerSGD Accordion on Fashion-MNIST\n\n";
  s += describe(base, data) + ".\n\n";
  s += format("Every cell is PowerSGD Accordion over %zu seed%s at one learning rate (decays as in the "
              "comparison) and one level change; static low of the same pair and rate beside it. %.0f s "
              "in all.\n\n",
              base.seeds.size(), base.seeds.size() == 1 ? "" : "s", seconds);
  s += "| pair | lr | level change | final accuracy (spread) | static low (spread) | gap (points) "
       "| share of static low's floats | deepest drop after a switch (worst seed) |\n"
       "|---|---:|---|---:|---:|---:|---:|---:|\n";
  for (const ablation_row& r : rows)
    s += format("| %s | %g | %s | %.2f%% (%.2f) | %.2f%% (%.2f) | %+.2f | %.1f%% | %.2f (%.2f) |\n",
                r.accordion.label.c_str(), static_cast<double>(r.lr), bellows::to_string(r.change),
                100 * r.accordion.accuracy_mean, 100 * r.accordion.spread(), 100 * r.low.accuracy_mean,
                100 * r.low.spread(), 100 * (r.accordion.accuracy_mean - r.low.accuracy_mean), 100 * r.floats_share(),
                100 * r.accordion.drop, 100 * r.accordion.drop_worst);
  s += "\nAccuracies and drops in points of test accuracy; the drop is the accuracy after the epoch "
       "before a layer switched from low to high minus the lowest of the next two epochs', the deepest "
       "over the run, mean over the seeds. Each cell's runs, every epoch, are in its folder's "
       "results.json.\n";
  return s;
}

/// Trains every group of the ablation of `base` (its runs and learning rate are replaced), writes
/// each group's results.json under `out` and the table into out/results.md; returns the rows.
inline std::vector<ablation_row> run_ablation(const dataset& data, const comparison_config& base,
                                              const std::filesystem::path& out,
                                              const progress_callback& progress = {}) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<ablation_row> rows;
  for (const float lr : ablation_rates) {
    std::vector<run_summary> lows;  // per pair, from the keep group
    for (const bellows::level_change change : ablation_changes) {
      const comparison_config config = ablation_group(base, lr, change);
      const std::vector<run_result> results = run_comparison(data, config, progress);
      const std::filesystem::path folder = out / ablation_folder(lr, change);
      std::filesystem::create_directories(folder);
      write_results_json(folder / "results.json", config, data, results);
      const summary sum = summarise(config, results);
      for (std::size_t k = 0; k < config.powersgd_low_ranks.size(); ++k) {
        if (const run_summary* low = sum.find({method::powersgd, policy::static_low, k})) lows.push_back(*low);
        BELLOWS_EXPECTS(k < lows.size(), "fmnist ablation: no static low for pair ", k + 1);
        rows.push_back({lr, change, *sum.find({method::powersgd, policy::accordion, k}), lows[k]});
      }
    }
  }
  // Rows by pair, then learning rate, then level change.
  std::vector<ablation_row> sorted;
  for (std::size_t k = 0; k < base.powersgd_low_ranks.size(); ++k)
    for (const ablation_row& r : rows)
      if (r.accordion.spec.pair == k) sorted.push_back(r);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  detail::write_text(out / "results.md", ablation_markdown(base, data, sorted, seconds));
  return sorted;
}

}  // namespace fmnist
