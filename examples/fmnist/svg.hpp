// SPDX-License-Identifier: Apache-2.0
// The comparison's plots as hand-written SVG (no plotting library): test accuracy per epoch,
// cumulative floats sent per epoch, and the per-tensor level timeline of the Accordion runs.
// Every run is drawn as the mean over its seeds; colour tells the compressor family, the line
// style the policy (solid Accordion, dashed static low, dotted static high).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "report.hpp"
#include "runs.hpp"

namespace fmnist {

namespace detail {

/// One line of a chart: y per epoch (epochs 1, 2, ...).
struct series {
  std::string label;
  std::string colour;
  std::string dash;  ///< stroke-dasharray, empty for solid
  double width = 2;
  std::vector<double> ys;
};

/// Where a panel lies in the picture and what range of data it shows.
struct panel {
  double left, top, width, height;
  std::size_t first_epoch, last_epoch;  ///< 1-based, inclusive
  double y_min, y_max;
  bool log_y = false;

  [[nodiscard]] double x(double epoch) const {
    const double span = std::max(1.0, static_cast<double>(last_epoch - first_epoch));
    return left + width * (epoch - static_cast<double>(first_epoch)) / span;
  }
  [[nodiscard]] double y(double v) const {
    const double t = log_y ? (std::log10(v) - std::log10(y_min)) / (std::log10(y_max) - std::log10(y_min))
                           : (v - y_min) / (y_max - y_min);
    return top + height * (1 - std::clamp(t, 0.0, 1.0));
  }
};

/// A tick step of 1, 2 or 5 times a power of ten that cuts `range` into about `ticks` parts.
[[nodiscard]] inline double tick_step(double range, int ticks) {
  const double raw = range / ticks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0})
    if (m * power >= raw) return m * power;
  return 10 * power;
}

