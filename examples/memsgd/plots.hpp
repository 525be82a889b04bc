// SPDX-License-Identifier: Apache-2.0
// Line plots written as SVG text: a logarithmic y axis, a logarithmic or linear x axis, a grid at
// the decades (or at round values on a linear axis), and a legend to the right. Points with a
// y (or, on a logarithmic axis, an x) that is not positive are left out, since log scales cannot
// show them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace memsgd {

struct series {
  std::string label;
  std::string color;  ///< any SVG colour, e.g. "#1f77b4"
  bool dashed = false;
  std::vector<std::pair<double, double>> points;  ///< (x, y)
};

struct line_plot {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log_x = true;
  std::vector<series> lines;
};

namespace detail {

/// Text with the five characters XML reserves escaped.
[[nodiscard]] inline std::string xml_text(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

/// One axis: maps values to pixels between `from` and `to` and lists its ticks.
struct axis {
  bool log = true;
  double lo = 0, hi = 1;  ///< in decades on a log axis
  double from = 0, to = 1;

  [[nodiscard]] double pixel(double v) const {
    const double u = log ? std::log10(v) : v;
    return from + (u - lo) / (hi - lo) * (to - from);
  }
  /// Tick values: every decade (every second or third when there are many) or, on a linear
  /// axis, a round step giving four to ten ticks.
  [[nodiscard]] std::vector<double> ticks() const {
    std::vector<double> out;
    if (log) {
      const int step = hi - lo > 14 ? 3 : hi - lo > 8 ? 2 : 1;
      for (int e = static_cast<int>(std::ceil(lo)); e <= static_cast<int>(std::floor(hi)); e += step)
        out.push_back(std::pow(10.0, e));
      return out;
    }
    const double span = hi - lo, unit = std::pow(10.0, std::floor(std::log10(span)));
    double step = unit;
    for (const double m : {0.2, 0.5, 1.0, 2.0})
      if (span / (m * unit) <= 10) {
        step = m * unit;
        break;
      }
    for (double v = std::ceil(lo / step) * step; v <= hi + 1e-9 * span; v += step) out.push_back(v);
    return out;
  }
  /// On a log axis of at most two decades: 2 and 5 times each decade, for unlabelled grid lines.
  [[nodiscard]] std::vector<double> minor_ticks() const {
    std::vector<double> out;
    if (!log || hi - lo > 2) return out;
    for (int e = static_cast<int>(std::floor(lo)); e < static_cast<int>(std::ceil(hi)); ++e)
      for (const double m : {2.0, 5.0}) out.push_back(m * std::pow(10.0, e));
    return out;
  }
};

/// The SVG text of a tick label: 10 with a raised exponent on a log axis, else the number.
[[nodiscard]] inline std::string tick_label(double v, bool log) {
  if (log) {
    const auto e = static_cast<int>(std::lround(std::log10(v)));
    return "10<tspan dy=\"-6\" font-size=\"9\">" + std::to_string(e) + "</tspan>";
  }
  std::ostringstream s;
  s << std::setprecision(4) << v;
  return s.str();
}

}  // namespace detail

/// The plot as a complete SVG document.
[[nodiscard]] inline std::string to_svg(const line_plot& plot) {
  constexpr double width = 760, height = 460, left = 70, right = 560, top = 40, bottom = 400;
  const auto shown = [&](const std::pair<double, double>& p) {
    return std::isfinite(p.first) && std::isfinite(p.second) && p.second > 0 && (!plot.log_x || p.first > 0);
  };
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo, y_lo = x_lo, y_hi = -x_lo;
  for (const series& s : plot.lines)
    for (const auto& p : s.points)
      if (shown(p)) {
        const double x = plot.log_x ? std::log10(p.first) : p.first, y = std::log10(p.second);
        x_lo = std::min(x_lo, x);
        x_hi = std::max(x_hi, x);
        y_lo = std::min(y_lo, y);
        y_hi = std::max(y_hi, y);
      }
  if (!(x_lo <= x_hi)) {  // nothing to show: an empty frame
    x_lo = y_lo = 0;
    x_hi = y_hi = 1;
  }
  detail::axis xa{plot.log_x, plot.log_x ? std::floor(x_lo) : std::min(0.0, x_lo), plot.log_x ? std::ceil(x_hi) : x_hi,
                  left, right};
  detail::axis ya{true, std::floor(y_lo), std::ceil(y_hi), bottom, top};
  if (xa.hi <= xa.lo) xa.hi = xa.lo + 1;
  if (ya.hi <= ya.lo) ya.hi = ya.lo + 1;

  std::ostringstream svg;
  svg << std::fixed << std::setprecision(1);
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << width << ' ' << height << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg << "<text x=\"" << (left + right) / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">"
      << detail::xml_text(plot.title) << "</text>\n";
  for (const double v : xa.ticks()) {
    const double px = xa.pixel(v);
    svg << "<line x1=\"" << px << "\" y1=\"" << top << "\" x2=\"" << px << "\" y2=\"" << bottom
        << "\" stroke=\"#dddddd\"/>\n";
    svg << "<text x=\"" << px << "\" y=\"" << bottom + 18 << "\" text-anchor=\"middle\">"
        << detail::tick_label(v, xa.log) << "</text>\n";
  }
  for (const double v : xa.minor_ticks())
    svg << "<line x1=\"" << xa.pixel(v) << "\" y1=\"" << top << "\" x2=\"" << xa.pixel(v) << "\" y2=\"" << bottom
        << "\" stroke=\"#f0f0f0\"/>\n";
  for (const double v : ya.minor_ticks())
    svg << "<line x1=\"" << left << "\" y1=\"" << ya.pixel(v) << "\" x2=\"" << right << "\" y2=\"" << ya.pixel(v)
        << "\" stroke=\"#f0f0f0\"/>\n";
  for (const double v : ya.ticks()) {
    const double py = ya.pixel(v);
    svg << "<line x1=\"" << left << "\" y1=\"" << py << "\" x2=\"" << right << "\" y2=\"" << py
        << "\" stroke=\"#dddddd\"/>\n";
    svg << "<text x=\"" << left - 6 << "\" y=\"" << py + 4 << "\" text-anchor=\"end\">" << detail::tick_label(v, true)
        << "</text>\n";
  }
  svg << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << right - left << "\" height=\"" << bottom - top
      << "\" fill=\"none\" stroke=\"black\"/>\n";
  svg << "<text x=\"" << (left + right) / 2 << "\" y=\"" << bottom + 42 << "\" text-anchor=\"middle\">"
      << detail::xml_text(plot.x_label) << "</text>\n";
  svg << "<text transform=\"translate(18 " << (top + bottom) / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
      << detail::xml_text(plot.y_label) << "</text>\n";

  double legend_y = top + 8;
  for (const series& s : plot.lines) {
    const std::string dash = s.dashed ? " stroke-dasharray=\"6 4\"" : "";
    svg << "<polyline fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"1.8\"" << dash << " points=\"";
    for (const auto& p : s.points)
      if (shown(p)) svg << xa.pixel(p.first) << ',' << ya.pixel(p.second) << ' ';
    svg << "\"/>\n";
    svg << "<line x1=\"" << right + 14 << "\" y1=\"" << legend_y << "\" x2=\"" << right + 44 << "\" y2=\"" << legend_y
        << "\" stroke=\"" << s.color << "\" stroke-width=\"1.8\"" << dash << "/>\n";
    svg << "<text x=\"" << right + 50 << "\" y=\"" << legend_y + 4 << "\">" << detail::xml_text(s.label) << "</text>\n";
    legend_y += 18;
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace memsgd
