// SPDX-License-Identifier: Apache-2.0
// CPU kernels of top-k selection by magnitude: a threshold estimated from a sample, one streaming
// pass that keeps the few elements above it, then an exact selection among those few.
//
// select_top, for the k largest |v| of v = g (or g + e, the error-compensated gradient):
//  1. Sample: `plan.sample` elements, four consecutive ones (one cache line, mostly) at a
//     position drawn in each of plan.sample / 4 equal strata of the array (Philox, so every
//     backend draws the same), or all of them for small n. The lower threshold t_lo is the
//     plan.lower_rank-th largest sampled magnitude, a few standard deviations below the k-th, so
//     that almost surely at least k elements reach it. For large k there is also an upper
//     threshold t_hi (plan.upper_rank), above which almost surely fewer than k elements lie.
//  2. Scan: one pass over v in chunks of select_chunk elements. Elements with t_lo <= |v| < t_hi
//     are candidates, copied with their offset in the chunk into the workspace; elements at or
//     above t_hi are only counted. Non-finite elements are found here. With error feedback and
//     no t_hi, the same pass writes staged = v with the candidates zeroed.
//  3. Select: when fewer than k elements lie above t_hi and the candidates reach k, the exact
//     k-th largest magnitude T is found among the candidates (a histogram of the top 11 bits of
//     their keys, then nth_element within the bin that holds it). Otherwise (the sample misled,
//     or ties overflow the workspace) three histogram passes over v find T.
//  4. Emit: every element with |v| > T and, in index order, the first ones with |v| = T until k
//     are written in ascending index order (the tie rule of docs/spec.md#top-k): from the candidates alone when
//     there is no t_hi, else by a pass over v. Candidates not kept go back into `staged`.
// When t_lo would be 0 (mostly zero data) the candidates are the nonzero elements, and if they
// are fewer than k, the first zeros in index order complete the count.
// Approximate mode (plan.max_count > k) keeps every element at or above t_lo when their count
// lies in [k, max_count], and otherwise falls back to the exact selection.
// The result depends on neither the thread count nor, in exact mode, the sample.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "bellows/core/error.hpp"
#include "bellows/core/philox.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/cpu/sparse.hpp"
#include "bellows/plan/select.hpp"
#include "bellows/plan/sparse.hpp"

namespace bellows::cpu {

/// Elements per task of the scan and emit passes; candidates are 16-bit offsets within a chunk.
inline constexpr std::size_t select_chunk = std::size_t{1} << 13;
static_assert(select_chunk <= 65536, "candidate offsets must fit 16 bits");

/// What the scan records per chunk, and the emit pass reuses.
struct chunk_tally {
  std::size_t first = 0;         ///< its first candidate in the workspace (when stored)
  std::size_t out = 0;           ///< its first output position (emit pass)
  std::uint32_t candidates = 0;  ///< elements with t_lo <= key < t_hi
  std::uint32_t above = 0;       ///< elements with key >= t_hi; for the emit pass: key > T
  std::uint32_t ties = 0;        ///< for the emit pass: elements with key == T it keeps
  bool stored = false;           ///< its candidates fit the workspace
};

/// The memory of one layer's selections, sized from a plan; refitting it to another plan keeps
/// the storage it already has.
struct select_workspace {
  std::vector<float> sample;
  std::vector<std::uint32_t> keys;  ///< scratch of the exact selection among candidates
  std::vector<std::uint16_t> position;
  std::vector<float> value;
  std::vector<chunk_tally> chunks;
  unsigned non_finite = 0;  ///< the words a selection into a payload reports in (sparse_payload.hpp)
  std::uint64_t selected = 0;

  select_workspace() = default;
  explicit select_workspace(const select_plan& p) { fit(p); }

