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

TEST_CASE("gather: the kept values, scaled, identically for any thread count") {
  const std::size_t n = 3 * sparse_chunk + 13;
  const auto g = bellows::testing::normal_floats(n, 1);
  for (std::size_t every : {1u, 7u, 100u, 5000u}) {
    const auto index = some_indices(n, every, every);
    std::vector<float> expected(index.size());
    for (std::size_t j = 0; j < index.size(); ++j) expected[j] = 2.5f * g[index[j]];
    for (unsigned threads : {1u, 3u}) {
      bellows::cpu::executor exec(threads);
      std::vector<float> value(index.size());
      CHECK(bellows::cpu::gather(exec, g, {}, {}, std::span<const std::uint32_t>(index), value, 2.5f));
      CHECK(same_bits(value, expected));
    }
  }
}

TEST_CASE("gather with a memory: values of g + e, and staged = g + e with zeros at the kept indices") {
  const std::size_t n = 2 * sparse_chunk + 37;  // a tail shorter than a block of 16
  const auto g = bellows::testing::normal_floats(n, 2);
  const auto e = bellows::testing::normal_floats(n, 3);
  std::vector<float> m(n);
  for (std::size_t i = 0; i < n; ++i) m[i] = g[i] + e[i];
  for (std::size_t every : {1u, 3u, 64u, 100000u}) {
    auto index = some_indices(n, every, every + 1);
    index.push_back(static_cast<std::uint32_t>(n - 1));
    std::sort(index.begin(), index.end());
    index.erase(std::unique(index.begin(), index.end()), index.end());
    std::vector<float> expected_staged = m, expected(index.size());
    for (std::size_t j = 0; j < index.size(); ++j) {
      expected[j] = m[index[j]];
      expected_staged[index[j]] = 0.0f;
    }
    for (unsigned threads : {1u, 2u}) {
      bellows::cpu::executor exec(threads);
      std::vector<float> value(index.size()), staged(n, -1.0f);
      CHECK(bellows::cpu::gather(exec, g, e, staged, std::span<const std::uint32_t>(index), value));
      CHECK(same_bits(value, expected));
      CHECK(same_bits(staged, expected_staged));
    }
  }
}

TEST_CASE("gather: a NaN or Inf anywhere, kept or not, returns false") {
  const std::size_t n = 2 * sparse_chunk + 5;
  const auto index = some_indices(n, 50, 4);
  bellows::cpu::executor exec(2);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    for (std::size_t at : {std::size_t{0}, sparse_chunk + 3, n - 1}) {
      auto g = bellows::testing::normal_floats(n, 5);
      g[at] = bad;
      std::vector<float> value(index.size()), staged(n);
      CHECK_FALSE(bellows::cpu::gather(exec, g, {}, {}, std::span<const std::uint32_t>(index), value));
      const std::vector<float> e(n, 0.25f);
      CHECK_FALSE(bellows::cpu::gather(exec, g, e, staged, std::span<const std::uint32_t>(index), value));
    }
  }
  std::vector<float> g(n, 1.0f), e(n, 0.0f), value(index.size()), staged(n);
  g[9] = e[9] = std::numeric_limits<float>::max();  // finite parts, overflowing sum
  CHECK_FALSE(bellows::cpu::gather(exec, g, e, staged, std::span<const std::uint32_t>(index), value));
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
