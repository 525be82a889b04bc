// SPDX-License-Identifier: Apache-2.0
// What bellows-bench prints: a table for people, or JSON for programs, from the same figures.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "bellows-bench/input.hpp"
#include "bellows-bench/measure.hpp"
#include "bellows-bench/metrics.hpp"

namespace bellows::tool {

/// One measured method with its reported parameters.
struct method_report {
  std::string name;
  nlohmann::ordered_json params;
  method_result result;
  std::string out_path;  ///< where its result was written, if anywhere
};

/// A whole run.
struct run_report {
  const gradient_set* input = nullptr;
  run_settings settings;
  std::string backend = "cpu";
  unsigned threads = 1;
  std::uint64_t seed = 0;
  std::vector<method_report> methods;
};

/// The figures of one method that both outputs show.
struct figures {
  double bytes_per_step = 0;     ///< one rank's bytes handed to the collective, mean over steps
  double compression_ratio = 0;  ///< dense bytes (4 n) / bytes_per_step
  double rel_error = 0;          ///< mean over the measured steps
  double cosine = 0;             ///< mean over the measured steps
  double seconds_per_call = 0;   ///< median over the timed calls
  double x_floor = 0;            ///< seconds_per_call / floor_seconds
};

[[nodiscard]] inline figures summarize(const method_result& r, std::size_t elements, std::size_t steps) {
  figures f;
  f.bytes_per_step = static_cast<double>(r.sent.bytes) / static_cast<double>(steps);
  f.compression_ratio = static_cast<double>(elements) * sizeof(float) / f.bytes_per_step;
  for (std::size_t t = 0; t < r.rel_error.size(); ++t) {
    f.rel_error += r.rel_error[t] / static_cast<double>(r.rel_error.size());
    f.cosine += r.cosine[t] / static_cast<double>(r.cosine.size());
  }
  f.seconds_per_call = median(r.call_seconds);
  f.x_floor = f.seconds_per_call / r.floor_seconds;
  return f;
}

/// The JSON document of --json: every figure of the table, plus per-step values and the input.
[[nodiscard]] inline nlohmann::ordered_json to_json(const run_report& run) {
  using json = nlohmann::ordered_json;
  const gradient_set& in = *run.input;
  json shape = json::array();
  for (std::size_t i = 0; i < in.shape.rank(); ++i) shape.push_back(in.shape[i]);
  json sources = json::array();
  for (std::size_t i = 0; i < in.size(); ++i) sources.push_back({{"source", in.sources[i]}, {"dtype", in.dtypes[i]}});
  json doc = {
      {"tool", "bellows-bench"},
      {"input",
       {{"gradients", sources},
        {"shape", shape},
        {"elements", in.shape.size()},
        {"bytes", in.shape.size() * sizeof(float)}}},
      {"config",
       {{"steps", run.settings.steps},
        {"workers", run.settings.workers},
        {"own_gradients", run.settings.own},
        {"repeats", run.settings.repeats},
        {"backend", run.backend},
        {"threads", run.threads},
        {"seed", run.seed}}},
      {"methods", json::array()},
  };
  for (const method_report& m : run.methods) {
    const method_result& r = m.result;
    const figures f = summarize(r, in.shape.size(), run.settings.steps);
    json entry = {
        {"name", m.name},
        {"params", m.params},
        {"bytes_sent", f.bytes_per_step},
        {"compression_ratio", f.compression_ratio},
        {"values_sent", static_cast<double>(r.sent.elements) / static_cast<double>(run.settings.steps)},
        {"kept", static_cast<double>(r.sent.kept) / static_cast<double>(run.settings.steps)},
        {"rel_error", f.rel_error},
        {"cosine", f.cosine},
        {"cumulative_rel_error", r.cumulative_rel_error},
        {"seconds_per_call", f.seconds_per_call},
        {"floor_seconds", r.floor_seconds},
        {"x_floor", f.x_floor},
        {"timed_calls", r.call_seconds.size()},
        {"non_finite_steps", r.non_finite_steps},
        {"compressed", r.compressed},
        {"rel_error_per_step", r.rel_error},
        {"cosine_per_step", r.cosine},
    };
    if (!m.out_path.empty()) entry["out"] = m.out_path;
    doc["methods"].push_back(std::move(entry));
  }
  return doc;
}

namespace detail {

[[nodiscard]] inline std::string format(const char* spec, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, spec, v);
  return buf;
}

/// Three significant digits without an exponent: 1234 -> "1234", 45.61 -> "45.6", 0.0123 -> "0.0123".
[[nodiscard]] inline std::string significant(double v) {
  return format(v >= 100 ? "%.0f" : v >= 10 ? "%.1f" : v >= 1 ? "%.2f" : "%.3g", v);
}

/// 1234567 -> "1.18 MiB"; below 1 KiB the exact count of bytes.
[[nodiscard]] inline std::string bytes_text(double b) {
  if (b < 1024) return format("%.0f B", b);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  std::size_t u = 0;
  for (b /= 1024; b >= 1024 && u + 1 < std::size(units); ++u) b /= 1024;
  return format(b < 10 ? "%.2f " : b < 100 ? "%.1f " : "%.0f ", b) + units[u];
}

[[nodiscard]] inline std::string params_text(const nlohmann::ordered_json& params) {
  std::string s;
  for (const auto& [key, value] : params.items())
    s += (s.empty() ? "" : " ") + (key == "error_feedback" ? std::string("ef") : key) + "=" +
         (value.is_string() ? value.get<std::string>() : value.dump());
  return s.empty() ? "-" : s;
}

}  // namespace detail