  void fit(const select_plan& p) {
    sample.resize(p.sample);
    keys.resize(std::max(p.sample, p.capacity));
    position.resize(p.capacity);
    value.resize(p.capacity);
    chunks.resize((p.n + select_chunk - 1) / select_chunk);
  }
};

/// The k-th largest magnitude key and how many keys exceed it.
struct kth_key {
  std::uint32_t key = 0;
  std::size_t above = 0;
};

/// The rank-th largest magnitude key of `values` (1 <= rank <= values.size()): a histogram of
/// the top 11 key bits finds the bin that holds it, nth_element finishes within that bin.
/// `scratch` holds at least values.size() keys.
[[nodiscard]] inline kth_key kth_largest_key(std::span<const float> values, std::size_t rank,
                                             std::span<std::uint32_t> scratch) {
  BELLOWS_EXPECTS(rank >= 1 && rank <= values.size() && scratch.size() >= values.size(), "kth_largest_key: rank ", rank,
                  " must be in [1, ", values.size(), "] and the scratch hold as many values, got ", scratch.size());
  constexpr unsigned shift = 20;
  std::size_t hist[std::size_t{1} << (31 - shift)] = {};
  for (float v : values) ++hist[magnitude_key(v) >> shift];
  std::size_t bin = std::size(hist) - 1, above = 0;
  while (above + hist[bin] < rank) above += hist[bin--];
  std::size_t count = 0;
  for (float v : values) {
    const std::uint32_t key = magnitude_key(v);
    scratch[count] = key;  // kept only when in the bin
    count += key >> shift == bin;
  }
  const auto nth = scratch.begin() + static_cast<std::ptrdiff_t>(count - (rank - above));
  std::nth_element(scratch.begin(), nth, scratch.begin() + static_cast<std::ptrdiff_t>(count));
  const std::uint32_t key = *nth;
  for (auto it = nth + 1; it != scratch.begin() + static_cast<std::ptrdiff_t>(count); ++it) above += *it > key;
  return {key, above};
}

namespace detail {

template <bool Compensate>
[[nodiscard]] inline float value_at(const float* g, const float* e, std::size_t i) noexcept {
  if constexpr (Compensate)
    return g[i] + e[i];
  else
    return g[i];
}

struct scan_tally {
  std::size_t hits = 0;
  std::size_t above = 0;
  bool non_finite = false;
};

/// Scans v over [0, len) (len <= select_chunk): the offsets and values of elements with
/// lo <= key < hi go to `position` and `value`. With Upper, elements with key >= hi are counted
/// and non-finite ones flagged; without (hi is above_all_keys), the caller keeps
/// lo <= non_finite_key so that non-finite elements are hits, and with Compensate the pass
/// writes v to `staged` (16-byte aligned) with the hits zeroed.
/// Hits are rare, so a branch per hit would mispredict about once per hit: blocks of 32 record
/// their first two hits without branching (writing a spare entry that the next one overwrites
/// when there are fewer) and take a branch only for a third.
template <bool Compensate, bool Upper>
scan_tally scan_chunk(const float* g, const float* e, float* staged, std::size_t len, std::uint32_t lo,
                      std::uint32_t hi, std::uint16_t* position, float* value) noexcept {
  constexpr bool stage = Compensate && !Upper;
  scan_tally t;
  std::uint32_t bad_hit = 0;
  auto record = [&](std::size_t i, bool hit) {
    position[t.hits] = static_cast<std::uint16_t>(i);
    const float v = value_at<Compensate>(g, e, i);
    value[t.hits] = v;
    bad_hit |= static_cast<std::uint32_t>(magnitude_key(v) >= non_finite_key);  // a real element either way
    t.hits += hit;
  };
  std::size_t i = 0;
#if defined(BELLOWS_CPU_SSE2)
  const __m128i magnitude = _mm_set1_epi32(0x7FFFFFFF);
  // Keys are below 2^31, so signed compares order them; key >= x is key > x - 1.
  const __m128i lo_less = _mm_set1_epi32(static_cast<int>(lo - 1));
  const __m128i hi_less = _mm_set1_epi32(static_cast<int>(hi - 1));
  const __m128i largest_finite = _mm_set1_epi32(static_cast<int>(non_finite_key - 1));
  __m128i bad = _mm_setzero_si128(), above = _mm_setzero_si128();
  for (; i + 32 <= len; i += 32) {
    std::uint64_t mask = 0;
    for (unsigned q = 0; q < 8; ++q) {
      __m128 v = _mm_loadu_ps(g + i + 4 * q);
      if constexpr (Compensate) v = _mm_add_ps(v, _mm_loadu_ps(e + i + 4 * q));
      const __m128i key = _mm_and_si128(_mm_castps_si128(v), magnitude);
      __m128i hit = _mm_cmpgt_epi32(key, lo_less);
      if constexpr (Upper) {
        const __m128i at_hi = _mm_cmpgt_epi32(key, hi_less);
        hit = _mm_andnot_si128(at_hi, hit);
        bad = _mm_or_si128(bad, _mm_cmpgt_epi32(key, largest_finite));
        above = _mm_sub_epi32(above, at_hi);
      }
      mask |= static_cast<std::uint64_t>(_mm_movemask_ps(_mm_castsi128_ps(hit))) << (4 * q);
      if constexpr (stage) stream_store(staged + i + 4 * q, _mm_andnot_ps(_mm_castsi128_ps(hit), v));
    }
    for (int twice = 0; twice < 2; ++twice) {  // no hit left: element i + 0, not kept
      record(i + (static_cast<unsigned>(std::countr_zero(mask | std::uint64_t{1} << 32)) & 31u), mask != 0);
      mask &= mask - 1;
    }
    for (; mask != 0; mask &= mask - 1) record(i + static_cast<unsigned>(std::countr_zero(mask)), true);
  }
  alignas(16) std::uint32_t lanes[4];
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes), above);
  t.above = std::size_t{lanes[0]} + lanes[1] + lanes[2] + lanes[3];
  t.non_finite = _mm_movemask_epi8(bad) != 0;
#endif
  for (; i < len; ++i) {
    const float v = value_at<Compensate>(g, e, i);
    const std::uint32_t key = magnitude_key(v);
    const bool hit = key >= lo && key < hi;
    if (hit) record(i, true);
    if constexpr (Upper) {
      t.above += key >= hi;
      t.non_finite |= key >= non_finite_key;
    }
    if constexpr (stage) staged[i] = hit ? 0.0f : v;
  }
  if constexpr (stage) stream_fence();
  t.non_finite |= bad_hit != 0;
  return t;
}

