// SPDX-License-Identifier: Apache-2.0
// Kept values put back into a dense buffer on the device: cpu/sparse.hpp's scatter-add, and the
// plain scatter of the dense top-k average (cpu::select_top_dense's writes); and the header and
// the validation of the sparse payloads (32-bit indices) of top-k and rand-k.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "bellows/core/error.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/launch.cuh"
#include "bellows/cuda/payload_slots.cuh"

namespace bellows::cuda {

namespace detail {

inline constexpr unsigned scatter_threads = 256;

/// The body bytes of a sparse payload of `count` entries with 32-bit indices: the indices, then
/// the values, 8 bytes an entry, already a multiple of wire::body_alignment (as
/// sparse_payload_bytes(n, count) - wire::header_bytes for n below 2^32).
__host__ __device__ constexpr std::uint64_t sparse_body_bytes(std::uint64_t count) noexcept { return 8 * count; }

/// Writes the header `h` at the start of this rank's payload, with `*count` entries when `count`
/// is not null (h.count's otherwise), or, when *non_finite, the header of the empty payload
/// flagged non-finite. One thread.
__global__ void finish_sparse_payload_kernel(std::byte* payload, wire::header h, const unsigned* non_finite,
                                             const std::uint32_t* count) {
  if (count != nullptr) {
    h.count = *count;
    h.body_bytes = sparse_body_bytes(h.count);
  }
  if (*non_finite != 0) {
    h.flags |= wire::flag::non_finite;
    h.count = 0;
    h.body_bytes = 0;
  }
  *reinterpret_cast<wire::header*>(payload) = h;
}

/// Validates `ranks` sparse payloads of 32-bit indices, slot r holding rank r's, as
/// detail::read_sparse does for least to most entries: the header (or the empty flagged one),
/// every index below n and above the one before it, every value finite. Item j < most of a
/// rank is its entry j (when the header's count reaches it), item `most` its header, whose count
/// goes to count[r] (0 when flagged or out of range). OR-s into verdict[r] and verdict[ranks],
/// and sets *gate to 1.0f (when not null) for any finding.
__global__ void check_sparse_payloads_kernel(const std::byte* slots, std::size_t slot, std::size_t ranks,
                                             wire::header want, std::size_t least, std::size_t most, unsigned* verdict,
                                             std::uint32_t* count, float* gate) {
  const std::size_t items = most + 1;
  for (std::size_t t = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; t < ranks * items;
       t += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t r = t / items, j = t % items;
    const std::byte* p = slots + r * slot;
    const wire::header& h = *reinterpret_cast<const wire::header*>(p);
    const bool flagged = (h.flags & wire::flag::non_finite) != 0;
    const bool counted = !flagged && h.count >= least && h.count <= most;
    const std::size_t k = counted ? h.count : 0;
    unsigned bad = 0;
    if (j < k) {
      const auto* index = reinterpret_cast<const std::uint32_t*>(p + wire::header_bytes);
      const float v = reinterpret_cast<const float*>(p + wire::header_bytes + 4 * k)[j];
      if (index[j] >= want.n || (j > 0 && index[j - 1] >= index[j]) ||
          (__float_as_uint(v) & 0x7FFFFFFFu) >= 0x7F800000u)
        bad = cuda::payload_malformed;
    } else if (j == most) {
      const bool ok =
          h.magic == want.magic && h.version == want.version && h.codec == want.codec &&
          (h.flags & ~wire::flag::non_finite) == 0 && h.n == want.n && h.param == 0 && h.reserved == 0 &&
          (flagged ? h.count == 0 && h.body_bytes == 0 : counted && h.body_bytes == sparse_body_bytes(h.count));
      bad = !ok ? cuda::payload_malformed : flagged ? cuda::payload_non_finite : 0u;
      count[r] = static_cast<std::uint32_t>(k);
    }
    if (bad != 0) {
      atomicOr(&verdict[r], bad);
      atomicOr(&verdict[ranks], bad);
      if (gate != nullptr) *gate = 1.0f;
    }
  }
}

/// Entries j < count, or < *used when `used` is not null; none when `skip` points to a float
/// that is not 0.
template <class Index>
__global__ void scatter_kernel(float* out, const Index* index, const float* value, std::size_t count,
                               const std::uint32_t* used, bool add, const float* skip) {
  if (skip != nullptr && *skip != 0.0f) return;
  if (used != nullptr) count = min(count, std::size_t{*used});
  for (std::size_t j = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; j < count;
       j += std::size_t{gridDim.x} * blockDim.x)
    out[index[j]] = add ? __fadd_rn(out[index[j]], value[j]) : value[j];
}

template <class Index>
void scatter(executor& exec, std::span<float> out, std::span<const Index> index, std::span<const float> value,
             const std::uint32_t* used, bool add, const float* skip = nullptr) {
  BELLOWS_EXPECTS(value.size() == index.size(), "cuda::scatter: ", index.size(), " indices but ", value.size(),
                  " values");
  if (index.empty()) return;
  const unsigned blocks = std::min(blocks_for(index.size(), scatter_threads), 4096u);
  launch(&scatter_kernel<Index>, blocks, scatter_threads, exec.stream(), out.data(), index.data(), value.data(),
         index.size(), used, add, skip);
}

/// acc[index[j]] += value[j] for the entries j < *count of a payload body of 32-bit indices at
/// `body` (the indices, then the values); none when *skip is not 0.
__global__ void scatter_payload_kernel(float* acc, const std::byte* body, std::size_t most, const std::uint32_t* count,
                                       const float* skip) {
  if (*skip != 0.0f) return;
  const std::size_t k = min(most, std::size_t{*count});
  const auto* index = reinterpret_cast<const std::uint32_t*>(body);
  const auto* value = reinterpret_cast<const float*>(body + 4 * k);
  for (std::size_t j = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; j < k;
       j += std::size_t{gridDim.x} * blockDim.x)
    acc[index[j]] = __fadd_rn(acc[index[j]], value[j]);
}

/// scatter_payload_kernel over up to `most` entries; enqueued.
inline void scatter_payload(executor& exec, std::span<float> acc, const std::byte* body, std::size_t most,
                            const std::uint32_t* count, const float* skip) {
  if (most == 0) return;
  const unsigned blocks = std::min(blocks_for(most, scatter_threads), 4096u);
  launch(&scatter_payload_kernel, blocks, scatter_threads, exec.stream(), acc.data(), body, most, count, skip);
}

}  // namespace detail

/// out[index[j]] = value[j] for distinct indices below out.size() (device memory); with `used`,
/// for the first *used entries only (a count in device memory, such as select_top's).
inline void scatter(executor& exec, std::span<float> out, std::span<const std::uint32_t> index,
                    std::span<const float> value, const std::uint32_t* used = nullptr) {
  detail::scatter(exec, out, index, value, used, false);
}

/// acc[index[j]] += value[j] for distinct indices below acc.size() (device memory), as
/// cpu::scatter_add: distinct indices make every sum the CPU's; nothing when `skip` points to a
/// float (device memory) that is not 0, read on the device.
template <class Index>
void scatter_add(executor& exec, std::span<float> acc, std::span<const Index> index, std::span<const float> value,
                 const float* skip = nullptr) {
  detail::scatter(exec, acc, index, value, nullptr, true, skip);
}

}  // namespace bellows::cuda
