// SPDX-License-Identifier: Apache-2.0
// Seeded test data shared by the test files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace bellows::testing {

/// n standard normal floats from a seeded generator.
inline std::vector<float> normal_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

}  // namespace bellows::testing