struct scan_summary {
  std::size_t candidates = 0;  ///< all of them, stored or not
  std::size_t above = 0;
  bool non_finite = false;
};

/// Step 2 of select_top over all chunks.
template <bool Compensate, bool Upper>
scan_summary scan(executor& exec, const float* g, const float* e, float* staged, std::size_t n, std::uint32_t lo,
                  std::uint32_t hi, select_workspace& ws) {
  std::atomic<std::size_t> used{0}, above{0};
  std::atomic<bool> bad{false};
  const std::size_t capacity = ws.position.size();
  exec.for_chunks(n, select_chunk, [&](std::size_t begin, std::size_t end) {
    std::uint16_t position[select_chunk];
    float value[select_chunk];
    const scan_tally t = scan_chunk<Compensate, Upper>(
        g + begin, e ? e + begin : nullptr, staged ? staged + begin : nullptr, end - begin, lo, hi, position, value);
    chunk_tally& c = ws.chunks[begin / select_chunk];
    c.candidates = static_cast<std::uint32_t>(t.hits);
    c.above = static_cast<std::uint32_t>(t.above);
    if (t.above != 0) above.fetch_add(t.above, std::memory_order_relaxed);
    if (t.non_finite) bad.store(true, std::memory_order_relaxed);
    const std::size_t first = t.hits != 0 ? used.fetch_add(t.hits, std::memory_order_relaxed) : 0;
    c.stored = first + t.hits <= capacity;
    c.first = first;
    if (c.stored) {
      std::copy(position, position + t.hits, ws.position.begin() + static_cast<std::ptrdiff_t>(first));
      std::copy(value, value + t.hits, ws.value.begin() + static_cast<std::ptrdiff_t>(first));
    } else if constexpr (Compensate && !Upper) {
      for (std::size_t j = 0; j < t.hits; ++j) staged[begin + position[j]] = value[j];  // no room: the residual whole
    }
  });
  return {used.load(), above.load(), bad.load()};
}

