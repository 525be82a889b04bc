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
//  4. D = |S| - j members of S are dropped, chosen uniformly by Floyd's algorithm over their
//     ranks [0, |S|) in ascending order: for t = j, ..., |S| - 1, r uniform in [0, t] is dropped
//     unless already dropped, in which case t is. Each r comes from 64-bit words starting at
//     word 2^33 of the stream (words 2^33 + 2c and 2^33 + 2c + 1 for the c-th attempt), with
//     the same rejection rule.
//  5. The result: S without the dropped ranks, ascending; in the complement case, every index
//     not in it.
// On the CPU, S is a bitmap over [0, n) with a count per chunk of sparse_chunk indices; the
// dropped members are cleared from it, and gather_sample reads it in the same streaming pass
// that gathers the kept values, so the indices are never listed separately.
#pragma once

#include <algorithm>
#include <atomic>
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
#include "bellows/cpu/sparse.hpp"
#include "bellows/plan/sample.hpp"
#include "bellows/plan/sparse.hpp"

namespace bellows::cpu {

/// The memory of one layer's draws: a bitmap over the indices with its count per chunk of
/// sparse_chunk indices, and a bitmap over the ranks of S for step 4.
struct sample_workspace {
  std::vector<std::uint64_t> chosen;
  std::vector<std::uint32_t> per_chunk;
  std::vector<std::uint64_t> first;  ///< per chunk: its first output position (gather_sample)
  std::vector<std::uint64_t> dropped;
  unsigned non_finite = 0;  ///< the word a draw into a payload reports in (sparse_payload.hpp)

  sample_workspace() = default;
  explicit sample_workspace(const sample_plan& p) { fit(p); }

