// SPDX-License-Identifier: Apache-2.0
// Rand-k's index draw on the device: the draw cpu/sample.hpp documents (steps 1 to 5), so the
// same plan and Philox stream give the same k indices as the CPU, bit for bit.
//
// The device steps, all enqueued on the executor's stream with no synchronisation:
//  a. propose: one thread per Philox block of the first batch of slots sets the proposed bits
//     of a bitmap over [0, n) (atomicOr) and counts the new ones.
//  b. finish (one block): the rare further rounds while fewer than j indices are distinct, then
//     Floyd's drops (step 4) in one thread, as on the CPU: they are few (about 4 sqrt(D) + 16).
//  c. rank: the count of drawn indices before each word of the bitmap (a scan of popcounts);
//     drop: each word clears its members whose ranks were dropped, and counts what it keeps
//     (the members, or in the complement case the others); a second scan gives each word its
//     first output position.
//  d. gather: one warp per bitmap word writes the kept indices and values, and with error
//     feedback the residual, reading g (and e) once, coalesced.
// Layers of 2^32 elements or more (64-bit proposals on the CPU) are not supported here.
#pragma once

#include <cuda_runtime.h>

#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "bellows/core/error.hpp"
#include "bellows/core/philox.hpp"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/launch.cuh"
#include "bellows/plan/sample.hpp"
#include "bellows/plan/sparse.hpp"

namespace bellows::cuda {

/// The device memory of one draw, carved from the executor's workspace (so it lives until the
/// next call that carves it again): construct it, call draw_sample, then gather_sample.
struct sample_workspace {
  std::uint32_t* chosen = nullptr;    ///< bitmap over [0, n), 32 indices a word
  std::uint32_t* dropped = nullptr;   ///< bitmap over the ranks of S (plus one spare word)
  std::uint32_t* count = nullptr;     ///< per word: members, then kept elements
  std::uint32_t* rank = nullptr;      ///< per word: members of S before it
  std::uint32_t* first = nullptr;     ///< per word: its first output position
  std::uint32_t* distinct = nullptr;  ///< |S|
  unsigned* non_finite = nullptr;     ///< 0 after draw_sample; gather_sample sets 1 for NaN or +-Inf in v
  void* scan = nullptr;               ///< CUB's scratch for the scans
  std::size_t scan_bytes = 0;

  sample_workspace() = default;
  /// Carves the pieces for `plan` from `a` (from executor::workspace()).
  sample_workspace(const sample_plan& plan, arena a) {
    BELLOWS_EXPECTS(plan.n <= 0xFFFFFFFFu, "cuda::sample_workspace: ", plan.n,
                    " elements; the CUDA draw supports layers of fewer than 2^32");
    const std::size_t words = word_count(plan);
    chosen = a.take<std::uint32_t>(words);
    dropped = a.take<std::uint32_t>(plan.batch / 32 + 2);
    count = a.take<std::uint32_t>(words);
    rank = a.take<std::uint32_t>(words);
    first = a.take<std::uint32_t>(words);
    distinct = a.take<std::uint32_t>(1);
    non_finite = a.take<unsigned>(1);
    BELLOWS_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, count, rank, static_cast<int>(words)));
    scan = a.take<std::byte>(scan_bytes);
    used = a.used();
  }

  /// Device bytes a draw of `plan` needs (reserve them in the executor at registration).
  [[nodiscard]] static std::size_t bytes(const sample_plan& plan) { return sample_workspace(plan, arena()).used; }

  [[nodiscard]] static std::size_t word_count(const sample_plan& plan) noexcept {
    return static_cast<std::size_t>((plan.n + 31) / 32);
  }

  std::size_t used = 0;
};