/// Histogram of (key >> shift) & (bins - 1) over the elements with key >> match_shift == match.
template <bool Compensate>
void histogram(executor& exec, const float* g, const float* e, std::size_t n, unsigned match_shift, std::uint32_t match,
               unsigned shift, std::span<std::size_t> hist) {
  constexpr std::size_t chunk = std::size_t{1} << 18;
  std::mutex merge;
  std::ranges::fill(hist, 0);
  const std::uint32_t bin_mask = static_cast<std::uint32_t>(hist.size() - 1);
  exec.for_chunks(n, chunk, [&](std::size_t begin, std::size_t end) {
    std::uint32_t local[2048] = {};
    for (std::size_t i = begin; i < end; ++i) {
      const std::uint32_t key = magnitude_key(value_at<Compensate>(g, e, i));
      if (key >> match_shift == match) ++local[(key >> shift) & bin_mask];
    }
    const std::lock_guard lock(merge);
    for (std::size_t b = 0; b < hist.size(); ++b) hist[b] += local[b];
  });
}

/// The exact k-th largest key of all of v by three histogram passes (11, 10 and 10 key bits);
/// nullopt-like: non_finite set when v holds NaN or Inf.
template <bool Compensate>
kth_key kth_largest_key_of_all(executor& exec, const float* g, const float* e, std::size_t n, std::size_t k,
                               bool& non_finite) {
  std::size_t hist[2048];
  kth_key r;
  // Level 1 bins are key >> 20; the others refine the bin that holds the k-th key by 10 bits.
  constexpr unsigned shifts[3] = {20, 10, 0};
  std::uint32_t prefix = 0;
  for (unsigned level = 0; level < 3; ++level) {
    const unsigned shift = shifts[level];
    const std::size_t bins = level == 0 ? 2048 : 1024;
    const unsigned match_shift = level == 0 ? 31 : shifts[level - 1];
    histogram<Compensate>(exec, g, e, n, match_shift, prefix, shift, std::span(hist, bins));
    if (level == 0) {
      non_finite = false;
      for (std::size_t b = non_finite_key >> 20; b < bins; ++b) non_finite |= hist[b] != 0;
      if (non_finite) return r;
    }
    std::size_t bin = bins - 1;
    while (r.above + hist[bin] < k) r.above += hist[bin--];
    prefix = (prefix << (level == 0 ? 11 : 10)) | static_cast<std::uint32_t>(bin);
  }
  r.key = prefix;
  return r;
}

/// Per chunk, the elements with key > T (`above`) and == T (`ties`), by a pass over v.
template <bool Compensate>
void tally_against(executor& exec, const float* g, const float* e, std::size_t n, std::uint32_t key,
                   select_workspace& ws) {
  exec.for_chunks(n, select_chunk, [&](std::size_t begin, std::size_t end) {
    std::uint32_t gt = 0, eq = 0;
    for (std::size_t i = begin; i < end; ++i) {
      const std::uint32_t k = magnitude_key(value_at<Compensate>(g, e, i));
      gt += k > key;
      eq += k == key;
    }
    chunk_tally& c = ws.chunks[begin / select_chunk];
    c.above = gt;
    c.ties = eq;
  });
}

/// Per chunk, from its stored candidates: above += candidates > T, ties = candidates == T.
inline void tally_candidates(select_workspace& ws, std::uint32_t key) {
  for (chunk_tally& c : ws.chunks) {
    std::uint32_t gt = 0, eq = 0;
    for (std::size_t j = c.first; j < c.first + c.candidates; ++j) {
      const std::uint32_t k = magnitude_key(ws.value[j]);
      gt += k > key;
      eq += k == key;
    }
    c.above += gt;
    c.ties = eq;
  }
}

/// Whether an element of magnitude key k is kept against the k-th largest key T, the first
/// `ties` elements equal to T being kept too (which it counts down); without branches, since
/// either outcome may be frequent.
[[nodiscard]] inline bool keeps(std::uint32_t k, std::uint32_t key, std::size_t& ties) noexcept {
  const bool tie = k == key;
  const bool keep = (k > key) | (tie & (ties != 0));
  ties -= static_cast<std::size_t>(tie & keep);
  return keep;
}

/// v, or +0 when `zero` (without a branch).
[[nodiscard]] inline float zero_if(bool zero, float v) noexcept {
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) & (static_cast<std::uint32_t>(zero) - 1u));
}

