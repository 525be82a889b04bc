// SPDX-License-Identifier: Apache-2.0
// How far a compressed result is from the exact one, and the median of timings.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "bellows/core/error.hpp"

namespace bellows::tool {

/// The distortion of an approximation y of x, both summed in double:
///   rel_error = ||x - y|| / ||x||   (0 when both are zero)
///   cosine    = <x, y> / (||x|| ||y||)   (1 when both are zero, 0 when only one is)
struct distortion {
  double rel_error = 0.0;
  double cosine = 1.0;
};

[[nodiscard]] inline distortion compare(std::span<const float> x, std::span<const float> y) {
  BELLOWS_EXPECTS(x.size() == y.size(), "compare: lengths differ, ", x.size(), " and ", y.size());
  double xx = 0, yy = 0, xy = 0, dd = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double a = x[i], b = y[i];
    xx += a * a;
    yy += b * b;
    xy += a * b;
    dd += (a - b) * (a - b);
  }
  distortion d;
  if (xx == 0 && yy == 0) return d;
  d.rel_error = xx == 0 ? HUGE_VAL : std::sqrt(dd / xx);
  d.cosine = xx == 0 || yy == 0 ? 0.0 : xy / std::sqrt(xx * yy);
  return d;
}

/// The median of a non-empty list (the mean of the middle two for an even count).
[[nodiscard]] inline double median(std::vector<double> v) {
  BELLOWS_EXPECTS(!v.empty(), "median of an empty list");
  const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  if (v.size() % 2 == 1) return *mid;
  return (*mid + *std::max_element(v.begin(), mid)) / 2;
}

}  // namespace bellows::tool