/// The human table: one row per method (parameters as key=value, error_feedback shortened to ef),
/// and lines that say what was measured.
inline void print_table(std::ostream& out, const run_report& run) {
  const gradient_set& in = *run.input;
  const run_settings& s = run.settings;
  out << "input: ";
  if (in.size() > 2 &&
      std::all_of(in.dtypes.begin(), in.dtypes.end(), [&](const auto& d) { return d == in.dtypes[0]; }))
    out << in.sources.front() << " ... " << in.sources.back() << " (" << in.size() << " files, " << in.dtypes[0] << ")";
  else
    for (std::size_t i = 0; i < in.size(); ++i) out << (i ? ", " : "") << in.sources[i] << " (" << in.dtypes[i] << ")";
  out << "; shape " << in.shape.to_string() << ", " << detail::bytes_text(static_cast<double>(in.shape.size()) * 4)
      << " as float32\nrun:   " << s.steps << (s.steps == 1 ? " step, " : " steps, ") << s.workers
      << (s.workers == 1 ? " worker, " : " workers, ") << (s.own ? "each its own gradient, " : "") << run.threads
      << (run.threads == 1 ? " thread, " : " threads, ") << run.backend << "; time: median of "
      << calls_per_method(s) - 1 << " calls after a warm-up\n\n";

  const bool cumulative = s.steps > 1;
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"method", "parameters", "bytes/step", "ratio", "rel err", "cosine"});
  if (cumulative) rows.back().push_back("cum err");
  for (const char* h : {"ms/call", "floor ms", "x_floor"}) rows.back().push_back(h);
  for (const method_report& m : run.methods) {
    const figures f = summarize(m.result, in.shape.size(), s.steps);
    rows.push_back({m.name, detail::params_text(m.params), detail::bytes_text(f.bytes_per_step),
                    detail::format("%.1f", f.compression_ratio), detail::format("%.4f", f.rel_error),
                    detail::format("%.4f", f.cosine)});
    if (cumulative) rows.back().push_back(detail::format("%.4f", m.result.cumulative_rel_error));
    rows.back().push_back(detail::significant(f.seconds_per_call * 1e3));
    rows.back().push_back(detail::significant(m.result.floor_seconds * 1e3));
    rows.back().push_back(detail::significant(f.x_floor));
  }
  std::vector<std::size_t> width(rows.front().size(), 0);
  for (const auto& row : rows)
    for (std::size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  for (const auto& row : rows) {
    for (std::size_t c = 0; c < row.size(); ++c) {
      const std::string pad(width[c] - row[c].size(), ' ');
      // Names and parameters align left, figures right.
      out << (c ? "  " : "") << (c < 2 ? row[c] + pad : pad + row[c]);
    }
    out << '\n';
  }
  out << "\nbytes/step: what one rank hands to the collective per step; ratio: 4 n bytes over that;\n"
         "ef: error feedback; "
         "rel err: ||g - C(g)|| / ||g||, mean over steps";
  if (cumulative) out << "; cum err: ||sum g - sum C(g)|| / ||sum g|| over all steps";
  out << (run.backend == "cuda"
              ? ";\nfloor ms: one device read of the input, timed after the method; "
              : ";\nfloor ms: one single-threaded streaming read of the input, timed before the method; ")
      << "x_floor: ms/call over floor ms\n";
  for (const method_report& m : run.methods)
    if (!m.result.compressed)
      out << "note: " << m.name << " leaves a tensor of this shape uncompressed (its rule for small or 1-D "
          << "tensors) and averages it by allreduce\n";
  for (const method_report& m : run.methods)
    if (m.result.non_finite_steps)
      out << "warning: " << m.name << " returned non_finite in " << m.result.non_finite_steps << " steps\n";
  for (const method_report& m : run.methods)
    if (!m.out_path.empty()) out << m.name << ": result of the last step written to " << m.out_path << '\n';
}

}  // namespace bellows::tool