/// Step 4 from the candidates alone (every kept element is a candidate): put(i, v, keep) for
/// each, in index order; a candidate not kept goes back into `staged` (only those: the residual
/// was written with streaming stores, and its lines are out of the cache).
template <class Put>
void each_candidate(const select_workspace& ws, std::uint32_t key, std::size_t ties, float* staged, Put&& put) {
  float spare = 0.0f;  // where the stores of kept candidates go instead
  for (std::size_t c = 0; c < ws.chunks.size(); ++c) {
    const chunk_tally& t = ws.chunks[c];
    const std::size_t base = c * select_chunk, end = t.first + t.candidates;
    for (std::size_t j = t.first; j < end; ++j) {
      const float v = ws.value[j];
      const std::size_t i = base + ws.position[j];
      const bool keep = keeps(magnitude_key(v), key, ties);
      put(i, v, keep);
      if (staged == nullptr) continue;
      *(keep ? &spare : staged + i) = v;  // no branch on `keep`
    }
  }
}

/// Step 4 when the k-th largest magnitude is 0: put(i, v) for every candidate (the nonzero
/// elements) and the first `zeros` other elements, in index order; the zeros kept get zeros in
/// `staged` too.
template <bool Compensate, class Put>
void each_with_zeros(const float* g, const float* e, float* staged, const select_workspace& ws, std::size_t zeros,
                     Put&& put) {
  std::size_t next = 0;  // the next index a zero may come from
  auto zeros_before = [&](std::size_t end) {
    for (; zeros != 0 && next < end; ++next, --zeros) {
      put(next, value_at<Compensate>(g, e, next));
      if constexpr (Compensate) staged[next] = 0.0f;
    }
  };
  for (std::size_t c = 0; c < ws.chunks.size(); ++c) {
    const chunk_tally& t = ws.chunks[c];
    for (std::size_t j = t.first; j < t.first + t.candidates; ++j) {
      const std::size_t i = c * select_chunk + ws.position[j];
      zeros_before(i);
      put(i, ws.value[j]);
      next = i + 1;
    }
  }
  zeros_before(~std::size_t{0});
}

/// Step 4 by a pass over v, from per-chunk tallies (above: key > T, ties: key == T present):
/// `ties` of the ties are kept, the first ones in index order. Gives each chunk its share of
/// the ties and its first output position (`out`), then in parallel calls put(i, v, keep) for
/// every element, with put = chunk_put(its chunk_tally), and writes `staged` (with Compensate).
template <bool Compensate, class ChunkPut>
void each_element(executor& exec, const float* g, const float* e, float* staged, std::size_t n, std::uint32_t key,
                  std::size_t ties, select_workspace& ws, ChunkPut&& chunk_put) {
  std::size_t o = 0;
  for (chunk_tally& c : ws.chunks) {
    c.ties = static_cast<std::uint32_t>(std::min<std::size_t>(c.ties, ties));
    ties -= c.ties;
    c.out = o;
    o += std::size_t{c.above} + c.ties;
  }
  exec.for_chunks(n, select_chunk, [&, key](std::size_t begin, std::size_t end) {
    const chunk_tally& c = ws.chunks[begin / select_chunk];
    auto put = chunk_put(c);
    std::size_t ties_left = c.ties;
    float block[16];
    for (std::size_t i = begin; i < end; i += 16) {
      const std::size_t len = std::min<std::size_t>(16, end - i);
      for (std::size_t t = 0; t < len; ++t) {
        const float v = value_at<Compensate>(g, e, i + t);
        const bool keep = keeps(magnitude_key(v), key, ties_left);
        put(i + t, v, keep);
        block[t] = zero_if(keep, v);
      }
      if constexpr (Compensate) {
#if defined(BELLOWS_CPU_SSE2)
        if (len == 16) {
          for (std::size_t q = 0; q < 16; q += 4) stream_store(staged + i + q, _mm_loadu_ps(block + q));
          continue;
        }
#endif
        std::copy(block, block + len, staged + i);
      }
    }
    if constexpr (Compensate) stream_fence();
  });
}

