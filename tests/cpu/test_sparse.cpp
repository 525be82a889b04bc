// SPDX-License-Identifier: Apache-2.0
#include <bellows/cpu/sparse.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "../support/random.hpp"

namespace {

using bellows::cpu::sparse_chunk;

std::vector<std::uint32_t> some_indices(std::size_t n, std::size_t every, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint32_t> index;
  for (std::size_t i = 0; i < n; ++i)
    if (rng() % every == 0) index.push_back(static_cast<std::uint32_t>(i));
  return index;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("magnitude_key orders magnitudes, signed zeros and denormals included") {
  using bellows::cpu::magnitude_key;
  const float ladder[] = {0.0f, std::numeric_limits<float>::denorm_min(), 1e-40f,
                          std::numeric_limits<float>::min(), 1.0f, 3.0e38f,
                          std::numeric_limits<float>::max()};
  for (std::size_t i = 0; i + 1 < std::size(ladder); ++i) {
    CHECK(magnitude_key(ladder[i]) < magnitude_key(ladder[i + 1]));
    CHECK(magnitude_key(-ladder[i]) == magnitude_key(ladder[i]));
    CHECK(magnitude_key(ladder[i]) < bellows::cpu::non_finite_key);
  }
  CHECK(magnitude_key(std::numeric_limits<float>::infinity()) == bellows::cpu::non_finite_key);
  CHECK(magnitude_key(-std::numeric_limits<float>::quiet_NaN()) > bellows::cpu::non_finite_key);
}

TEST_CASE("scatter_add: adds each value at its index, 32- and 64-bit indices") {
  const std::size_t n = sparse_chunk * 2 + 1;
  bellows::cpu::executor exec(3);
  const auto index = some_indices(n, 2, 6);
  std::vector<std::uint64_t> wide(index.begin(), index.end());
  const auto value = bellows::testing::normal_floats(index.size(), 7);
  std::vector<float> expected(n, 1.0f);
  for (std::size_t j = 0; j < index.size(); ++j) expected[index[j]] += value[j];
  std::vector<float> acc(n, 1.0f), acc64(n, 1.0f);
  bellows::cpu::scatter_add(exec, acc, std::span<const std::uint32_t>(index), value);
  bellows::cpu::scatter_add(exec, acc64, std::span<const std::uint64_t>(wide), value);
  CHECK(same_bits(acc, expected));
  CHECK(same_bits(acc64, expected));
}
