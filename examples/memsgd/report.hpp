// SPDX-License-Identifier: Apache-2.0
// What the experiment leaves behind: results.json (everything, curves included), results.md
// (the tables and the claims), and five SVG plots per data set:
//   <set>_memory.svg      suboptimality vs iterations, shifted schedule: SGD, top-k and rand-k with memory
//   <set>_no_memory.svg   the same for top-k and rand-k without memory
//   <set>_qsgd_iterations.svg, <set>_qsgd_bits.svg
//                         decaying schedule: SGD, Mem-SGD top-k, QSGD, against iterations and bits sent
//   <set>_lock_free.svg   suboptimality of the averaged shared iterate vs wall time, per thread count
#pragma once

#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <bellows/core/error.hpp>

#include "experiment.hpp"
#include "plots.hpp"

namespace memsgd {

namespace detail {

/// A figure in scientific notation with three significant digits; "-" for a negative value
/// (what the curves use for "not reached").
[[nodiscard]] inline std::string sci(double v) {
  if (v < 0) return "-";
  std::ostringstream s;
  s << std::scientific << std::setprecision(2) << v;
  return s.str();
}

[[nodiscard]] inline std::string fixed(double v, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

/// Colours: one per position in the list of k (top-k blues/purples, rand-k oranges/reds), QSGD
/// greens, thread counts in order.
[[nodiscard]] inline std::string colour_of(const method& m, const std::vector<std::size_t>& ks) {
  static constexpr const char* topk[] = {"#1f77b4", "#17becf", "#9467bd", "#393b79"};
  static constexpr const char* randk[] = {"#ff7f0e", "#d62728", "#8c564b", "#e377c2"};
  const auto at = [&](std::size_t k) {
    std::size_t i = 0;
    while (i < ks.size() && ks[i] != k) ++i;
    return std::min<std::size_t>(i, 3);
  };
  switch (m.kind) {
    case method_kind::sgd: return "#000000";
    case method_kind::topk: return topk[at(m.k)];
    case method_kind::randk: return randk[at(m.k)];
    case method_kind::qsgd: return m.bits == 2 ? "#2ca02c" : m.bits == 4 ? "#7fbf3f" : "#bcbd22";
  }
  return "#7f7f7f";
}

inline void write_file(const std::filesystem::path& file, const std::string& text) {
  std::ofstream out(file, std::ios::binary);
  out << text;
  if (!out) bellows::fail("memsgd: cannot write ", file);
}

}  // namespace detail

/// Everything as JSON (nlohmann::json writes NaN, which marks "not reached", as null).
[[nodiscard]] inline std::string results_json(const experiment_results& r) {
  using json = nlohmann::ordered_json;
  const experiment_options& o = r.options;
  json doc = {
      {"mode", o.quick ? "quick" : "full"},
      {"seconds", r.seconds},
      {"load_average", {{"before", r.load_before}, {"after", r.load_after}}},
      {"hardware_threads", r.hardware_threads},
      {"options",
       {{"seed", o.seed}, {"gamma", o.gamma}, {"shift_factor", o.shift_factor}, {"ks", o.ks}, {"threads", o.threads}}}};
  json& sets = doc["datasets"] = json::array();
  for (const dataset_results& d : r.datasets) {
    json runs = json::array();
    for (const run_result& run : d.runs) {
      json curve = {{"step", json::array()}, {"bits", json::array()}, {"suboptimality", json::array()}};
      for (const curve_point& p : run.curve) {
        curve["step"].push_back(p.step);
        curve["bits"].push_back(p.bits);
        curve["suboptimality"].push_back(p.suboptimality);
      }
      runs.push_back({{"method", run.how.label()},
                      {"k", run.how.k},
                      {"memory", run.how.memory},
                      {"qsgd_bits", run.how.bits},
                      {"schedule", run.schedule},
                      {"gamma", run.eta.gamma},
                      {"shift", run.eta.shift},
                      {"seconds", run.seconds},
                      {"final_suboptimality", run.final_suboptimality()},
                      {"bits_sent", run.bits()},
                      {"curve", std::move(curve)}});
    }
    const lock_free_study& lf = d.lock_free;
    json parallel = json::array();
    for (const lock_free_result& run : lf.runs) {
      json snaps = {{"seconds", json::array()},
                    {"step", json::array()},
                    {"suboptimality", json::array()},
                    {"averaged_suboptimality", json::array()}};
      for (const lock_free_snapshot& p : run.snapshots) {
        snaps["seconds"].push_back(p.seconds);
        snaps["step"].push_back(p.step);
        snaps["suboptimality"].push_back(p.suboptimality);
        snaps["averaged_suboptimality"].push_back(p.averaged);
      }
      const double t = run.time_to(lf.target);
      parallel.push_back({{"threads", run.threads},
                          {"steps", run.steps},
                          {"seconds", run.seconds},
                          {"cpu_seconds", run.cpu_seconds},
                          {"steps_per_second", run.steps_per_second()},
                          {"time_to_target", t >= 0 ? t : NAN},
                          {"snapshots", std::move(snaps)}});
    }
    sets.push_back({{"name", d.name},
                    {"n", d.n},
                    {"d", d.d},
                    {"density", d.density},
                    {"positive_fraction", d.positive},
                    {"lambda", d.lambda},
                    {"f_star", d.f_star},
                    {"f_star_gap_bound", d.gap_bound},
                    {"optimum_iterations", d.optimum_iterations},
                    {"optimum_seconds", d.optimum_seconds},
                    {"steps", d.steps},
                    {"epochs", d.epochs},
                    {"runs", std::move(runs)},
                    {"lock_free",
                     {{"k", lf.k},
                      {"gamma", lf.eta.gamma},
                      {"shift", lf.eta.shift},
                      {"target", lf.target},
                      {"runs", std::move(parallel)}}}});
  }
  json& claims = doc["claims"] = json::array();
  for (const claim& c : r.claims) claims.push_back({{"claim", c.name}, {"held", c.held}, {"evidence", c.evidence}});
  return doc.dump(1) + "\n";
}

[[nodiscard]] inline std::string results_markdown(const experiment_results& r) {
  using detail::sci, detail::fixed;
  const experiment_options& o = r.options;
  std::ostringstream m;
  m << "# Sparsified SGD with memory: results (" << (o.quick ? "quick" : "full") << " run)\n\n";
  m << "Wall time " << fixed(r.seconds, 1) << " s on " << r.hardware_threads
    << " hardware threads, 1-minute load average " << fixed(r.load_before, 2) << " before and "
    << fixed(r.load_after, 2) << " after. Seed " << o.seed << ", gamma = " << o.gamma << ", shift factor "
    << o.shift_factor << ".\n\n";
  m << "| data set | n | d | density | positive | lambda | f* | certified gap of f* | steps (epochs) |\n";
  m << "|---|---|---|---|---|---|---|---|---|\n";
  for (const dataset_results& d : r.datasets)
    m << "| " << d.name << " | " << d.n << " | " << d.d << " | " << sci(d.density) << " | " << fixed(d.positive, 3)
      << " | " << sci(d.lambda) << " | " << fixed(d.f_star, 8) << " | " << sci(d.gap_bound) << " | " << d.steps << " ("
      << d.epochs << ") |\n";
  for (const dataset_results& d : r.datasets) {
    const double sgd = d.find(shifted_schedule, {method_kind::sgd}).final_suboptimality();
    m << "\n## " << d.name << "\n\n";
    m << "Final suboptimality f(x_avg) - f*, schedule eta_t = " << o.gamma
      << " / (lambda (t + a)), a = " << o.shift_factor
      << " d / k (SGD, k = d: a = " << d.find(shifted_schedule, {method_kind::sgd}).eta.shift << "): SGD " << sci(sgd)
      << ".\n\n";
    m << "| k | top-k mem | top-k no-mem | rand-k mem | rand-k no-mem |\n|---|---|---|---|---|\n";
    for (const std::size_t k : o.ks) {
      m << "| " << k;
      for (const method_kind kind : {method_kind::topk, method_kind::randk})
        for (const bool memory : {true, false}) {
          const double v = d.find(shifted_schedule, {kind, k, memory}).final_suboptimality();
          m << " | " << sci(v) << " (" << fixed(v / sgd, 2) << "x SGD)";
        }
      m << " |\n";
    }
    const run_result& base = d.find(decaying_schedule, {method_kind::sgd});
    const double target = 2 * base.final_suboptimality();
    m << "\nSchedule eta_t = " << o.gamma << " / (1 + " << o.gamma << " lambda t); target for bits: " << sci(target)
      << " (2x SGD's final).\n\n";
    m << "| method | final suboptimality | bits sent | bits to target | bits per step |\n|---|---|---|---|---|\n";
    for (const run_result& run : d.runs)
      if (run.schedule == decaying_schedule)
        m << "| " << run.how.label() << " | " << sci(run.final_suboptimality()) << " | " << sci(run.bits()) << " | "
          << sci(run.bits_to(target)) << " | " << fixed(run.bits() / static_cast<double>(d.steps), 0) << " |\n";
    const lock_free_study& lf = d.lock_free;
    m << "\nLock-free Mem-SGD, top-" << lf.k << ", decaying schedule, " << (lf.runs.empty() ? 0 : lf.runs.front().steps)
      << " steps in total, suboptimality of the weighted average of the shared iterate's copies; target "
      << sci(lf.target) << " (the one-thread run's, half way).\n\n";
    m << "| threads | seconds | cores used (CPU s / s) | steps/s | steps per CPU s | time to target (s) | speed-up "
         "| final suboptimality | last iterate |\n|---|---|---|---|---|---|---|---|---|\n";
    const double one = lf.runs.empty() ? -1 : lf.runs.front().time_to(lf.target);
    for (const lock_free_result& run : lf.runs) {
      const double t = run.time_to(lf.target);
      m << "| " << run.threads << " | " << fixed(run.seconds, 2) << " | " << fixed(run.cpu_seconds / run.seconds, 2)
        << " | " << fixed(run.steps_per_second(), 0) << " | "
        << fixed(static_cast<double>(run.steps) / run.cpu_seconds, 0) << " | "
        << (t >= 0 ? fixed(t, 2) : std::string("not reached")) << " | "
        << (t > 0 && one > 0 ? fixed(one / t, 2) + "x" : std::string("-")) << " | "
        << sci(run.snapshots.back().averaged) << " | " << sci(run.snapshots.back().suboptimality) << " |\n";
    }
  }
  m << "\n## Claims\n\n";
  for (const claim& c : r.claims)
    m << "- **" << (c.held ? "held" : "did not hold") << "**: " << c.name << ". " << c.evidence << "\n";
  return m.str();
}

/// The five plots of each data set, as file name and SVG text.
[[nodiscard]] inline std::vector<std::pair<std::string, std::string>> results_plots(const experiment_results& r) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::vector<std::size_t>& ks = r.options.ks;
  const auto curve = [&](const run_result& run, bool by_bits) {
    series s{run.how.label(),
             detail::colour_of(run.how, ks),
             run.how.kind != method_kind::sgd && run.how.kind != method_kind::qsgd && !run.how.memory,
             {}};
    for (const curve_point& p : run.curve)
      s.points.emplace_back(by_bits ? p.bits : static_cast<double>(p.step), p.suboptimality);
    return s;
  };
  for (const dataset_results& d : r.datasets) {
    for (const bool memory : {true, false}) {
      line_plot p{d.name + ": " + (memory ? "with memory (Mem-SGD)" : "without memory") +
                      ", eta = gamma / (lambda (t + d/k))",
                  "iterations",
                  "f(x_avg) - f*",
                  true,
                  {}};
      p.lines.push_back(curve(d.find(shifted_schedule, {method_kind::sgd}), false));
      for (const method_kind kind : {method_kind::topk, method_kind::randk})
        for (const std::size_t k : ks) p.lines.push_back(curve(d.find(shifted_schedule, {kind, k, memory}), false));
      out.emplace_back(d.name + (memory ? "_memory.svg" : "_no_memory.svg"), to_svg(p));
    }
    for (const bool by_bits : {false, true}) {
      line_plot p{d.name + ": Mem-SGD and QSGD, eta = gamma / (1 + gamma lambda t)",
                  by_bits ? "bits sent" : "iterations",
                  "f(x_avg) - f*",
                  true,
                  {}};
      for (const run_result& run : d.runs)
        if (run.schedule == decaying_schedule) p.lines.push_back(curve(run, by_bits));
      out.emplace_back(d.name + (by_bits ? "_qsgd_bits.svg" : "_qsgd_iterations.svg"), to_svg(p));
    }
    static constexpr const char* thread_colours[] = {"#000000", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b"};
    line_plot p{d.name + ": lock-free Mem-SGD top-" + std::to_string(d.lock_free.k) + ", shared iterate",
                "seconds",
                "f(x_avg) - f*",
                false,
                {}};
    for (std::size_t i = 0; i < d.lock_free.runs.size(); ++i) {
      const lock_free_result& run = d.lock_free.runs[i];
      series s{"T = " + std::to_string(run.threads), thread_colours[std::min<std::size_t>(i, 5)], false, {}};
      for (const lock_free_snapshot& q : run.snapshots) s.points.emplace_back(q.seconds, q.averaged);
      p.lines.push_back(std::move(s));
    }
    p.lines.push_back({"target",
                       "#7f7f7f",
                       true,
                       {{0.0, d.lock_free.target},
                        {d.lock_free.runs.empty() ? 1.0 : d.lock_free.runs.front().seconds, d.lock_free.target}}});
    out.emplace_back(d.name + "_lock_free.svg", to_svg(p));
  }
  return out;
}

/// Writes results.json, results.md and the plots into `dir` (created if missing); returns the
/// files written.
inline std::vector<std::filesystem::path> write_results(const experiment_results& r, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  std::vector<std::filesystem::path> files{dir / "results.json", dir / "results.md"};
  detail::write_file(files[0], results_json(r));
  detail::write_file(files[1], results_markdown(r));
  for (const auto& [name, svg] : results_plots(r)) {
    files.push_back(dir / name);
    detail::write_file(files.back(), svg);
  }
  return files;
}

}  // namespace memsgd