/// What steps 1 to 3 found: where step 4 takes the kept elements from, the k-th largest key T,
/// how many elements equal to T are kept (for `zeros`: how many zeros), and the count kept.
struct threshold {
  enum class source : std::uint8_t { non_finite, candidates, pass, zeros };
  source from = source::non_finite;
  std::uint32_t key = 0;
  std::size_t ties = 0;
  std::size_t count = 0;
};

template <bool Compensate>
threshold find_threshold(executor& exec, const select_plan& plan, const philox::stream& draw, const float* g,
                         const float* e, float* staged, select_workspace& ws) {
  using source = threshold::source;
  const std::size_t n = plan.n, k = plan.k;
  if (n == 0) return {source::candidates, 0, 0, 0};
  if (plan.sample != 0) {
    // Step 1: all of v, or four consecutive elements from each of sample / 4 strata.
    const std::size_t s = plan.sample;
    if (s == n) {
      for (std::size_t i = 0; i < n; ++i) ws.sample[i] = value_at<Compensate>(g, e, i);
    } else {
      const std::size_t strata = s / 4;
      for (std::size_t j = 0; j < strata; j += 4) {
        const philox::u32x4 words = draw.block(static_cast<std::uint32_t>(j / 4));
        for (std::size_t w = 0; w < 4 && j + w < strata; ++w) {
          const std::size_t lo = (j + w) * n / strata, hi = (j + w + 1) * n / strata;
          const auto starts = static_cast<std::uint32_t>(std::min<std::size_t>(hi - lo - 3, 0xFFFFFFFFu));
          const std::size_t at = lo + philox::to_below(words.v[w], starts);
          for (std::size_t q = 0; q < 4; ++q) ws.sample[4 * (j + w) + q] = value_at<Compensate>(g, e, at + q);
        }
      }
    }
    const std::span<const float> sampled(ws.sample.data(), s);
    const std::uint32_t hi =
        plan.upper_rank != 0 ? kth_largest_key(sampled, plan.upper_rank, ws.keys).key : above_all_keys;
    const bool small = hi == above_all_keys;
    // A zero threshold (mostly zero gradients) would make every element a candidate: the
    // candidates are then the nonzero elements, and zeros complete the count if need be.
    // Without t_hi, non-finite elements must be candidates (the scan finds them among those).
    const std::uint32_t sampled_lo = kth_largest_key(sampled, plan.lower_rank, ws.keys).key;
    const std::uint32_t lo = small ? std::clamp<std::uint32_t>(sampled_lo, 1, non_finite_key) : sampled_lo;
    // Step 2.
    const scan_summary s2 = small ? scan<Compensate, false>(exec, g, e, staged, n, lo, hi, ws)
                                  : scan<Compensate, true>(exec, g, e, nullptr, n, lo, hi, ws);
    if (s2.non_finite) return {};
    const std::size_t reach = s2.above + s2.candidates;
    const bool stored = s2.candidates <= ws.position.size();
    if (stored && s2.above < k && k <= reach) {
      // Step 3 among the candidates.
      threshold t{small ? source::candidates : source::pass, lo, s2.candidates, reach};
      if (plan.max_count == k || reach > plan.max_count) {
        const kth_key kth =
            kth_largest_key(std::span<const float>(ws.value.data(), s2.candidates), k - s2.above, ws.keys);
        t = {t.from, kth.key, k - s2.above - kth.above, k};
      }
      if (!small) tally_candidates(ws, t.key);
      return t;
    }
    if (small && lo == 1 && stored && s2.candidates < k)  // every nonzero element, then zeros
      return {source::zeros, 0, k - s2.candidates, k};
  }
  // Step 3 over all of v.
  bool non_finite = false;
  const kth_key kth = kth_largest_key_of_all<Compensate>(exec, g, e, n, k, non_finite);
  if (non_finite) return {};
  tally_against<Compensate>(exec, g, e, n, kth.key, ws);
  return {source::pass, kth.key, k - kth.above, k};
}

