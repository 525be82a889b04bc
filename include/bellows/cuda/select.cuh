// SPDX-License-Identifier: Apache-2.0
// Top-k by magnitude on the device: the set cpu::select_top keeps. In exact mode, the k largest
// |v| of v = g or g + e, ties at the threshold to the lower indices, found by radix selection of
// the threshold instead of the CPU's sample. In approximate mode (plan.max_count > k), first the
// CPU's sample and its thresholds (step 0), then the exact steps when the sample's set is refused.
// Either way the kept indices come in ascending order.
//
// The device steps, all enqueued on the executor's stream with no synchronisation (the
// threshold never leaves the device):
//  0. Approximate mode only: the CPU's stratified sample (the same Philox draw), its
//     plan.upper_rank-th and plan.lower_rank-th largest keys t_hi and t_lo (the radix passes of
//     step 1 over the sample), one pass over v that counts the elements at or above each, and one
//     thread that applies the CPU's rule: when fewer than k lie at or above t_hi, at most
//     plan.capacity lie in [t_lo, t_hi) and the count at or above t_lo is in [k, max_count],
//     the kept set is every element at or above t_lo (T = t_lo, every tie kept), and steps 1
//     and 2 return at once. Otherwise they find the exact set, as the CPU falls back to it.
//  1. Three histogram passes over the magnitude keys (magnitude_key; bits 30-20, 19-9 and
//     8-0), each restricted to the bin the one before chose; after each, one block finds the
//     bin that holds the k-th largest key. The last gives the key T, how many elements above T
//     are kept, and how many of the elements equal to T (`ties`) are.
//  2. When fewer ties are kept than there are, a count per tile of the elements equal to T, and
//     one block that finds the index of the last tie kept (`last`); otherwise last = n - 1.
//  3. cub::DeviceSelect::If over the indices keeps i when key > T, or key == T and i <= last:
//     exactly k of them, ascending. The predicate writes the error-feedback residual as it goes
//     (staged = v, zero where kept), so no pass is spent on it; then the values are gathered.
// Non-finite elements are found in the first pass over v. Layers must have fewer than 2^31
// elements.
#pragma once

#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "bellows/core/error.hpp"
#include "bellows/core/philox.hpp"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/launch.cuh"
#include "bellows/plan/select.hpp"
#include "bellows/plan/sparse.hpp"

