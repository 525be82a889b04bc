// SPDX-License-Identifier: Apache-2.0
// The plan of a top-k selection (cpu/select.hpp describes the algorithm): how many elements are
// sampled, where the thresholds sit and how many candidates the workspace holds. Every backend
// computes the same plan from (n, k, max_count).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "bellows/core/error.hpp"

namespace bellows {

/// A threshold key above every magnitude key (NaN included): "no upper threshold".
inline constexpr std::uint32_t above_all_keys = 0x80000000u;

/// How a selection of k of n elements proceeds; the same numbers on every backend.
struct select_plan {
  std::size_t n = 0;
  std::size_t k = 0;
  std::size_t max_count = 0;   ///< k in exact mode; the largest count approximate mode may keep
  std::size_t sample = 0;      ///< elements sampled for the thresholds (0: exact histograms only)
  std::size_t lower_rank = 0;  ///< t_lo is the lower_rank-th largest sampled magnitude
  std::size_t upper_rank = 0;  ///< t_hi is the upper_rank-th largest sampled magnitude (0: none)
  std::size_t capacity = 0;    ///< candidates the workspace holds (fewer only cost time)

  friend bool operator==(const select_plan&, const select_plan&) = default;
};

/// The plan for keeping k (exact) or k to max_count (approximate) of n elements. The sample has
/// n / 1024 elements, at least 2048 and at most 16384 (all of them for small n). Its expected
/// count of elements among the top k is h = k * sample / n, with standard deviation
/// sd = sqrt(h (1 - k / n)); t_lo sits at rank ceil(h + z sd) + 1 (z = 3 exact, 2 approximate;
/// a sample that misleads costs the histogram passes: for independent data about 1 step in 700)
/// and, when k > n / 8, t_hi at rank floor(h - z sd) - 1. The workspace holds twice the
/// expected candidates plus 1024.
[[nodiscard]] inline select_plan plan_select(std::size_t n, std::size_t k, std::size_t max_count) {
  BELLOWS_EXPECTS((k >= 1 || n == 0) && k <= max_count && max_count <= n, "plan_select: keeping ", k, " to ", max_count,
                  " of ", n, " elements");
  select_plan p{n, k, max_count, 0, 0, 0, 0};
  if (k == n) return p;
  p.sample = std::min(n, std::clamp<std::size_t>(n / 1024, 2048, 16384));
  if (p.sample < n) p.sample -= p.sample % 4;  // whole runs of four
  const double fraction = static_cast<double>(k) / static_cast<double>(n);
  const double hits = fraction * static_cast<double>(p.sample);
  const double spread = (max_count > k ? 2.0 : 3.0) * std::sqrt(hits * (1.0 - fraction));
  p.lower_rank = std::min(p.sample, static_cast<std::size_t>(std::ceil(hits + spread)) + 1);
  if (k > n / 8) {
    const double upper = std::floor(hits - spread) - 1.0;
    p.upper_rank = upper >= 1.0 ? static_cast<std::size_t>(upper) : 0;
  }
  const double band =
      static_cast<double>(p.lower_rank - p.upper_rank) * static_cast<double>(n) / static_cast<double>(p.sample);
  p.capacity = std::min(n, 2 * static_cast<std::size_t>(std::ceil(band)) + 1024);
  return p;
}

}  // namespace bellows
