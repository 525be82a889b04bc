// SPDX-License-Identifier: Apache-2.0
// The index list of top-k's cyclic leader (docs/spec.md#top-k-leader), as floats that an
// allreduce_sum carries unchanged: the leader writes its list, every other rank zeros, and a sum
// of one value and zeros is that value, in any order and on any collective. Every backend lays
// it out and reads it so.
//
// The list of a layer of n elements whose payloads hold at most `most` entries, in floats:
//   [0]                      the verdict: each rank adds 1.0f when its input is not finite
//   [1, 1 + w)               the count of the leader's entries
//   [1 + w (j + 1), ...)     entry j's index, for j < most (zeros past the count)
// A whole number v below 2^24 is one float, exactly; a layer of 2^24 elements or more takes
// w = 2 words for each, v >> 24 and then v & (2^24 - 1).
#pragma once

#include <cstddef>
#include <cstdint>

#include "bellows/core/config.hpp"

namespace bellows {

/// The largest whole number a float holds with every smaller one: 2^24.
inline constexpr std::uint64_t index_word_limit = std::uint64_t{1} << 24;

/// Where the parts of a layer's index list lie.
struct index_list_layout {
  std::size_t words = 1;  ///< floats per whole number: 1 below 2^24 elements, else 2
  std::size_t most = 0;   ///< the entries the list has room for

  BELLOWS_HD constexpr index_list_layout(std::uint64_t n, std::size_t most_entries) noexcept
      : words(n >= index_word_limit ? 2 : 1), most(most_entries) {}

  /// The list's floats.
  [[nodiscard]] BELLOWS_HD constexpr std::size_t floats() const noexcept { return 1 + words * (most + 1); }
  /// The first float of the count.
  [[nodiscard]] BELLOWS_HD constexpr std::size_t count_at() const noexcept { return 1; }
  /// The first float of entry j's index.
  [[nodiscard]] BELLOWS_HD constexpr std::size_t entry_at(std::size_t j) const noexcept { return 1 + words * (j + 1); }

  /// Writes v (below 2^48) at `at` in `words` floats.
  BELLOWS_HD constexpr void put(float* at, std::uint64_t v) const noexcept {
    if (words == 2) *at++ = static_cast<float>(v >> 24);
    *at = static_cast<float>(v & (index_word_limit - 1));
  }
  /// Reads the whole number at `at` into v; false when a float there is not a whole number
  /// below 2^24 (NaN included), which no sum of one list and zeros gives.
  [[nodiscard]] BELLOWS_HD constexpr bool get(const float* at, std::uint64_t& v) const noexcept {
    v = 0;
    for (std::size_t i = 0; i < words; ++i) {
      const float x = at[i];
      if (!(x >= 0.0f && x < static_cast<float>(index_word_limit))) return false;
      const auto whole = static_cast<std::uint32_t>(x);
      if (static_cast<float>(whole) != x) return false;
      v = (v << 24) | whole;
    }
    return true;
  }
};

/// What the steps after a list's check read, in the backend's memory: `skip`, a float that is
/// not 0 when the step is not finite (on the device also when the list is malformed), and the
/// leader's count.
template <class Count>
struct index_list_words {
  const float* skip = nullptr;
  const Count* count = nullptr;
};

}  // namespace bellows