  void fit(const sample_plan& p) {
    const std::size_t chunks = static_cast<std::size_t>((p.n + sparse_chunk - 1) / sparse_chunk);
    chosen.resize(p.chosen == 0 ? 0 : (p.n + 63) / 64);
    per_chunk.resize(p.chosen == 0 ? 0 : chunks);
    first.resize(chunks);
    dropped.resize((p.batch + 63) / 64);
  }
};

namespace detail {

/// Calls f(index) for every index that slots [first, last) propose (step 2), in slot order.
template <class F>
void for_each_proposal(const philox::stream& s, std::uint64_t n, std::uint64_t first, std::uint64_t last,
                       F&& f) noexcept {
  if (n <= 0xFFFFFFFFu) {
    const auto n32 = static_cast<std::uint32_t>(n);
    const std::uint32_t reject_below = (0u - n32) % n32;
    std::uint64_t q = first;
    while (q < last) {
      const philox::u32x4 words = s.block(static_cast<std::uint32_t>(q >> 2));
      for (std::uint64_t w = q & 3; w < 4 && q < last; ++w, ++q) {
        const std::uint64_t p = std::uint64_t{words.v[w]} * n32;
        if (static_cast<std::uint32_t>(p) >= reject_below) f(p >> 32);
      }
    }
  } else {
    const std::uint64_t reject_below = (0 - n) % n;
    for (std::uint64_t q = first; q < last; ++q) {
      const philox::u32x4 words = s.block(static_cast<std::uint32_t>(q >> 1));
      const std::uint32_t* half = words.v + 2 * (q & 1);
      const wide_product p = multiply_wide(half[0] | std::uint64_t{half[1]} << 32, n);
      if (p.low >= reject_below) f(p.high);
    }
  }
}

/// Adds the indices proposed by slots [first, last) to the bitmap and the per-chunk counts;
/// returns how many were new. The bitmap outgrows the caches for large n, so proposals are made
/// a group ahead of their insertion, and the words they will set are prefetched meanwhile.
inline std::uint64_t propose(const philox::stream& s, std::uint64_t n, std::uint64_t first, std::uint64_t last,
                             std::uint64_t* bits, std::uint32_t* per_chunk) noexcept {
  constexpr std::uint64_t group = 256;
  std::uint64_t buffer[2][group];
  std::uint64_t count[2] = {0, 0}, added = 0;
  auto insert = [&](const std::uint64_t* index, std::uint64_t m) {
    for (std::uint64_t j = 0; j < m; ++j) {
      std::uint64_t& word = bits[index[j] >> 6];
      const std::uint64_t bit = std::uint64_t{1} << (index[j] & 63);
      const bool fresh = (word & bit) == 0;
      added += fresh;
      per_chunk[index[j] / sparse_chunk] += fresh;
      word |= bit;
    }
  };
  for (std::uint64_t at = first, g = 0; at < last; at += group, g ^= 1) {
    count[g] = 0;
    for_each_proposal(s, n, at, std::min(last, at + group), [&](std::uint64_t index) {
#if defined(__GNUC__)
      __builtin_prefetch(bits + (index >> 6), 1);
#endif
      buffer[g][count[g]++] = index;
    });
    insert(buffer[g ^ 1], count[g ^ 1]);
    count[g ^ 1] = 0;
  }
  insert(buffer[0], count[0]);
  insert(buffer[1], count[1]);
  return added;
}

/// Clears from the bitmap, and from the per-chunk counts, the members of S whose ranks (in
/// ascending index order) are marked in `dropped` (`ranks` = |S| bits); clears `dropped` too.
inline void drop_ranks(std::uint64_t* bits, std::uint32_t* per_chunk, std::uint64_t* dropped,
                       std::uint64_t ranks) noexcept {
  constexpr std::uint64_t words_per_chunk = sparse_chunk / 64;
  const std::uint64_t dropped_words = (ranks + 63) / 64;
  std::uint64_t dw = 0, marks = dropped_words != 0 ? dropped[0] : 0;
  constexpr std::uint64_t none = ~std::uint64_t{0};
  auto next = [&]() -> std::uint64_t {  // the next dropped rank, ascending
    while (marks == 0) {
      dropped[dw] = 0;
      if (++dw == dropped_words) return none;
      marks = dropped[dw];
    }
    const std::uint64_t r = dw * 64 + static_cast<unsigned>(std::countr_zero(marks));
    marks &= marks - 1;
    return r;
  };
  std::uint64_t base = 0, rank = next();
  for (std::size_t c = 0; rank != none; ++c) {
    const std::uint64_t members = per_chunk[c];
    if (rank >= base + members) {
      base += members;
      continue;
    }
    std::uint32_t removed = 0;
    for (std::uint64_t w = c * words_per_chunk, seen = base; rank < base + members; ++w) {
      const std::uint64_t word = bits[w];  // as it was: ranks count every member
      const auto here = static_cast<std::uint64_t>(std::popcount(word));
      for (; rank < seen + here; rank = next(), ++removed) {
        std::uint64_t rest = word;
        for (std::uint64_t t = seen; t < rank; ++t) rest &= rest - 1;
        bits[w] &= ~(rest & (0 - rest));
      }
      seen += here;
    }
    per_chunk[c] -= removed;
    base += members;
  }
}

}  // namespace detail

namespace detail {

/// gather_sample over the chunk [lo, hi): `bits` (the chunk's words of the drawn set, cleared
/// here; null when nothing was drawn) give the kept elements, complemented or not, written to
/// entries [o, end) of index and value. Returns whether an element of v is non-finite.
/// Kept indices are rare, so a branch per index would mispredict about once per index: blocks
/// of 32 write their first two without branching (a spare entry, overwritten next, when there
/// are fewer; only while two fit before `end`), and a branch takes any further ones.
template <bool Compensate, class Index>
bool gather_chunk(const float* g, const float* e, float* staged, std::size_t lo, std::size_t hi, std::uint64_t* bits,
                  bool complement, Index* index, float* value, std::uint64_t o, std::uint64_t end,
                  float scale) noexcept {
  auto emit = [&](std::size_t i, bool keep) {
    index[o] = static_cast<Index>(i);
    value[o] = scale * (Compensate ? g[i] + e[i] : g[i]);
    o += keep;
  };
  bool bad = !Compensate && any_non_finite(g + lo, hi - lo);
  for (std::size_t i = lo; i < hi; i += 64) {
    std::uint64_t word = 0;
    if (bits != nullptr) {
      word = bits[(i - lo) / 64];
      bits[(i - lo) / 64] = 0;
    }
    const std::size_t len = std::min<std::size_t>(64, hi - i);
    std::uint64_t kept = complement ? ~word : word;
    if (len < 64) kept &= (std::uint64_t{1} << len) - 1;
    std::size_t b = 0;
    for (; b + 32 <= len; b += 32) {
      std::uint64_t mask = (kept >> b) & 0xFFFFFFFFu;
      if constexpr (Compensate) {
        bad |= compensate_block(g + i + b, e + i + b, staged + i + b, static_cast<std::uint32_t>(mask));
        bad |= compensate_block(g + i + b + 16, e + i + b + 16, staged + i + b + 16,
                                static_cast<std::uint32_t>(mask >> 16));
      }
      if (o + 2 <= end) {  // no index left: element i + b, not kept
        emit(i + b + (static_cast<unsigned>(std::countr_zero(mask | std::uint64_t{1} << 32)) & 31u), mask != 0);
        mask &= mask - 1;
        emit(i + b + (static_cast<unsigned>(std::countr_zero(mask | std::uint64_t{1} << 32)) & 31u), mask != 0);
        mask &= mask - 1;
      }
      for (; mask != 0; mask &= mask - 1) emit(i + b + static_cast<unsigned>(std::countr_zero(mask)), true);
    }
    for (std::size_t t = i + b; t < i + len; ++t) {
      const bool keep = (kept >> (t - i)) & 1u;
      if constexpr (Compensate) {
        const float m = g[t] + e[t];
        bad |= magnitude_key(m) >= non_finite_key;
        staged[t] = keep ? 0.0f : m;
      }
      if (keep) emit(t, true);
    }
  }
  if constexpr (Compensate) stream_fence();
  return bad;
}

}  // namespace detail

/// Steps 2 to 4 (see the top of this file): leaves the chosen set in the workspace, for
/// gather_sample.
inline void draw_sample(executor& /*exec*/, const sample_plan& plan, const philox::stream& s, sample_workspace& ws) {
  if (plan.chosen == 0) return;
  BELLOWS_EXPECTS(ws.chosen.size() == (plan.n + 63) / 64 && ws.dropped.size() * 64 >= plan.batch &&
                      ws.per_chunk.size() == ws.first.size(),
                  "draw_sample: the workspace does not fit the plan");
  std::uint64_t* chosen = ws.chosen.data();
  std::uint32_t* per_chunk = ws.per_chunk.data();
  std::uint64_t* dropped = ws.dropped.data();
  std::fill(ws.per_chunk.begin(), ws.per_chunk.end(), 0u);
  // Steps 2 and 3.
  std::uint64_t distinct = detail::propose(s, plan.n, 0, plan.batch, chosen, per_chunk);
  for (std::uint64_t slot = plan.batch; distinct < plan.chosen; slot += plan.batch - plan.chosen)
    distinct += detail::propose(s, plan.n, slot, slot + plan.batch - plan.chosen, chosen, per_chunk);
  // Step 4: the ranks to drop, then the members of those ranks.
  std::uint64_t cursor = std::uint64_t{1} << 33;
  for (std::uint64_t t = plan.chosen; t < distinct; ++t) {
    std::uint64_t r = bellows::detail::uniform_below(s, cursor, t + 1);
    if ((dropped[r >> 6] >> (r & 63)) & 1u) r = t;
    dropped[r >> 6] |= std::uint64_t{1} << (r & 63);
  }
  detail::drop_ranks(chosen, per_chunk, dropped, distinct);
}

/// Step 5 with the values: writes the plan's k indices (ascending) and the kept entries of
/// v = g, or v = g + e when `e` is not empty, as value = scale * v[index], reading the set that
/// draw_sample left (and clearing it for the next draw). With `e`, the same pass writes the
/// error-feedback update `staged` = v with zeros at the kept indices. Returns false, with `out`
/// and `staged` unspecified, when an element of v anywhere is NaN or +-Inf.
template <class Index>
[[nodiscard]] bool gather_sample(executor& exec, const sample_plan& plan, sample_workspace& ws,
                                 std::span<const float> g, std::span<const float> e, std::span<float> staged,
                                 sparse_arrays<Index> out, float scale = 1.0f) {
  const std::size_t n = g.size();
  const bool compensate = !e.empty();
  BELLOWS_EXPECTS(n == plan.n && out.index.size() == plan.k && out.value.size() == plan.k &&
                      (!compensate || (e.size() == n && staged.size() == n)),
                  "gather_sample: the buffers do not fit the plan: ", plan.k, " of ", plan.n, " for buffers of ", n,
                  ", ", e.size(), ", ", staged.size(), " and ", out.index.size(), " entries");
  BELLOWS_EXPECTS(!compensate || detail::stream_aligned(staged.data()),
                  "gather_sample: `staged` must start at a multiple of 16 bytes");
  const std::size_t chunks = (n + sparse_chunk - 1) / sparse_chunk;
  BELLOWS_EXPECTS(ws.first.size() == chunks, "gather_sample: the workspace does not fit the plan");
  const bool drawn = plan.chosen != 0;
  std::uint64_t at = 0;
  for (std::size_t c = 0; c < chunks; ++c) {
    ws.first[c] = at;
    const std::uint64_t members = drawn ? ws.per_chunk[c] : 0;
    at += plan.complement ? std::min<std::uint64_t>(sparse_chunk, n - c * sparse_chunk) - members : members;
  }
  BELLOWS_EXPECTS(at == plan.k, "gather_sample: the workspace holds ", at, " of ", plan.k, " indices");
  std::atomic<bool> bad{false};
  exec.for_chunks(n, sparse_chunk, [&](std::size_t lo, std::size_t hi) {
    const std::size_t c = lo / sparse_chunk;
    const std::uint64_t end = c + 1 < chunks ? ws.first[c + 1] : plan.k;
    std::uint64_t* bits = drawn ? ws.chosen.data() + lo / 64 : nullptr;
    const bool chunk_bad =
        compensate ? detail::gather_chunk<true>(g.data(), e.data(), staged.data(), lo, hi, bits, plan.complement,
                                                out.index.data(), out.value.data(), ws.first[c], end, scale)
                   : detail::gather_chunk<false>(g.data(), nullptr, nullptr, lo, hi, bits, plan.complement,
                                                 out.index.data(), out.value.data(), ws.first[c], end, scale);
    if (chunk_bad) bad.store(true, std::memory_order_relaxed);
  });
  return !bad.load(std::memory_order_relaxed);
}

}  // namespace bellows::cpu
