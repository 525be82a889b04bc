// SPDX-License-Identifier: Apache-2.0
// Seeded gradient-like data for the sparsification benchmarks, generated once per process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace bellows::bench {

enum class distribution : int {
  normal,        ///< N(0, 1)
  heavy_tailed,  ///< Student's t with 2 degrees of freedom (infinite variance)
};

[[nodiscard]] inline const char* to_string(distribution d) {
  return d == distribution::normal ? "normal" : "heavy";
}

/// n floats of the distribution, the same on every call (cached: large n takes seconds).
inline const std::vector<float>& gradient(std::size_t n, distribution d) {
  static std::map<std::pair<std::size_t, int>, std::vector<float>> cache;
  std::vector<float>& v = cache[{n, static_cast<int>(d)}];
  if (v.size() != n) {
    v.resize(n);
    std::mt19937_64 rng(n * 2 + static_cast<std::uint64_t>(d));
    if (d == distribution::normal) {
      std::normal_distribution<float> normal;
      for (float& x : v) x = normal(rng);
    } else {
      std::student_t_distribution<float> student(2.0f);
      for (float& x : v) x = student(rng);
    }
  }
  return v;
}

/// "2^24" for 16777216.
[[nodiscard]] inline std::string power_of_two(std::size_t n) {
  int p = 0;
  while ((std::size_t{1} << p) < n) ++p;
  return "2^" + std::to_string(p);
}

}  // namespace bellows::bench