template <bool Compensate, class Arrays>
bool select_top(executor& exec, const select_plan& plan, const philox::stream& draw, const float* g, const float* e,
                float* staged, select_workspace& ws, Arrays&& arrays) {
  using source = threshold::source;
  const threshold t = find_threshold<Compensate>(exec, plan, draw, g, e, staged, ws);
  if (t.from == source::non_finite) return false;
  const auto out = arrays(t.count);
  auto* const index = out.index.data();
  float* const value = out.value.data();
  if (t.from == source::zeros) {
    std::size_t o = 0;
    each_with_zeros<Compensate>(g, e, staged, ws, t.ties, [&](std::size_t i, float v) {
      index[o] = static_cast<std::remove_pointer_t<decltype(index)>>(i);
      value[o++] = v;
    });
    return true;
  }
  // An entry is written at every element looked at, while there is room, and kept by advancing
  // past it: no branch on `keep`, which may go either way half the time.
  auto writer = [index, value](std::size_t o, std::size_t end) {
    return [=](std::size_t i, float v, bool keep) mutable {
      if (o < end) {
        index[o] = static_cast<std::remove_pointer_t<decltype(index)>>(i);
        value[o] = v;
      }
      o += keep;
    };
  };
  if (t.from == source::candidates)
    each_candidate(ws, t.key, t.ties, staged, writer(0, t.count));
  else
    each_element<Compensate>(exec, g, e, staged, plan.n, t.key, t.ties, ws,
                             [&](const chunk_tally& c) { return writer(c.out, c.out + c.above + c.ties); });
  return true;
}

/// Step 4 for a dense output, by a pass over v: dense = v where kept, else 0; staged (with
/// Compensate) the other way round. Blocks with no element equal to T are split by mask; the
/// rare blocks with one go element by element, in order, for the tie rule.
template <bool Compensate>
void split_pass(executor& exec, const float* g, const float* e, float* staged, std::size_t n, std::uint32_t key,
                std::size_t ties, select_workspace& ws, float* dense) {
  for (chunk_tally& c : ws.chunks) {
    c.ties = static_cast<std::uint32_t>(std::min<std::size_t>(c.ties, ties));
    ties -= c.ties;
  }
  exec.for_chunks(n, select_chunk, [&, key](std::size_t begin, std::size_t end) {
    std::size_t ties_left = ws.chunks[begin / select_chunk].ties;
    std::size_t i = begin;
#if defined(BELLOWS_CPU_SSE2)
    const __m128i magnitude = _mm_set1_epi32(0x7FFFFFFF);
    const __m128i t = _mm_set1_epi32(static_cast<int>(key));
    for (; i + 16 <= end; i += 16) {
      __m128 v[4];
      __m128i above[4], tie = _mm_setzero_si128();
      for (int q = 0; q < 4; ++q) {
        v[q] = _mm_loadu_ps(g + i + 4 * q);
        if constexpr (Compensate) v[q] = _mm_add_ps(v[q], _mm_loadu_ps(e + i + 4 * q));
        const __m128i k = _mm_and_si128(_mm_castps_si128(v[q]), magnitude);
        above[q] = _mm_cmpgt_epi32(k, t);
        tie = _mm_or_si128(tie, _mm_cmpeq_epi32(k, t));
      }
      if (_mm_movemask_epi8(tie) != 0) {
        for (std::size_t j = i; j < i + 16; ++j) {
          const float x = value_at<Compensate>(g, e, j);
          const bool keep = keeps(magnitude_key(x), key, ties_left);
          dense[j] = zero_if(!keep, x);
          if constexpr (Compensate) staged[j] = zero_if(keep, x);
        }
        continue;
      }
      for (int q = 0; q < 4; ++q) {
        const __m128 keep = _mm_castsi128_ps(above[q]);
        _mm_storeu_ps(dense + i + 4 * q, _mm_and_ps(keep, v[q]));
        if constexpr (Compensate) stream_store(staged + i + 4 * q, _mm_andnot_ps(keep, v[q]));
      }
    }
#endif
    for (; i < end; ++i) {
      const float x = value_at<Compensate>(g, e, i);
      const bool keep = keeps(magnitude_key(x), key, ties_left);
      dense[i] = zero_if(!keep, x);
      if constexpr (Compensate) staged[i] = zero_if(keep, x);
    }
    if constexpr (Compensate) stream_fence();
  });
}

