// SPDX-License-Identifier: Apache-2.0
// The plan of rand-k's index draw (cpu/sample.hpp describes the draw) and the uniform integers
// it takes from a Philox stream, the same on every backend.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "bellows/core/config.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/philox.hpp"

namespace bellows {

/// The 128-bit product of two 64-bit numbers, as its high and low halves.
struct wide_product {
  std::uint64_t high = 0, low = 0;
};

BELLOWS_HD constexpr wide_product multiply_wide(std::uint64_t a, std::uint64_t b) noexcept {
  const std::uint64_t a0 = a & 0xFFFFFFFFu, a1 = a >> 32, b0 = b & 0xFFFFFFFFu, b1 = b >> 32;
  const std::uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
  const std::uint64_t middle = (p00 >> 32) + (p01 & 0xFFFFFFFFu) + (p10 & 0xFFFFFFFFu);
  return {p11 + (p01 >> 32) + (p10 >> 32) + (middle >> 32), (middle << 32) | (p00 & 0xFFFFFFFFu)};
}

/// The numbers of one draw of k of n indices (steps 1 and 3 of the draw).
struct sample_plan {
  std::uint64_t n = 0;
  std::uint64_t k = 0;
  std::uint64_t chosen = 0;  ///< j = min(k, n - k)
  bool complement = false;   ///< k > n / 2: the chosen indices are the ones left out
  std::uint64_t batch = 0;   ///< slots of the first round; later rounds take batch - chosen

  friend bool operator==(const sample_plan&, const sample_plan&) = default;
};

/// With D = j^2 / (2n) (the expected repeats among about j proposals) and the target
/// t = j + ceil(4 sqrt(D)) + 16 distinct indices, batch = ceil(2t / (1 + sqrt(1 - 2t / n))), the
/// number m of proposals with m - m^2 / (2n) = t (a lower bound of the expected distinct count),
/// capped at n; at least j + 1.
[[nodiscard]] inline sample_plan plan_sample(std::uint64_t n, std::uint64_t k) {
  BELLOWS_EXPECTS(k <= n, "plan_sample: cannot draw ", k, " of ", n, " indices (k must be <= n)");
  sample_plan p{n, k, std::min(k, n - k), k > n - k, 0};
  if (p.chosen == 0) return p;
  const double nn = static_cast<double>(n), j = static_cast<double>(p.chosen);
  const double target = j + std::ceil(4.0 * std::sqrt(j * j / (2.0 * nn))) + 16.0;
  const double m = 2.0 * target >= nn ? nn : std::ceil(2.0 * target / (1.0 + std::sqrt(1.0 - 2.0 * target / nn)));
  p.batch = std::max(p.chosen + 1, std::min(n, static_cast<std::uint64_t>(m)));
  return p;
}

namespace detail {

/// A uniform integer in [0, bound) from the 64-bit words at `cursor` (advanced past the words
/// used), with the rejection rule of the proposals (cpu/sample.hpp, step 2).
BELLOWS_HD inline std::uint64_t uniform_below(const philox::stream& s, std::uint64_t& cursor,
                                              std::uint64_t bound) noexcept {
  const std::uint64_t reject_below = (0 - bound) % bound;
  for (;;) {
    const std::uint64_t u = s.word(cursor) | std::uint64_t{s.word(cursor + 1)} << 32;
    cursor += 2;
    const wide_product p = multiply_wide(u, bound);
    if (p.low >= reject_below) return p.high;
  }
}

}  // namespace detail

}  // namespace bellows
