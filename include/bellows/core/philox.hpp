// SPDX-License-Identifier: Apache-2.0
// Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
// SC'11), the counter-based generator every random choice in bellows draws from. The same
// functions compile for the host and, under nvcc, for the device, so both backends draw the same
// numbers from the same counters.
#pragma once

#include <cmath>
#include <cstdint>

#include "bellows/core/config.hpp"

namespace bellows::philox {

struct u32x4 {
  std::uint32_t v[4];
};
struct u32x2 {
  std::uint32_t v[2];
};

namespace detail {
inline constexpr std::uint32_t mul0 = 0xD2511F53u;
inline constexpr std::uint32_t mul1 = 0xCD9E8D57u;
inline constexpr std::uint32_t weyl0 = 0x9E3779B9u;
inline constexpr std::uint32_t weyl1 = 0xBB67AE85u;

BELLOWS_HD constexpr u32x4 round(u32x4 c, u32x2 k) noexcept {
  const std::uint64_t p0 = std::uint64_t{mul0} * c.v[0];
  const std::uint64_t p1 = std::uint64_t{mul1} * c.v[2];
  const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
  const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
  return {{hi1 ^ c.v[1] ^ k.v[0], lo1, hi0 ^ c.v[3] ^ k.v[1], lo0}};
}
}  // namespace detail

/// Philox4x32 with ten rounds: four 32-bit counter words and two key words to four output words.
BELLOWS_HD constexpr u32x4 philox4x32_10(u32x4 counter, u32x2 key) noexcept {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      key.v[0] += detail::weyl0;
      key.v[1] += detail::weyl1;
    }
    counter = detail::round(counter, key);
  }
  return counter;
}

/// A uniform float in [0, 1) from the top 24 bits of a word (every value a multiple of 2^-24).
BELLOWS_HD constexpr float to_uniform(std::uint32_t w) noexcept { return static_cast<float>(w >> 8) * 0x1p-24f; }

/// A uniform double in (0, 1] from the top 24 bits of a word; never 0, so its logarithm is finite.
BELLOWS_HD constexpr double to_uniform_nonzero(std::uint32_t w) noexcept {
  return static_cast<double>((w >> 8) + 1u) * 0x1p-24;
}

/// Two standard normal floats from two words by the Box-Muller transform, computed in double
/// and rounded once, so host and device agree except in rare last-bit cases of their libm.
struct normal_pair {
  float first, second;
};
BELLOWS_HD inline normal_pair to_normals(std::uint32_t w0, std::uint32_t w1) noexcept {
  const double radius = std::sqrt(-2.0 * std::log(to_uniform_nonzero(w0)));
  const double angle = 6.283185307179586476925 * to_uniform(w1);
  return {static_cast<float>(radius * std::cos(angle)), static_cast<float>(radius * std::sin(angle))};
}

/// A uniform integer in [0, bound) for bound <= 2^32, by the multiply-high method (bias below
/// bound / 2^32, which no test here can see; callers that need none reject and redraw).
BELLOWS_HD constexpr std::uint32_t to_below(std::uint32_t w, std::uint32_t bound) noexcept {
  return static_cast<std::uint32_t>((std::uint64_t{w} * bound) >> 32);
}

/// The stream of random words of one (seed, step, layer, rank) key. Word i is word i % 4 of
/// the block counter {i / 4, step, layer, rank} under key {seed low, seed high}, so any word is
/// reachable directly and a backend may generate them in any order or in parallel.
/// `rank == shared` marks streams that every rank draws alike. A stream holds 2^34 words.
struct stream {
  static constexpr std::uint32_t shared = 0xFFFFFFFFu;
  static constexpr std::uint64_t max_words = std::uint64_t{1} << 34;

  std::uint64_t seed = 0;
  std::uint32_t step = 0;
  std::uint32_t layer = 0;
  std::uint32_t rank = shared;

  /// Words 4 * b .. 4 * b + 3.
  [[nodiscard]] BELLOWS_HD constexpr u32x4 block(std::uint32_t b) const noexcept {
    return philox4x32_10({{b, step, layer, rank}},
                         {{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}});
  }
  /// Word i (i < max_words).
  [[nodiscard]] BELLOWS_HD constexpr std::uint32_t word(std::uint64_t i) const noexcept {
    return block(static_cast<std::uint32_t>(i >> 2)).v[i & 3];
  }
};

}  // namespace bellows::philox