/// A text element; `text` is escaped for XML.
[[nodiscard]] inline std::string svg_text(double x, double y, const std::string& text, const char* anchor = "start",
                                          const char* extra = "") {
  std::string escaped;
  for (const char ch : text)
    escaped += ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '&' ? "&amp;" : std::string(1, ch);
  return format("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" %s>%s</text>\n", x, y, anchor, extra, escaped.c_str());
}

[[nodiscard]] inline std::string svg_open(double width, double height, const std::string& title) {
  return format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
                "font-family=\"DejaVu Sans, Arial, sans-serif\" font-size=\"12\">\n"
                "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                width, height, width, height) +
         svg_text(width / 2, 22, title, "middle", "font-size=\"15\" font-weight=\"bold\"");
}

/// Axes, grid, tick labels and learning-rate decay markers of a panel.
[[nodiscard]] inline std::string svg_axes(const panel& p, const std::string& y_label,
                                          std::span<const std::size_t> decays, bool percent) {
  std::string s;
  // y grid and labels
  if (p.log_y) {
    for (double v = std::pow(10.0, std::ceil(std::log10(p.y_min))); v <= p.y_max * 1.0001; v *= 10) {
      s += format("<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>\n", p.left,
                  p.left + p.width, p.y(v), p.y(v));
      s += svg_text(p.left - 6, p.y(v) + 4, format("1e%.0f", std::log10(v)), "end");
    }
  } else {
    const double step = tick_step(p.y_max - p.y_min, 6);
    for (double v = std::ceil(p.y_min / step) * step; v <= p.y_max + step * 1e-6; v += step) {
      s += format("<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>\n", p.left,
                  p.left + p.width, p.y(v), p.y(v));
      s += svg_text(p.left - 6, p.y(v) + 4, percent ? format("%g%%", std::round(v * 1000) / 10) : format("%g", v),
                    "end");
    }
  }
  // x ticks: every epoch when they fit, else a round step
  const std::size_t n = p.last_epoch - p.first_epoch + 1;
  const std::size_t every = n <= 20 ? 1 : static_cast<std::size_t>(tick_step(static_cast<double>(n), 10));
  for (std::size_t e = p.first_epoch; e <= p.last_epoch; ++e) {
    if (e % every != 0 && e != p.first_epoch) continue;
    s += format("<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#444\"/>\n",
                p.x(static_cast<double>(e)), p.x(static_cast<double>(e)), p.top + p.height, p.top + p.height + 4);
    s += svg_text(p.x(static_cast<double>(e)), p.top + p.height + 17, std::to_string(e), "middle");
  }
  // decays happen between epoch m and m + 1 (1-based), at the boundary that starts epoch index m
  for (const std::size_t m : decays) {
    const double x = p.x(static_cast<double>(m) + 0.5);
    if (m < p.first_epoch || m >= p.last_epoch) continue;
    s += format("<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#999\" stroke-dasharray=\"4 3\"/>\n", x,
                x, p.top, p.top + p.height);
    s += svg_text(x + 3, p.top + 12, "lr decay", "start", "fill=\"#777\" font-size=\"10\"");
  }
  s += format("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#444\"/>\n", p.left,
              p.top, p.width, p.height);
  s += svg_text(p.left + p.width / 2, p.top + p.height + 34, "epoch", "middle");
  s += format("<text transform=\"translate(%.1f %.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n", p.left - 52,
              p.top + p.height / 2, y_label.c_str());
  return s;
}

[[nodiscard]] inline std::string svg_lines(const panel& p, std::span<const series> lines) {
  std::string s;
  for (const series& l : lines) {
    std::string points;
    for (std::size_t e = p.first_epoch; e <= p.last_epoch && e <= l.ys.size(); ++e)
      points += format("%.1f,%.1f ", p.x(static_cast<double>(e)), p.y(l.ys[e - 1]));
    s += format("<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\"%s/>\n", points.c_str(),
                l.colour.c_str(), l.width,
                l.dash.empty() ? "" : format(" stroke-dasharray=\"%s\"", l.dash.c_str()).c_str());
  }
  return s;
}

[[nodiscard]] inline std::string svg_legend(double left, double top, std::span<const series> lines) {
  std::string s;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const double y = top + 18.0 * static_cast<double>(i);
    s += format("<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"%.1f\"%s/>\n", left,
                left + 30, y, y, lines[i].colour.c_str(), lines[i].width,
                lines[i].dash.empty() ? "" : format(" stroke-dasharray=\"%s\"", lines[i].dash.c_str()).c_str());
    s += svg_text(left + 36, y + 4, lines[i].label);
  }
  return s;
}

/// One colour per family, and per PowerSGD pair of levels.
[[nodiscard]] inline const char* run_colour(const run_spec& r) {
  if (r.how == method::uncompressed) return "#222222";
  if (r.how == method::topk) return "#d2452b";
  if (r.how == method::qsgd) return "#e69f00";
  if (r.how == method::signsgd) return "#56b4e9";
  const char* powersgd[] = {"#1f6fb4", "#6a3d9a", "#1b9e77", "#8c564b"};
  return powersgd[r.pair % 4];
}

/// One series per run: `value(epoch report)` averaged over the run's seeds.
template <class Value>
[[nodiscard]] std::vector<series> mean_series(const comparison_config& config, std::span<const run_result> results,
                                              Value value) {
  std::vector<series> lines;
  for (const run_spec& spec : config.runs) {
    series l{config.label(spec), run_colour(spec), "", 2.5, std::vector<double>(config.train.epochs, 0.0)};
    if (spec.how != method::uncompressed && spec.when == policy::static_low) {
      l.dash = "7 4";
      l.width = 2;
    } else if (spec.how != method::uncompressed && spec.when == policy::static_high) {
      l.dash = "2 3";
      l.width = 2;
    }
    std::size_t seeds = 0;
    for (const run_result& run : results) {
      if (!(run.spec == spec)) continue;
      ++seeds;
      for (std::size_t e = 0; e < run.epochs.size() && e < l.ys.size(); ++e) l.ys[e] += value(run.epochs[e].report);
    }
    for (double& y : l.ys) y /= static_cast<double>(std::max<std::size_t>(seeds, 1));
    lines.push_back(std::move(l));
  }
  return lines;
}