namespace bellows::cuda {

namespace detail {

inline constexpr unsigned select_threads = 256;
inline constexpr unsigned select_bins = 2048;
inline constexpr unsigned pick_threads = 1024;
inline constexpr std::size_t tie_tile = 4096;

/// The radix passes: the key bits each one sorts by.
struct radix_pass {
  unsigned shift, bits;
};
__host__ __device__ constexpr radix_pass radix_pass_of(unsigned pass) noexcept {
  return pass == 0 ? radix_pass{20, 11} : pass == 1 ? radix_pass{9, 11} : radix_pass{0, 9};
}

/// What the passes have found so far, in device memory.
struct select_state {
  std::uint32_t prefix;     ///< the chosen bins' bits so far; after the last pass, T
  std::uint32_t remaining;  ///< elements still to keep at or below the current bin
  std::uint32_t ties;       ///< after the last pass: elements with key == T
  std::uint32_t last;       ///< the index of the last tie kept
  std::uint32_t decided;    ///< 1: step 0 kept every element at or above T (prefix); the passes are skipped
};

/// The state before the first pass: k to keep, no prefix, every tie kept; a clear histogram.
/// With `after_step0`, nothing when step 0 has decided.
template <class Word>
__global__ void radix_start_kernel(select_state* state, Word* hist, std::uint32_t k, std::uint32_t last,
                                   bool after_step0) {
  if (after_step0 && state->decided != 0) return;  // uniform over the block
  __syncthreads();                                 // every thread has read `decided`
  if (threadIdx.x == 0) *state = {0, k, 0, last, 0};
  for (unsigned b = threadIdx.x; b < select_bins; b += blockDim.x) hist[b] = 0;
}

/// v[i] = g[i] or g[i] + e[i].
__device__ inline float compensated(const float* g, const float* e, std::size_t i) {
  return e != nullptr ? __fadd_rn(g[i], e[i]) : g[i];
}
__device__ inline std::uint32_t key_of(float v) { return __float_as_uint(v) & 0x7FFFFFFFu; }

/// Pass `pass` of step 1: the histogram of the elements whose key matches the prefix.
template <class Float>
__global__ void radix_histogram_kernel(const Float* g, const Float* e, std::size_t n, unsigned pass,
                                       const select_state* state, std::uint32_t* hist, unsigned* non_finite) {
  if (state->decided != 0) return;
  __shared__ std::uint32_t local[select_bins];
  for (unsigned b = threadIdx.x; b < select_bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const radix_pass p = radix_pass_of(pass);
  const unsigned match_shift = p.shift + p.bits;
  const std::uint32_t prefix = pass == 0 ? 0u : state->prefix;
  const std::uint32_t mask = (1u << p.bits) - 1;
  bool bad = false;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::uint32_t key = key_of(compensated(g, e, i));
    bad |= key >= non_finite_key;
    if (pass == 0 || key >> match_shift == prefix) atomicAdd(&local[(key >> p.shift) & mask], 1u);
  }
  __syncthreads();
  for (unsigned b = threadIdx.x; b < select_bins; b += blockDim.x)
    if (local[b] != 0) atomicAdd(&hist[b], local[b]);
  if (pass == 0 && __syncthreads_or(bad) && threadIdx.x == 0) *non_finite = 1u;
}

/// After pass `pass`: the bin that holds the remaining-th largest key, in one block of
/// pick_threads (two bins a thread, from the top); clears the histogram for the next pass.
template <class Word>
__global__ void radix_pick_kernel(Word* hist, unsigned pass, select_state* state) {
  if (state->decided != 0) return;
  using scan = cub::BlockScan<std::uint32_t, pick_threads>;
  __shared__ typename scan::TempStorage temp;
  const radix_pass p = radix_pass_of(pass);
  const unsigned bins = 1u << p.bits;
  const unsigned hi = bins - 1 - 2 * threadIdx.x;  // this thread's bins: hi, then hi - 1
  const bool mine = 2 * threadIdx.x < bins;
  const std::uint32_t c_hi = mine ? hist[hi] : 0u, c_lo = mine ? hist[hi - 1] : 0u;
  std::uint32_t through = 0;  // elements in this thread's bins and all above them
  scan(temp).InclusiveSum(c_hi + c_lo, through);
  const std::uint32_t above = through - c_hi - c_lo, r = state->remaining;
  __syncthreads();
  if (mine && above < r && r <= through) {
    const bool top = above + c_hi >= r;
    const unsigned bin = top ? hi : hi - 1;
    state->prefix = pass == 0 ? bin : state->prefix << p.bits | bin;
    state->remaining = r - (top ? above : above + c_hi);
    state->ties = top ? c_hi : c_lo;
  }
  for (unsigned b = threadIdx.x; b < select_bins; b += blockDim.x) hist[b] = 0;
}

/// Step 2: per tile of tie_tile elements, the count equal to T (nothing when every tie is kept).
template <class Float>
__global__ void tie_count_kernel(const Float* g, const Float* e, std::size_t n, const select_state* state,
                                 std::uint32_t* tile_ties) {
  if (state->remaining == state->ties) return;
  const std::uint32_t key = state->prefix;
  const std::size_t lo = blockIdx.x * tie_tile, hi = min(n, lo + tie_tile);
  unsigned count = 0;
  for (std::size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) count += key_of(compensated(g, e, i)) == key;
  using reduce = cub::BlockReduce<unsigned, select_threads>;
  __shared__ typename reduce::TempStorage temp;
  const unsigned total = reduce(temp).Sum(count);
  if (threadIdx.x == 0) tile_ties[blockIdx.x] = total;
}

/// Step 2 in one block: the index of the remaining-th element equal to T, in index order.
template <class Float>
__global__ void tie_locate_kernel(const Float* g, const Float* e, std::size_t n, const std::uint32_t* tile_ties,
                                  select_state* state) {
  using scan = cub::BlockScan<std::uint32_t, pick_threads>;
  __shared__ typename scan::TempStorage temp;
  __shared__ std::size_t found_tile;
  __shared__ std::uint32_t before;  // ties before the found tile
  if (state->remaining == state->ties) {
    if (threadIdx.x == 0) state->last = static_cast<std::uint32_t>(n - 1);
    return;
  }
  const std::uint32_t r = state->remaining, key = state->prefix;
  const std::size_t tiles = (n + tie_tile - 1) / tie_tile;
  std::uint32_t carry = 0;
  if (threadIdx.x == 0) found_tile = tiles;
  __syncthreads();
  for (std::size_t t0 = 0; t0 < tiles; t0 += pick_threads) {  // the tile where the count reaches r
    const std::size_t t = t0 + threadIdx.x;
    const std::uint32_t c = t < tiles ? tile_ties[t] : 0u;
    std::uint32_t through = 0, total = 0;
    scan(temp).InclusiveSum(c, through, total);
    if (c != 0 && carry + through - c < r && r <= carry + through) {
      found_tile = t;
      before = carry + through - c;
    }
    __syncthreads();
    if (found_tile != tiles) break;
    carry += total;
  }
  const std::size_t lo = found_tile * tie_tile, hi = min(n, lo + tie_tile);
  carry = before;
  for (std::size_t i0 = lo; i0 < hi; i0 += pick_threads) {  // the element within it
    const std::size_t i = i0 + threadIdx.x;
    const std::uint32_t c = i < hi && key_of(compensated(g, e, i)) == key ? 1u : 0u;
    std::uint32_t through = 0, total = 0;
    scan(temp).InclusiveSum(c, through, total);
    if (c != 0 && carry + through == r) state->last = static_cast<std::uint32_t>(i);
    __syncthreads();
    carry += total;
    if (carry >= r) break;
  }
}

/// Step 3's predicate; writes the residual of element i as it decides.
struct keep_op {
  const float* g;
  const float* e;
  float* staged;
  const select_state* state;
  std::size_t n;
  __device__ bool operator()(std::uint32_t i) const {
    if (i >= n) return false;  // never asked, as CUB guards its last tile; cheap to be sure
    const float v = compensated(g, e, i);
    const std::uint32_t key = key_of(v), t = state->prefix;
    const bool keep = key > t || (key == t && i <= state->last);
    if (staged != nullptr) staged[i] = keep ? 0.0f : v;
    return keep;
  }
};

/// The values of the `*count` kept indices: into `value`, or right after the indices when
/// `value` is null (a sparse payload's layout).
template <class Float>
__global__ void gather_values_kernel(const Float* g, const Float* e, std::uint32_t* index, const std::uint32_t* count,
                                     float* value) {
  const std::size_t j = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  const std::uint32_t c = *count;
  if (j < c) (value != nullptr ? value : reinterpret_cast<float*>(index + c))[j] = compensated(g, e, index[j]);
}

/// Step 0's thresholds and counts.
struct sample_tally {
  std::uint32_t lo;     ///< t_lo
  std::uint32_t hi;     ///< t_hi (above_all_keys: none)
  std::uint32_t reach;  ///< elements with key >= t_lo
  std::uint32_t above;  ///< elements with key >= t_hi
};

/// Step 0's sample, as cpu::select_top draws it: all of v when plan.sample == n, else four
/// consecutive elements at a Philox-drawn start in each of sample / 4 equal strata.
template <class Float>
__global__ void sample_kernel(const Float* g, const Float* e, std::size_t n, std::size_t sample, philox::stream draw,
                              float* out) {
  const std::size_t strata = sample / 4, items = sample == n ? n : strata;
  for (std::size_t t = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; t < items;
       t += std::size_t{gridDim.x} * blockDim.x) {
    if (sample == n) {
      out[t] = compensated(g, e, t);
      continue;
    }
    const std::size_t lo = t * n / strata, hi = (t + 1) * n / strata;
    const auto starts = static_cast<std::uint32_t>(min(hi - lo - 3, std::size_t{0xFFFFFFFFu}));
    const std::size_t at = lo + philox::to_below(draw.block(static_cast<std::uint32_t>(t / 4)).v[t % 4], starts);
    for (unsigned q = 0; q < 4; ++q) out[4 * t + q] = compensated(g, e, at + q);
  }
}

/// Step 0, after the radix passes over the sample (sampled[0]: t_hi's, sampled[1]: t_lo's): the
/// thresholds as the CPU sets them (without t_hi, t_lo in [1, non_finite_key], so that the
/// pass finds non-finite elements among those it counts), and zero counts. One thread.
__global__ void sample_bounds_kernel(const select_state* sampled, bool upper, sample_tally* tally) {
  const std::uint32_t lo = sampled[1].prefix;
  *tally = {upper ? lo : min(max(lo, 1u), non_finite_key), upper ? sampled[0].prefix : above_all_keys, 0, 0};
}

/// Step 0's pass over v: the elements at or above t_lo and t_hi, and the non-finite flag.
template <class Float>
__global__ void sample_count_kernel(const Float* g, const Float* e, std::size_t n, sample_tally* tally,
                                    unsigned* non_finite) {
  const std::uint32_t lo = tally->lo, hi = tally->hi;
  unsigned reach = 0, above = 0;
  bool bad = false;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::uint32_t key = key_of(compensated(g, e, i));
    reach += key >= lo;
    above += key >= hi;
    bad |= key >= non_finite_key;
  }
  using reduce = cub::BlockReduce<unsigned, select_threads>;
  __shared__ typename reduce::TempStorage temp;
  const unsigned block_reach = reduce(temp).Sum(reach);
  __syncthreads();
  const unsigned block_above = reduce(temp).Sum(above);
  if (threadIdx.x == 0) {
    if (block_reach != 0) atomicAdd(&tally->reach, block_reach);
    if (block_above != 0) atomicAdd(&tally->above, block_above);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *non_finite = 1u;
}

/// Step 0's rule (cpu::select_top's): keep every element at or above t_lo when fewer than k lie
/// at or above t_hi, at most `capacity` between, and [k, max_count] in all; else leave the
/// choice to the exact passes. One thread.
__global__ void sample_decide_kernel(const sample_tally* tally, select_state* state, std::uint32_t k,
                                     std::uint32_t max_count, std::uint32_t capacity, std::uint32_t last) {
  const sample_tally t = *tally;
  const bool keep = t.reach - t.above <= capacity && t.above < k && k <= t.reach && t.reach <= max_count;
  *state = {t.lo, 0, 0, last, keep ? 1u : 0u};
}

}  // namespace detail

/// The device memory of one selection, carved from the executor's workspace.
struct select_workspace {
  detail::select_state* state = nullptr;
  std::uint32_t* hist = nullptr;
  std::uint32_t* tile_ties = nullptr;
  std::uint32_t* selected = nullptr;        ///< the count kept, as DeviceSelect reports it
  unsigned* non_finite = nullptr;           ///< set to 1 by select_top when v holds NaN or +-Inf
  float* sample = nullptr;                  ///< approximate mode: step 0's sample
  detail::select_state* sampled = nullptr;  ///< approximate mode: the passes over it, for t_hi and t_lo
  detail::sample_tally* tally = nullptr;    ///< approximate mode: step 0's thresholds and counts
  void* cub = nullptr;
  std::size_t cub_bytes = 0;
  std::size_t used = 0;

