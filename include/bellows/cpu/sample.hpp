// SPDX-License-Identifier: Apache-2.0
// Rand-k's index draw: k distinct indices of [0, n), uniform without replacement, in ascending
// order, determined by one Philox stream alone.
//
// The draw (the same on every backend; each step parallelises except the short step 4):
//  1. j = min(k, n - k) indices are chosen; when k > n / 2 the chosen ones are those left out.
//  2. Slot q of the stream proposes one index: for n < 2^32, word q as u, 32 bits; otherwise
//     words 2q (low half) and 2q + 1 (high half) as u, 64 bits. With u * n = high * 2^w + low,
//     the slot yields `high` unless low < 2^w mod n, in which case it yields nothing (Lemire's
//     rejection, so every index is exactly equally likely).
//  3. The set S of distinct indices yielded by slots [0, batch) (plan_sample fixes batch with
//     IEEE arithmetic only, so that |S| >= j almost surely); while |S| < j, the next
//     batch - j slots join. Independent uniform proposals make S, given its size, a uniform
//     random subset of that size.
//  4. |S| - j members of S are dropped, chosen uniformly by Floyd's algorithm over their ranks
//     [0, |S|) in ascending order: for t = |S| - D, ..., |S| - 1, r uniform in [0, t] is dropped
//     unless already dropped, in which case t is. Each r comes from 64-bit words starting at
//     word 2^33 of the stream (words 2^33 + 2c and 2^33 + 2c + 1 for the c-th attempt), with
//     the same rejection rule.
//  5. The result: S without the dropped ranks, ascending; in the complement case, every index
//     not in it.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "bellows/core/config.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/philox.hpp"
#include "bellows/cpu/executor.hpp"

namespace bellows::cpu {

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

/// The numbers of one draw of k of n indices (step 1 and 3 above).
struct sample_plan {
  std::uint64_t n = 0;
  std::uint64_t k = 0;
  std::uint64_t chosen = 0;    ///< j = min(k, n - k)
  bool complement = false;     ///< k > n / 2: the chosen indices are the ones left out
  std::uint64_t batch = 0;     ///< slots of the first round; later rounds take batch - chosen
};

/// With D = j^2 / (2n) (the expected repeats among about j proposals) and the target
/// t = j + ceil(4 sqrt(D)) + 16 distinct indices, batch = ceil(2t / (1 + sqrt(1 - 2t / n))), the
/// number m of proposals with m - m^2 / (2n) = t (a lower bound of the expected distinct count),
/// capped at n; at least j + 1.
[[nodiscard]] inline sample_plan plan_sample(std::uint64_t n, std::uint64_t k) {
  BELLOWS_EXPECTS(k <= n, "plan_sample: ", k, " of ", n, " indices");
  sample_plan p{n, k, std::min(k, n - k), k > n - k, 0};
  if (p.chosen == 0) return p;
  const double nn = static_cast<double>(n), j = static_cast<double>(p.chosen);
  const double target = j + std::ceil(4.0 * std::sqrt(j * j / (2.0 * nn))) + 16.0;
  const double m = 2.0 * target >= nn ? nn : std::ceil(2.0 * target / (1.0 + std::sqrt(1.0 - 2.0 * target / nn)));
  p.batch = std::max(p.chosen + 1, std::min(n, static_cast<std::uint64_t>(m)));
  return p;
}

/// The memory of one layer's draws: a bitmap over the indices and one over the ranks of S.
struct sample_workspace {
  std::vector<std::uint64_t> chosen;
  std::vector<std::uint64_t> dropped;

  sample_workspace() = default;
  explicit sample_workspace(const sample_plan& p) { fit(p); }

