// SPDX-License-Identifier: Apache-2.0
#include <bellows/cpu/sparse.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "../support/bits.hpp"
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

using bellows::testing::same_bits;

}  // namespace

TEST_CASE("magnitude_key orders magnitudes, signed zeros and denormals included") {
  using bellows::magnitude_key;
  const float ladder[] = {
      0.0f,    std::numeric_limits<float>::denorm_min(), 1e-40f, std::numeric_limits<float>::min(), 1.0f,
      3.0e38f, std::numeric_limits<float>::max()};
  for (std::size_t i = 0; i + 1 < std::size(ladder); ++i) {
    CHECK(magnitude_key(ladder[i]) < magnitude_key(ladder[i + 1]));
    CHECK(magnitude_key(-ladder[i]) == magnitude_key(ladder[i]));
    CHECK(magnitude_key(ladder[i]) < bellows::non_finite_key);
  }
  CHECK(magnitude_key(std::numeric_limits<float>::infinity()) == bellows::non_finite_key);
  CHECK(magnitude_key(-std::numeric_limits<float>::quiet_NaN()) > bellows::non_finite_key);
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
  // gated by a verdict: nothing added when it is not 0, the same sums when it is
  const float raised = 1.0f, clear = 0.0f;
  std::vector<float> gated(n, 1.0f);
  bellows::cpu::scatter_add(exec, gated, std::span<const std::uint32_t>(index), value, &raised);
  CHECK(same_bits(gated, std::vector<float>(n, 1.0f)));
  bellows::cpu::scatter_add(exec, gated, std::span<const std::uint32_t>(index), value, &clear);
  CHECK(same_bits(gated, expected));
}

namespace {

/// The average as the codecs computed it before scatter_average: zeros, each part added in
/// order, then every element divided by W (x / 1 is x, so W = 1 skips the division).
template <class Index>
std::vector<float> average_by_passes(std::size_t n, const std::vector<std::vector<Index>>& index,
                                     const std::vector<std::vector<float>>& value) {
  std::vector<float> out(n, 0.0f);
  for (std::size_t r = 0; r < index.size(); ++r)
    for (std::size_t j = 0; j < index[r].size(); ++j) out[static_cast<std::size_t>(index[r][j])] += value[r][j];
  if (index.size() != 1)
    for (float& x : out) x /= static_cast<float>(index.size());
  return out;
}

template <class Index>
void check_scatter_average(std::size_t n, const std::vector<std::vector<Index>>& index,
                           const std::vector<std::vector<float>>& value) {
  const std::vector<float> want = average_by_passes(n, index, value);
  std::vector<bellows::cpu::sparse_view<Index>> parts;
  for (std::size_t r = 0; r < index.size(); ++r) parts.push_back({index[r], value[r]});
  std::vector<std::size_t> cursors(bellows::cpu::scatter_average_cursors(parts.size(), n));
  bellows::cpu::executor one(1), three(3);
  // Aligned, and one float off; garbage in the output before the call.
  std::vector<float> storage(n + 1, 7.0f), again(n + 1, -3.0f);
  const std::span<float> aligned(storage.data(), n), shifted(again.data() + 1, n);
  bellows::cpu::scatter_average(one, aligned, std::span<const bellows::cpu::sparse_view<Index>>(parts),
                                std::span(cursors));
  bellows::cpu::scatter_average(three, shifted, std::span<const bellows::cpu::sparse_view<Index>>(parts),
                                std::span(cursors));
  CHECK(same_bits(aligned, want));
  CHECK(same_bits(shifted, want));
  CHECK(storage[n] == 7.0f);
  CHECK(again[0] == -3.0f);
}

}  // namespace

TEST_CASE("scatter_average: the bits of zeros, rank-order scatter_adds and a division, in one write") {
  using bellows::cpu::average_chunk;
  using bellows::cpu::average_tile;
  // Sizes around a tile and a task, and one of many tasks.
  for (std::size_t n :
       {std::size_t{1}, average_tile - 1, average_tile + 1, 2 * average_chunk + 3, (std::size_t{1} << 20) + 5}) {
    for (std::size_t w : {1u, 2u, 3u, 8u}) {
      CAPTURE(n);
      CAPTURE(w);
      std::vector<std::vector<std::uint32_t>> index;
      std::vector<std::vector<float>> value;
      for (std::size_t r = 0; r < w; ++r) {
        // Every element, every other, one in a hundred, none: overlapping sets of other densities.
        const std::size_t every[] = {1, 2, 100, n + 1};
        index.push_back(some_indices(n, every[r % 4], 40 + r));
        value.push_back(bellows::testing::normal_floats(index.back().size(), 50 + r));
        if (!value.back().empty()) value.back().front() = -0.0f;
      }
      check_scatter_average(n, index, value);
      // The same indices on every rank, values that cancel: sums of exactly zero.
      for (std::size_t r = 1; r < w; ++r) {
        index[r] = index[0];
        value[r] = value[0];
        if (r % 2 == 1)
          for (float& x : value[r]) x = -x;
      }
      check_scatter_average(n, index, value);
      std::vector<std::vector<std::uint64_t>> wide;
      for (const auto& i : index) wide.emplace_back(i.begin(), i.end());
      check_scatter_average(n, wide, value);
    }
  }
  check_scatter_average<std::uint32_t>(0, {{}}, {{}});
}

TEST_CASE("scatter_average refuses no part, too few cursors, or indices and values of other lengths") {
  bellows::cpu::executor one(1);
  std::vector<float> out(10);
  const std::uint32_t index[] = {1, 2};
  const float value[] = {1.0f, 2.0f};
  const bellows::cpu::sparse_view<std::uint32_t> good{index, value}, bad{index, std::span(value, 1)};
  std::vector<std::size_t> cursors(bellows::cpu::scatter_average_cursors(2, out.size()));
  const bellows::cpu::sparse_view<std::uint32_t> two[] = {good, good}, mixed[] = {good, bad};
  CHECK_THROWS_AS(bellows::cpu::scatter_average(one, std::span<float>(out),
                                                std::span<const bellows::cpu::sparse_view<std::uint32_t>>(),
                                                std::span(cursors)),
                  bellows::error);
  CHECK_THROWS_AS(bellows::cpu::scatter_average(one, std::span<float>(out),
                                                std::span<const bellows::cpu::sparse_view<std::uint32_t>>(two),
                                                std::span(cursors).first(1)),
                  bellows::error);
  CHECK_THROWS_AS(bellows::cpu::scatter_average(one, std::span<float>(out),
                                                std::span<const bellows::cpu::sparse_view<std::uint32_t>>(mixed),
                                                std::span(cursors)),
                  bellows::error);
  bellows::cpu::scatter_average(one, std::span<float>(out),
                                std::span<const bellows::cpu::sparse_view<std::uint32_t>>(two), std::span(cursors));
  CHECK(out[1] == 1.0f);
  CHECK(out[2] == 2.0f);
  CHECK(out[0] == 0.0f);
}