namespace detail {

inline constexpr unsigned sample_threads = 256;

/// Sets the bit of every index that slots [first, last) propose (step 2, 32-bit words) and
/// adds the count of new ones to *distinct. One thread per Philox block.
template <class Stream>
__global__ void propose_kernel(Stream s, std::uint32_t n, std::uint64_t first, std::uint64_t last, std::uint32_t* bits,
                               std::uint32_t* distinct) {
  const std::uint32_t reject_below = (0u - n) % n;
  const std::uint64_t block = first / 4 + blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x;
  unsigned fresh = 0;
  if (block * 4 < last) {
    const philox::u32x4 w = s.block(static_cast<std::uint32_t>(block));
    for (unsigned t = 0; t < 4; ++t) {
      const std::uint64_t q = block * 4 + t;
      const std::uint64_t p = std::uint64_t{w.v[t]} * n;
      if (q < first || q >= last || static_cast<std::uint32_t>(p) < reject_below) continue;
      const auto index = static_cast<std::uint32_t>(p >> 32);
      const std::uint32_t bit = 1u << (index % 32);
      fresh += (atomicOr(bits + index / 32, bit) & bit) == 0;
    }
  }
  fresh = __reduce_add_sync(0xFFFFFFFFu, fresh);
  if (threadIdx.x % 32 == 0 && fresh != 0) atomicAdd(distinct, fresh);
}

/// Step 3's further rounds and step 4's drops, in one block (see the top of the file).
template <class Stream>
__global__ void finish_kernel(Stream s, sample_plan plan, std::uint32_t* bits, std::uint32_t* dropped,
                              std::uint32_t* distinct) {
  __shared__ std::uint32_t have, added;
  const auto n = static_cast<std::uint32_t>(plan.n);
  const std::uint32_t reject_below = (0u - n) % n;
  if (threadIdx.x == 0) {
    have = *distinct;
    added = 0;
  }
  __syncthreads();
  for (std::uint64_t slot = plan.batch; have < plan.chosen; slot += plan.batch - plan.chosen) {
    for (std::uint64_t q = slot + threadIdx.x; q < slot + plan.batch - plan.chosen; q += blockDim.x) {
      const std::uint64_t p = std::uint64_t{s.word(q)} * n;
      if (static_cast<std::uint32_t>(p) < reject_below) continue;
      const auto index = static_cast<std::uint32_t>(p >> 32);
      const std::uint32_t bit = 1u << (index % 32);
      if ((atomicOr(bits + index / 32, bit) & bit) == 0) atomicAdd(&added, 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      have += added;
      added = 0;
    }
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  std::uint64_t cursor = std::uint64_t{1} << 33;
  for (std::uint64_t t = plan.chosen; t < have; ++t) {
    std::uint64_t r = bellows::detail::uniform_below(s, cursor, t + 1);
    if ((dropped[r / 32] >> (r % 32)) & 1u) r = t;
    dropped[r / 32] |= 1u << (r % 32);
  }
  *distinct = have;
}

template <class Word>
__global__ void popcount_kernel(const Word* bits, std::size_t words, std::uint32_t* count) {
  const std::size_t w = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (w < words) count[w] = static_cast<std::uint32_t>(__popc(bits[w]));
}

/// Clears the members of word w whose ranks are dropped; count[w] = the elements it keeps.
template <class Word>
__global__ void drop_kernel(Word* bits, std::size_t words, std::uint64_t n, bool complement, const std::uint32_t* rank,
                            const std::uint32_t* dropped, std::uint32_t* count) {
  const std::size_t w = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
  if (w >= words) return;
  std::uint32_t word = bits[w];
  const auto members = static_cast<unsigned>(__popc(word));
  if (members != 0) {
    const std::uint32_t r0 = rank[w];  // the members' ranks are r0 .. r0 + members - 1
    const std::uint64_t window = (std::uint64_t{dropped[r0 / 32 + 1]} << 32 | dropped[r0 / 32]) >> (r0 % 32);
    std::uint64_t gone = window & ((std::uint64_t{1} << members) - 1);
    std::uint32_t cleared = word;
    for (; gone != 0; gone &= gone - 1) {  // the j-th member (j from 0), for each dropped rank r0 + j
      const unsigned j = static_cast<unsigned>(__ffsll(static_cast<long long>(gone))) - 1;
      cleared &= ~(1u << __fns(word, 0, static_cast<int>(j + 1)));
    }
    word = cleared;
    bits[w] = word;
  }
  const std::uint64_t lo = std::uint64_t{w} * 32;
  const std::uint32_t valid = n - lo >= 32 ? 0xFFFFFFFFu : (1u << (n - lo)) - 1;
  count[w] = static_cast<std::uint32_t>(__popc(complement ? ~word & valid : word));
}

/// Step 5 with the values: one warp per bitmap word.
template <class Word>
__global__ void gather_kernel(const Word* bits, const std::uint32_t* first, std::uint64_t n, bool complement,
                              const float* g, const float* e, float* staged, std::uint32_t* index, float* value,
                              float scale, unsigned* non_finite) {
  const std::size_t warps = std::size_t{gridDim.x} * blockDim.x / 32;
  const unsigned lane = threadIdx.x % 32;
  bool bad = false;
  for (std::size_t w = (blockIdx.x * std::size_t{blockDim.x} + threadIdx.x) / 32; w * 32 < n; w += warps) {
    const std::size_t i = w * 32 + lane;
    if (i >= n) continue;
    const float v = e != nullptr ? __fadd_rn(g[i], e[i]) : g[i];
    bad |= (__float_as_uint(v) & 0x7F800000u) == 0x7F800000u;
    const std::uint32_t word = complement ? ~bits[w] : bits[w];
    const bool keep = (word >> lane) & 1u;
    if (keep) {
      const std::uint32_t at = first[w] + static_cast<std::uint32_t>(__popc(word & ((1u << lane) - 1)));
      index[at] = static_cast<std::uint32_t>(i);
      value[at] = __fmul_rn(scale, v);
    }
    if (staged != nullptr) staged[i] = keep ? 0.0f : v;
  }
  if (bad) *non_finite = 1u;
}

}  // namespace detail

/// Steps 2 to 4 (see cpu/sample.hpp): leaves the chosen set in `ws`, for gather_sample.
inline void draw_sample(executor& exec, const sample_plan& plan, const philox::stream& s, sample_workspace& ws) {
  cudaStream_t st = exec.stream();
  BELLOWS_CUDA_CHECK(cudaMemsetAsync(ws.non_finite, 0, sizeof(unsigned), st));  // an empty layer too
  if (plan.n == 0) return;
  const std::size_t words = sample_workspace::word_count(plan);
  BELLOWS_CUDA_CHECK(cudaMemsetAsync(ws.chosen, 0, words * sizeof(std::uint32_t), st));
  BELLOWS_CUDA_CHECK(cudaMemsetAsync(ws.dropped, 0, (plan.batch / 32 + 2) * sizeof(std::uint32_t), st));
  BELLOWS_CUDA_CHECK(cudaMemsetAsync(ws.distinct, 0, sizeof(std::uint32_t), st));
  if (plan.chosen != 0) {
    const auto n = static_cast<std::uint32_t>(plan.n);
    detail::launch(&detail::propose_kernel<philox::stream>, blocks_for((plan.batch + 3) / 4, detail::sample_threads),
                   detail::sample_threads, st, s, n, 0u, plan.batch, ws.chosen, ws.distinct);
    detail::launch(&detail::finish_kernel<philox::stream>, 1u, 1024u, st, s, plan, ws.chosen, ws.dropped, ws.distinct);
  }
  detail::launch(&detail::popcount_kernel<std::uint32_t>, blocks_for(words, detail::sample_threads),
                 detail::sample_threads, st, ws.chosen, words, ws.count);
  BELLOWS_CUDA_CHECK(
      cub::DeviceScan::ExclusiveSum(ws.scan, ws.scan_bytes, ws.count, ws.rank, static_cast<int>(words), st));
  detail::launch(&detail::drop_kernel<std::uint32_t>, blocks_for(words, detail::sample_threads), detail::sample_threads,
                 st, ws.chosen, words, plan.n, plan.complement, ws.rank, ws.dropped, ws.count);
  BELLOWS_CUDA_CHECK(
      cub::DeviceScan::ExclusiveSum(ws.scan, ws.scan_bytes, ws.count, ws.first, static_cast<int>(words), st));
}

/// Step 5 with the values, as cpu::gather_sample: out receives the plan's k indices (ascending)
/// and value = scale * v[index] for v = g, or v = g + e when `e` is not empty; with `e`,
/// `staged` receives v with zeros at the kept indices. All spans are device memory. Instead of
/// returning false, sets *ws.non_finite to 1 when an element of v is NaN or +-Inf (the caller
/// reads it when it next synchronises).
inline void gather_sample(executor& exec, const sample_plan& plan, sample_workspace& ws, std::span<const float> g,
                          std::span<const float> e, std::span<float> staged, sparse_arrays<std::uint32_t> out,
                          float scale = 1.0f) {
  const std::size_t n = g.size();
  const bool compensate = !e.empty();
  BELLOWS_EXPECTS(n == plan.n && out.index.size() == plan.k && out.value.size() == plan.k &&
                      (!compensate || (e.size() == n && staged.size() == n)),
                  "cuda::gather_sample: the buffers do not fit the plan: ", plan.k, " of ", plan.n, " for buffers of ",
                  n, ", ", e.size(), ", ", staged.size(), " and ", out.index.size(), " entries");
  if (n == 0) return;
  const std::size_t warps = sample_workspace::word_count(plan);
  const unsigned blocks = std::min(blocks_for(warps * 32, detail::sample_threads), 8192u);
  detail::launch(&detail::gather_kernel<std::uint32_t>, blocks, detail::sample_threads, exec.stream(), ws.chosen,
                 ws.first, n, plan.complement, g.data(), compensate ? e.data() : nullptr,
                 compensate ? staged.data() : nullptr, out.index.data(), out.value.data(), scale, ws.non_finite);
}

}  // namespace bellows::cuda