  void fit(const sample_plan& p) {
    chosen.resize(p.chosen == 0 ? 0 : (p.n + 63) / 64);
    dropped.resize((p.batch + 63) / 64);
  }
};

namespace detail {

/// A uniform integer in [0, bound) from the 64-bit words at `cursor` (advanced past the words
/// used), rejecting as step 2 does.
inline std::uint64_t uniform_below(const philox::stream& s, std::uint64_t& cursor,
                                   std::uint64_t bound) noexcept {
  const std::uint64_t reject_below = (0 - bound) % bound;
  for (;;) {
    const std::uint64_t u = s.word(cursor) | std::uint64_t{s.word(cursor + 1)} << 32;
    cursor += 2;
    const wide_product p = multiply_wide(u, bound);
    if (p.low >= reject_below) return p.high;
  }
}

/// Adds the indices proposed by slots [first, last) to the bitmap; returns how many were new.
inline std::uint64_t propose(const philox::stream& s, std::uint64_t n, std::uint64_t first,
                             std::uint64_t last, std::uint64_t* bits) noexcept {
  std::uint64_t added = 0;
  auto insert = [&](std::uint64_t index) {
    std::uint64_t& word = bits[index >> 6];
    const std::uint64_t bit = std::uint64_t{1} << (index & 63);
    added += (word & bit) == 0;
    word |= bit;
  };
  if (n <= 0xFFFFFFFFu) {
    const auto n32 = static_cast<std::uint32_t>(n);
    const std::uint32_t reject_below = (0u - n32) % n32;
    std::uint64_t q = first;
    while (q < last) {
      const philox::u32x4 words = s.block(static_cast<std::uint32_t>(q >> 2));
      for (std::uint64_t w = q & 3; w < 4 && q < last; ++w, ++q) {
        const std::uint64_t p = std::uint64_t{words.v[w]} * n32;
        if (static_cast<std::uint32_t>(p) >= reject_below) insert(p >> 32);
      }
    }
  } else {
    const std::uint64_t reject_below = (0 - n) % n;
    for (std::uint64_t q = first; q < last; ++q) {
      const philox::u32x4 words = s.block(static_cast<std::uint32_t>(q >> 1));
      const std::uint32_t* half = words.v + 2 * (q & 1);
      const wide_product p = multiply_wide(half[0] | std::uint64_t{half[1]} << 32, n);
      if (p.low >= reject_below) insert(p.high);
    }
  }
  return added;
}

}  // namespace detail

/// Writes the plan's k indices, ascending, to `out` (see the top of this file). Both bitmaps of
/// the workspace are zero before and after.
template <class Index>
void sample_indices(executor& /*exec*/, const sample_plan& plan, const philox::stream& s,
                    sample_workspace& ws, std::span<Index> out) {
  BELLOWS_EXPECTS(out.size() == plan.k, "sample_indices: room for ", out.size(), " indices, ",
                  plan.k, " drawn");
  BELLOWS_EXPECTS(plan.chosen == 0 || (ws.chosen.size() == (plan.n + 63) / 64 &&
                                       ws.dropped.size() * 64 >= plan.batch),
                  "sample_indices: the workspace does not fit the plan");
  if (plan.chosen == 0) {  // all indices, or none
    for (std::uint64_t i = 0; i < plan.k; ++i) out[i] = static_cast<Index>(i);
    return;
  }
  std::uint64_t* chosen = ws.chosen.data();
  std::uint64_t* dropped = ws.dropped.data();
  // Steps 2 and 3.
  std::uint64_t distinct = detail::propose(s, plan.n, 0, plan.batch, chosen);
  for (std::uint64_t slot = plan.batch; distinct < plan.chosen; slot += plan.batch - plan.chosen)
    distinct += detail::propose(s, plan.n, slot, slot + plan.batch - plan.chosen, chosen);
  // Step 4: ranks to drop.
  std::uint64_t cursor = std::uint64_t{1} << 33;
  for (std::uint64_t t = plan.chosen; t < distinct; ++t) {
    std::uint64_t r = detail::uniform_below(s, cursor, t + 1);
    if ((dropped[r >> 6] >> (r & 63)) & 1u) r = t;
    dropped[r >> 6] |= std::uint64_t{1} << (r & 63);
  }
  // Step 5: walk S in ascending order, by rank.
  std::uint64_t rank = 0, at = 0;
  const std::uint64_t words = (plan.n + 63) / 64;
  for (std::uint64_t w = 0; w < words; ++w) {
    std::uint64_t bits = chosen[w];
    if (bits != 0 || plan.complement) {
      chosen[w] = 0;
      std::uint64_t kept = 0;
      for (std::uint64_t rest = bits; rest != 0; rest &= rest - 1, ++rank)
        if (((dropped[rank >> 6] >> (rank & 63)) & 1u) == 0) kept |= rest & (0 - rest);
      if (plan.complement) {
        kept = ~kept;
        if (w == words - 1 && plan.n % 64 != 0) kept &= (std::uint64_t{1} << (plan.n % 64)) - 1;
      }
      for (; kept != 0; kept &= kept - 1)
        out[at++] = static_cast<Index>(w * 64 + static_cast<unsigned>(std::countr_zero(kept)));
    }
  }
  std::fill(dropped, dropped + (distinct + 63) / 64, 0);
  BELLOWS_EXPECTS(at == plan.k, "sample_indices: drew ", at, " of ", plan.k);
}

}  // namespace bellows::cpu
