// SPDX-License-Identifier: Apache-2.0
// Top-k's cyclic leader on the device: cpu/index_list.hpp's steps with the same arguments (spans
// over device memory) and bits, enqueued on the executor's stream. The summed list's check sets
// the slots' gate, which the steps after it read, and its verdict and count reach pinned host
// memory without a wait; a malformed list is reported after the step's wait by the host's
// validation of a copy (report_index_list).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "bellows/core/error.hpp"
#include "bellows/core/philox.hpp"
#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/float_array.cuh"
#include "bellows/cuda/launch.cuh"
#include "bellows/cuda/payload_slots.cuh"
#include "bellows/cuda/select.cuh"
#include "bellows/plan/index_list.hpp"
#include "bellows/plan/select.hpp"
#include "bellows/plan/sparse.hpp"

namespace bellows::cuda {

namespace detail {

inline constexpr unsigned list_threads = 256;

[[nodiscard]] inline unsigned list_blocks(std::size_t items) noexcept {
  return std::min(blocks_for(items, list_threads), 4096u);
}

/// Item j < *count writes entry j's index, item `most` the count; nothing when *non_finite.
__global__ void write_index_list_kernel(float* list, const std::uint32_t* index, const std::uint32_t* count,
                                        const unsigned* non_finite, index_list_layout at) {
  if (*non_finite != 0) return;
  for (std::size_t j = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; j <= at.most;
       j += std::size_t{gridDim.x} * blockDim.x) {
    if (j == at.most)
      at.put(list + at.count_at(), *count);
    else if (j < *count)
      at.put(list + at.entry_at(j), index[j]);
  }
}

/// The host's read_index_list on the device: item j < most checks entry j (a whole number below
/// n, above entry j - 1), item `most` the count (in [least, most]), which goes to *count (0 when
/// it is not one). A verdict that is not 0 skips the checks and marks verdict[0] and [1]
/// non-finite; a finding marks them malformed. Either sets *gate to 1.0f.
__global__ void check_index_list_kernel(const float* list, index_list_layout at, std::uint64_t n, std::size_t least,
                                        unsigned* verdict, std::uint32_t* count, float* gate) {
  const bool finite = list[0] == 0.0f;
  std::uint64_t c = 0;
  const bool counted = at.get(list + at.count_at(), c) && c >= least && c <= at.most;
  for (std::size_t j = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; j <= at.most;
       j += std::size_t{gridDim.x} * blockDim.x) {
    unsigned bad = 0;
    if (!finite) {
      if (j == 0) bad = payload_non_finite;
    } else if (j == at.most) {
      *count = counted ? static_cast<std::uint32_t>(c) : 0u;
      if (!counted) bad = payload_malformed;
    } else if (counted && j < c) {
      std::uint64_t i = 0, before = 0;
      if (!at.get(list + at.entry_at(j), i) || i >= n ||
          (j > 0 && (!at.get(list + at.entry_at(j - 1), before) || before >= i)))
        bad = payload_malformed;
    }
    if (bad != 0) {
      atomicOr(&verdict[0], bad);
      atomicOr(&verdict[1], bad);
      *gate = 1.0f;
    }
  }
}

/// Item j < most: values[j] = from[index j] (then zeroed there 0, when not null) below the
/// count, else 0.
__global__ void take_at_list_kernel(float* values, const float* from, float* zeroed, const float* list,
                                    index_list_layout at, const float* skip, const std::uint32_t* count) {
  const bool off = *skip != 0.0f;
  for (std::size_t j = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; j < at.most;
       j += std::size_t{gridDim.x} * blockDim.x) {
    std::uint64_t i = 0;
    if (off || j >= *count || !at.get(list + at.entry_at(j), i)) {
      values[j] = 0.0f;
      continue;
    }
    values[j] = from[i];
    if (zeroed != nullptr) zeroed[i] = 0.0f;
  }
}

/// Item j < count: out[index j] = sums[j] / d; nothing when *skip is not 0.
__global__ void scatter_list_kernel(float* out, const float* list, index_list_layout at, const float* sums, float d,
                                    const float* skip, const std::uint32_t* count) {
  if (*skip != 0.0f) return;
  for (std::size_t j = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; j < *count;
       j += std::size_t{gridDim.x} * blockDim.x) {
    std::uint64_t i = 0;
    if (at.get(list + at.entry_at(j), i)) out[i] = __fdiv_rn(sums[j], d);
  }
}

}  // namespace detail

/// cpu::select_index_list on the device: the selection's indices into `scratch`, then the list.
inline void select_index_list(executor& exec, const select_plan& plan, const philox::stream& draw,
                              std::span<const float> m, select_workspace& /*held*/, std::span<std::byte> scratch,
                              std::span<float> list) {
  select_workspace ws(plan, exec.workspace());
  const auto index = payload_entries<std::uint32_t>(scratch.data(), plan.max_count).first;
  select_top(exec, plan, draw, m, {}, {}, ws, {index, {}});
  const index_list_layout at(plan.n, plan.max_count);
  detail::launch(&detail::write_index_list_kernel, detail::list_blocks(at.most + 1), detail::list_threads,
                 exec.stream(), list.data(), index.data(), ws.selected, ws.non_finite, at);
}

/// cpu::check_index_list on the device: the check kernel over `slots`' words (prepared for one
/// rank), then the verdict, the malformed word and the count copied into the host's `verdict`,
/// `malformed` and `count` (pinned) without a wait. `check` serves report_index_list.
template <class Slots, class Check>
[[nodiscard]] index_list_words<std::uint32_t> check_index_list(executor& exec, Slots& slots,
                                                               std::span<const float> list, const index_list_layout& at,
                                                               std::uint64_t n, std::size_t least, float& verdict,
                                                               unsigned& malformed, std::uint32_t& count,
                                                               Check&& /*check*/) {
  detail::launch(&detail::check_index_list_kernel, detail::list_blocks(at.most + 1), detail::list_threads,
                 exec.stream(), list.data(), at, n, least, slots.verdicts(), slots.counts(), slots.gate());
  copy_word(exec, verdict, list.data());
  copy_word(exec, malformed, static_cast<const unsigned*>(slots.verdicts()));
  copy_word(exec, count, static_cast<const std::uint32_t*>(slots.counts()));
  return {slots.gate(), slots.counts()};
}

/// After the step's wait, when the check marked the list malformed: raises the wire_error that
/// `check(list)` (the host's validation) raises for a host copy of it.
template <class Check>
void report_index_list(executor& exec, std::span<const float> list, unsigned malformed, Check&& check) {
  if ((malformed & payload_malformed) == 0) return;
  with_host_copy(exec, std::as_bytes(list), [&](std::span<const std::byte> bytes) {
    (void)check(std::span<const float>(reinterpret_cast<const float*>(bytes.data()), list.size()));
  });
  fail<error>("topk: the device found a leader's index list malformed and the host's validation did not (a bug in "
              "bellows)");
}

/// cpu::take_at_list on the device.
inline void take_at_list(executor& exec, std::span<float> values, std::span<const float> from, std::span<float> zeroed,
                         std::span<const float> list, const index_list_layout& at, index_list_words<std::uint32_t> w) {
  if (at.most == 0) return;
  detail::launch(&detail::take_at_list_kernel, detail::list_blocks(at.most), detail::list_threads, exec.stream(),
                 values.data(), from.data(), zeroed.empty() ? nullptr : zeroed.data(), list.data(), at, w.skip,
                 w.count);
}

/// cpu::scatter_list on the device: a gated fill, then the gated scatter.
inline void scatter_list(executor& exec, std::span<float> out, std::span<const float> list, const index_list_layout& at,
                         std::span<const float> sums, float d, index_list_words<std::uint32_t> w) {
  fill(exec, out, 0.0f, w.skip);
  if (at.most == 0) return;
  detail::launch(&detail::scatter_list_kernel, detail::list_blocks(at.most), detail::list_threads, exec.stream(),
                 out.data(), list.data(), at, sums.data(), d, w.skip, w.count);
}

}  // namespace bellows::cuda