  select_workspace() = default;
  /// Carves the pieces for `plan` from `a` (from executor::workspace()).
  select_workspace(const select_plan& plan, arena a) {
    BELLOWS_EXPECTS(plan.n < std::size_t{1} << 31, "cuda::select_workspace: ", plan.n,
                    " elements; the device selects from fewer than 2^31");
    state = a.take<detail::select_state>(1);
    hist = a.take<std::uint32_t>(detail::select_bins);
    tile_ties = a.take<std::uint32_t>((plan.n + detail::tie_tile - 1) / detail::tie_tile + 1);
    selected = a.take<std::uint32_t>(1);
    non_finite = a.take<unsigned>(1);
    if (plan.max_count > plan.k && plan.sample != 0) {
      sample = a.take<float>(plan.sample);
      sampled = a.take<detail::select_state>(2);
      tally = a.take<detail::sample_tally>(1);
    }
    BELLOWS_CUDA_CHECK(cub::DeviceSelect::If(nullptr, cub_bytes, thrust::counting_iterator<std::uint32_t>(0),
                                             static_cast<std::uint32_t*>(nullptr), selected, static_cast<int>(plan.n),
                                             detail::keep_op{}));
    cub = a.take<std::byte>(cub_bytes);
    used = a.used();
  }

  /// Device bytes a selection of `plan` needs (reserve them in the executor at registration).
  [[nodiscard]] static std::size_t bytes(const select_plan& plan) { return select_workspace(plan, arena()).used; }
};

/// cpu::select_top on the device, exact or approximate as `plan` says: out.index receives the
/// kept indices, ascending (k of them in exact mode, k to plan.max_count in approximate mode:
/// the count goes to *ws.selected), and their values of v = g, or g + e when `e` is not empty,
/// go to out.value, or right after the kept indices when out.value is empty (a sparse payload's
/// layout); with `e`, `staged` receives v with zeros at the kept indices. `draw` keys the sample
/// of approximate mode, as on the CPU. Instead of returning false, sets *ws.non_finite to 1 when
/// an element of v is NaN or +-Inf (the output is then unspecified).
inline void select_top(executor& exec, const select_plan& plan, const philox::stream& draw, std::span<const float> g,
                       std::span<const float> e, std::span<float> staged, select_workspace& ws,
                       sparse_arrays<std::uint32_t> out) {
  const std::size_t n = g.size(), most = plan.max_count;
  const bool compensate = !e.empty();
  BELLOWS_EXPECTS(n == plan.n && out.index.size() == most && (out.value.empty() || out.value.size() == most) &&
                      (!compensate || (e.size() == n && staged.size() == n)),
                  "cuda::select_top: the buffers do not fit the plan: ", plan.k, " to ", most, " of ", plan.n,
                  " for buffers of ", n, ", ", e.size(), ", ", staged.size(), " and ", out.index.size(), " entries");
  cudaStream_t st = exec.stream();
  BELLOWS_CUDA_CHECK(cudaMemsetAsync(ws.non_finite, 0, sizeof(unsigned), st));
  if (n == 0) {
    BELLOWS_CUDA_CHECK(cudaMemsetAsync(ws.selected, 0, sizeof(std::uint32_t), st));
    return;
  }
  const float* gp = g.data();
  const float* ep = compensate ? e.data() : nullptr;
  const unsigned blocks = std::min(blocks_for(n, detail::select_threads), 2048u);
  const auto last = static_cast<std::uint32_t>(n - 1);
  const auto radix_select = [&](const float* v, const float* ve, std::size_t count, detail::select_state* state,
                                std::size_t rank, bool after_step0) {
    const unsigned grid = std::min(blocks_for(count, detail::select_threads), 2048u);
    detail::launch(&detail::radix_start_kernel<std::uint32_t>, 1u, detail::select_threads, st, state, ws.hist,
                   static_cast<std::uint32_t>(rank), static_cast<std::uint32_t>(count - 1), after_step0);
    for (unsigned pass = 0; pass < 3; ++pass) {
      detail::launch(&detail::radix_histogram_kernel<float>, grid, detail::select_threads, st, v, ve, count, pass,
                     static_cast<const detail::select_state*>(state), ws.hist, ws.non_finite);
      detail::launch(&detail::radix_pick_kernel<std::uint32_t>, 1u, detail::pick_threads, st, ws.hist, pass, state);
    }
  };
  const bool step0 = ws.sample != nullptr;
  BELLOWS_EXPECTS(step0 == (most > plan.k && plan.sample != 0), "cuda::select_top: the workspace is for ",
                  step0 ? "approximate" : "exact", " mode, the plan (", plan.k, " to ", most, " kept) for the other");
  if (step0) {
    detail::launch(&detail::sample_kernel<float>, std::min(blocks_for(plan.sample, detail::select_threads), 2048u),
                   detail::select_threads, st, gp, ep, n, plan.sample, draw, ws.sample);
    if (plan.upper_rank != 0) radix_select(ws.sample, nullptr, plan.sample, ws.sampled, plan.upper_rank, false);
    radix_select(ws.sample, nullptr, plan.sample, ws.sampled + 1, plan.lower_rank, false);
    detail::launch(&detail::sample_bounds_kernel, 1u, 1u, st, static_cast<const detail::select_state*>(ws.sampled),
                   plan.upper_rank != 0, ws.tally);
    detail::launch(&detail::sample_count_kernel<float>, blocks, detail::select_threads, st, gp, ep, n, ws.tally,
                   ws.non_finite);
    detail::launch(&detail::sample_decide_kernel, 1u, 1u, st, static_cast<const detail::sample_tally*>(ws.tally),
                   ws.state, static_cast<std::uint32_t>(plan.k), static_cast<std::uint32_t>(most),
                   static_cast<std::uint32_t>(std::min<std::size_t>(plan.capacity, 0xFFFFFFFFu)), last);
  }
  radix_select(gp, ep, n, ws.state, plan.k, step0);
  const auto tiles = static_cast<unsigned>((n + detail::tie_tile - 1) / detail::tie_tile);
  detail::launch(&detail::tie_count_kernel<float>, tiles, detail::select_threads, st, gp, ep, n, ws.state,
                 ws.tile_ties);
  detail::launch(&detail::tie_locate_kernel<float>, 1u, detail::pick_threads, st, gp, ep, n, ws.tile_ties, ws.state);
  std::size_t cub_bytes = ws.cub_bytes;
  BELLOWS_CUDA_CHECK(cub::DeviceSelect::If(
      ws.cub, cub_bytes, thrust::counting_iterator<std::uint32_t>(0), out.index.data(), ws.selected,
      static_cast<int>(n), detail::keep_op{gp, ep, compensate ? staged.data() : nullptr, ws.state, n}, st));
  detail::launch(&detail::gather_values_kernel<float>, blocks_for(most, detail::select_threads), detail::select_threads,
                 st, gp, ep, out.index.data(), static_cast<const std::uint32_t*>(ws.selected),
                 out.value.empty() ? nullptr : out.value.data());
}

}  // namespace bellows::cuda