template <bool Compensate>
std::optional<std::size_t> select_top_dense(executor& exec, const select_plan& plan, const philox::stream& draw,
                                            const float* g, const float* e, float* staged, select_workspace& ws,
                                            float* dense) {
  using source = threshold::source;
  const threshold t = find_threshold<Compensate>(exec, plan, draw, g, e, staged, ws);
  if (t.from == source::non_finite) return std::nullopt;
  if (t.from == source::pass) {
    split_pass<Compensate>(exec, g, e, staged, plan.n, t.key, t.ties, ws, dense);
    return t.count;
  }
  exec.for_chunks(plan.n, select_chunk,
                  [dense](std::size_t begin, std::size_t end) { std::fill(dense + begin, dense + end, 0.0f); });
  if (t.from == source::zeros)
    each_with_zeros<Compensate>(g, e, staged, ws, t.ties, [dense](std::size_t i, float v) { dense[i] = v; });
  else
    each_candidate(ws, t.key, t.ties, staged,
                   [dense](std::size_t i, float v, bool keep) { dense[i] = zero_if(!keep, v); });
  return t.count;
}

}  // namespace detail

namespace detail {
inline void check_select(const char* who, const select_plan& plan, std::span<const float> g, std::span<const float> e,
                         std::span<float> staged, const select_workspace& ws) {
  BELLOWS_EXPECTS(g.size() == plan.n && (e.empty() || (e.size() == plan.n && staged.size() == plan.n)), who,
                  ": the buffers do not fit the plan: ", plan.n, " elements, buffers of ", g.size(), ", ", e.size(),
                  " and ", staged.size());
  BELLOWS_EXPECTS(e.empty() || stream_aligned(staged.data()), who, ": `staged` must start at a multiple of 16 bytes");
  BELLOWS_EXPECTS(ws.sample.size() >= plan.sample && ws.keys.size() >= ws.position.size() &&
                      ws.chunks.size() == (plan.n + select_chunk - 1) / select_chunk,
                  who, ": the workspace does not fit the plan");
}
}  // namespace detail

/// Selects the k = plan.k elements of largest magnitude of v = g, or v = g + e when `e` is not
/// empty (see the top of this file). Once the count is known, calls arrays(count), which returns
/// the sparse_arrays<Index> of that length to fill; they receive the kept indices, ascending, and
/// their values of v. With `e`, `staged` (n floats) receives the residual: v with zeros at the
/// kept indices. `draw` keys the sample. Returns false, without calling `arrays`, when an element
/// of v is NaN or +-Inf; `staged` is then unspecified.
template <class Arrays>
[[nodiscard]] bool select_top(executor& exec, const select_plan& plan, const philox::stream& draw,
                              std::span<const float> g, std::span<const float> e, std::span<float> staged,
                              select_workspace& ws, Arrays&& arrays) {
  detail::check_select("select_top", plan, g, e, staged, ws);
  if (e.empty()) return detail::select_top<false>(exec, plan, draw, g.data(), nullptr, nullptr, ws, arrays);
  return detail::select_top<true>(exec, plan, draw, g.data(), e.data(), staged.data(), ws, arrays);
}

/// The same selection written densely: dense[i] = v[i] where kept, 0 elsewhere (n floats), for
/// averaging by a dense allreduce. Returns the count kept, or nothing (dense and staged then
/// unspecified) when an element of v is NaN or +-Inf.
[[nodiscard]] inline std::optional<std::size_t> select_top_dense(executor& exec, const select_plan& plan,
                                                                 const philox::stream& draw, std::span<const float> g,
                                                                 std::span<const float> e, std::span<float> staged,
                                                                 select_workspace& ws, std::span<float> dense) {
  detail::check_select("select_top_dense", plan, g, e, staged, ws);
  BELLOWS_EXPECTS(dense.size() == plan.n, "select_top_dense: a dense buffer of ", dense.size(),
                  " floats for a plan of ", plan.n);
  if (e.empty()) return detail::select_top_dense<false>(exec, plan, draw, g.data(), nullptr, nullptr, ws, dense.data());
  return detail::select_top_dense<true>(exec, plan, draw, g.data(), e.data(), staged.data(), ws, dense.data());
}

}  // namespace bellows::cpu