/// [lo, hi] of the series over epochs [first, last] (1-based), padded by a twentieth of the range
/// and cut to [0, 1].
[[nodiscard]] inline std::pair<double, double> accuracy_range(std::span<const series> lines, std::size_t first,
                                                              std::size_t last) {
  double lo = 1, hi = 0;
  for (const series& l : lines)
    for (std::size_t e = first; e <= last && e <= l.ys.size(); ++e) {
      lo = std::min(lo, l.ys[e - 1]);
      hi = std::max(hi, l.ys[e - 1]);
    }
  const double pad = std::max(0.002, (hi - lo) / 20);
  return {std::max(0.0, lo - pad), std::min(1.0, hi + pad)};
}

}  // namespace detail

/// accuracy.svg: test accuracy per epoch, all epochs on the left, the epochs from the first
/// learning-rate decay on (or the second half) zoomed on the right.
[[nodiscard]] inline std::string accuracy_svg(const comparison_config& config, std::span<const run_result> results) {
  using namespace detail;
  const std::vector<series> lines = mean_series(config, results, [](const epoch_report& r) { return r.test_accuracy; });
  const std::size_t epochs = config.train.epochs;
  const std::vector<std::size_t>& decays = config.train.schedule.milestones;
  const std::size_t zoom_from = std::clamp<std::size_t>(decays.empty() ? epochs / 2 + 1 : decays.front() + 1, 1,
                                                        std::max<std::size_t>(epochs - 1, 1));
  std::string s = svg_open(1100, 440, "Test accuracy per epoch (mean over seeds)");
  const auto [lo, hi] = accuracy_range(lines, 1, epochs);
  const panel all{80, 50, 380, 320, 1, epochs, lo, hi};
  s += svg_axes(all, "test accuracy", decays, true) + svg_lines(all, lines);
  s += svg_text(all.left + all.width / 2, 44, "all epochs", "middle", "font-weight=\"bold\"");
  if (epochs >= 2) {
    const auto [zlo, zhi] = accuracy_range(lines, zoom_from, epochs);
    const panel zoom{550, 50, 250, 320, zoom_from, epochs, zlo, zhi};
    s += svg_axes(zoom, "", decays, true) + svg_lines(zoom, lines);
    s += svg_text(zoom.left + zoom.width / 2, 44, format("zoom: epochs %zu-%zu", zoom_from, epochs), "middle",
                  "font-weight=\"bold\"");
  }
  return s + svg_legend(825, 70, lines) + "</svg>\n";
}

/// floats.svg: floats one worker has sent since the start, per epoch, log scale.
[[nodiscard]] inline std::string floats_svg(const comparison_config& config, std::span<const run_result> results) {
  using namespace detail;
  const std::vector<series> lines =
      mean_series(config, results, [](const epoch_report& r) { return static_cast<double>(r.sent.elements); });
  double lo = 1e300, hi = 1;
  for (const series& l : lines)
    for (const double v : l.ys)
      if (v > 0) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
  lo = std::pow(10.0, std::floor(std::log10(std::min(lo, hi))));
  hi = std::pow(10.0, std::ceil(std::log10(hi)));
  if (hi <= lo) hi = lo * 10;
  const panel p{90, 50, 560, 320, 1, config.train.epochs, lo, hi, true};
  std::string s = svg_open(1000, 440, "Floats sent per worker since the start (mean over seeds)");
  s += svg_axes(p, "floats sent (log scale)", config.train.schedule.milestones, false) + svg_lines(p, lines);
  return s + svg_legend(690, 70, lines) + "</svg>\n";
}

/// levels.svg: the level of every tensor in every epoch of the Accordion runs, a row per tensor
/// and seed.
[[nodiscard]] inline std::string levels_svg(const comparison_config& config, std::span<const run_result> results) {
  using namespace detail;
  const std::size_t epochs = config.train.epochs;
  const double cell = std::clamp(640.0 / static_cast<double>(epochs), 6.0, 28.0), row = 16, left = 170;
  std::vector<const run_result*> runs;
  for (const run_result& r : results)
    if (r.spec.when == policy::accordion && r.spec.how != method::uncompressed) runs.push_back(&r);
  std::size_t rows = 0;
  for (const run_result* r : runs) rows += r->layers.size();
  const double width = std::max(left + cell * static_cast<double>(epochs) + 40, 720.0);
  const double height = 130 + row * static_cast<double>(rows) + 30 * static_cast<double>(runs.size());
  std::string s = svg_open(width, height, "Level of each tensor per epoch (Accordion runs)");
  const char* colours[] = {"#e8862a", "#3a7fc1", "#d6d9dc"};  // low, high, dense
  const char* names[] = {"low level (critical)", "high level", "uncompressed"};
  for (int k = 0; k < 3; ++k) {
    s += format("<rect x=\"%.1f\" y=\"36\" width=\"14\" height=\"12\" fill=\"%s\"/>\n", 20 + 180.0 * k, colours[k]);
    s += svg_text(20 + 180.0 * k + 19, 46, names[k]);
  }
  double y = 70;
  for (const run_result* r : runs) {
    s += svg_text(8, y + 12,
                  format("%s, seed %llu", config.label(r->spec).c_str(), static_cast<unsigned long long>(r->seed)),
                  "start", "font-weight=\"bold\"");
    y += 22;
    for (std::size_t id = 0; id < r->layers.size(); ++id, y += row) {
      s += svg_text(left - 8, y + 12, r->layers[id].name, "end");
      for (std::size_t e = 0; e < r->epochs.size(); ++e)
        s += format("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n",
                    left + cell * static_cast<double>(e) + 0.5, y + 1, cell - 1, row - 2,
                    colours[static_cast<int>(r->epochs[e].levels[id])]);
    }
    y += 8;
  }
  // epoch numbers, check ticks (a check ends epoch e with e % interval == 0) and decays
  for (std::size_t e = 0; e < epochs; ++e) {
    const double x = left + cell * (static_cast<double>(e) + 0.5);
    if (epochs <= 30 || (e + 1) % 5 == 0) s += svg_text(x, y + 14, std::to_string(e + 1), "middle", "font-size=\"10\"");
    if (e % config.accordion.interval == 0)
      s += format("<path d=\"M%.1f %.1f l-4 7 h8 z\" fill=\"#555\"/>\n", x, y + 18);
  }
  for (const std::size_t m : config.train.schedule.milestones)
    if (m > 0 && m < epochs) {
      const double x = left + cell * static_cast<double>(m);
      s += format("<line x1=\"%.1f\" x2=\"%.1f\" y1=\"64\" y2=\"%.1f\" stroke=\"#333\" stroke-width=\"1.5\" "
                  "stroke-dasharray=\"3 2\"/>\n",
                  x, x, y);
    }
  s += svg_text(20, y + 44, "epoch (triangle: a check ends the epoch; dashed line: learning-rate decay)", "start",
                "fill=\"#555\"");
  return s + "</svg>\n";
}

/// Writes accuracy.svg, floats.svg and levels.svg into `dir`.
inline void write_plots(const std::filesystem::path& dir, const comparison_config& config,
                        std::span<const run_result> results) {
  detail::write_text(dir / "accuracy.svg", accuracy_svg(config, results));
  detail::write_text(dir / "floats.svg", floats_svg(config, results));
  detail::write_text(dir / "levels.svg", levels_svg(config, results));
}

}  // namespace fmnist
