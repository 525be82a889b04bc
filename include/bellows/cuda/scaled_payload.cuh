// SPDX-License-Identifier: Apache-2.0
// The device side of the payloads that hold one float32 scale per bucket and then packed code
// bytes (QSGD's codes, EF-signSGD's sign bits; plan/payload_slots.hpp's scaled_payload): writing
// one's header and padding, validating every rank's in one launch, and averaging them in one pass
// with the memory's update, each element decoded by the codec's own decoder (cuda/quantize.cuh,
// cuda/signs.cuh). compressors/detail/scaled_codes.hpp builds its step on them; the CPU's forms
// are in cpu/payload_slots.hpp.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/launch.cuh"
#include "bellows/cuda/payload_slots.cuh"
#include "bellows/plan/payload_slots.hpp"

namespace bellows::cuda::detail {

/// Writes the header `h` at the start of `payload`, flagged non-finite when *non_finite, and
/// zeroes the body's padding, bytes [pad, end). One thread.
__global__ void finish_payload_kernel(std::byte* payload, wire::header h, const unsigned* non_finite, std::size_t pad,
                                      std::size_t end) {
  if (*non_finite != 0) h.flags |= wire::flag::non_finite;
  *reinterpret_cast<wire::header*>(payload) = h;
  for (std::size_t i = pad; i < end; ++i) payload[i] = std::byte{0};
}

/// Validates `ranks` payloads, slot r holding rank r's, against the header `want` as the codec's
/// format check does on the host: header fields, the padding after the codes, the unused bits of
/// the last code byte and, unless flagged non-finite, every scale finite and >= 0. Item j of a rank
/// is its scale j, item `want.count` its header. OR-s into verdict[r] and verdict[ranks], and
/// sets *gate to 1.0f (when not null) for any finding.
__global__ void check_payloads_kernel(const std::byte* slots, std::size_t slot, std::size_t ranks, wire::header want,
                                      std::size_t codes_at, std::size_t code_bytes, unsigned used_bits,
                                      unsigned* verdict, float* gate) {
  const std::size_t items = want.count + 1;
  for (std::size_t t = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; t < ranks * items;
       t += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t r = t / items, j = t % items;
    const std::byte* p = slots + r * slot;
    const wire::header& h = *reinterpret_cast<const wire::header*>(p);
    unsigned bad = 0;
    if (j < want.count) {
      const float s = reinterpret_cast<const float*>(p + wire::header_bytes)[j];
      const bool finite = (__float_as_uint(s) & 0x7FFFFFFFu) < 0x7F800000u;
      if ((h.flags & wire::flag::non_finite) == 0 && !(s >= 0.0f && finite)) bad = cuda::payload_malformed;
    } else {
      bool ok = h.magic == want.magic && h.version == want.version && h.codec == want.codec &&
                (h.flags & ~wire::flag::non_finite) == 0 && h.n == want.n && h.count == want.count &&
                h.param == want.param && h.reserved == 0 && h.body_bytes == want.body_bytes;
      for (std::size_t i = codes_at + code_bytes; i < wire::header_bytes + want.body_bytes; ++i)
        ok = ok && p[i] == std::byte{0};
      if (used_bits != 0) ok = ok && (static_cast<unsigned>(p[codes_at + code_bytes - 1]) >> used_bits) == 0;
      bad = !ok ? cuda::payload_malformed : (h.flags & wire::flag::non_finite) != 0 ? cuda::payload_non_finite : 0u;
    }
    if (bad != 0) {
      atomicOr(&verdict[r], bad);
      atomicOr(&verdict[ranks], bad);
      if (gate != nullptr) *gate = 1.0f;
    }
  }
}

/// out[i] = (the sum over ranks, in rank order from 0.0f, of the decoded element i) / ranks, and,
/// when e is not null, e[i] = m[i] - this rank's decoded element i. decode(scales, codes, i) is
/// element i of one payload. Nothing when *gate is not 0.
template <class Decode>
__global__ void average_payloads_kernel(const std::byte* slots, std::size_t slot, std::size_t ranks, std::size_t rank,
                                        std::size_t n, Decode decode, std::size_t codes_at, float* out, const float* m,
                                        float* e, const float* gate) {
  if (*gate != 0.0f) return;
  const auto w = static_cast<float>(ranks);
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    float sum = 0.0f, own = 0.0f;
    for (std::size_t r = 0; r < ranks; ++r) {
      const std::byte* p = slots + r * slot;
      const float v = decode(reinterpret_cast<const float*>(p + wire::header_bytes),
                             reinterpret_cast<const std::uint8_t*>(p + codes_at), i);
      sum = __fadd_rn(sum, v);
      if (r == rank) own = v;
    }
    out[i] = __fdiv_rn(sum, w);  // correctly rounded: the CPU's divide_by_count gives the same float
    if (e != nullptr) e[i] = __fsub_rn(m[i], own);
  }
}

/// Launches the validation of `ranks` payloads of `shape` laid `slot` bytes apart.
inline void check_scaled(executor& exec, const std::byte* slots, std::size_t slot, std::size_t ranks,
                         const scaled_payload& shape, unsigned* verdicts, float* gate) {
  const unsigned blocks = std::min(blocks_for(ranks * (shape.header.count + 1), 256), 4096u);
  launch(&check_payloads_kernel, blocks, 256u, exec.stream(), slots, slot, ranks, shape.header, shape.codes_at,
         shape.code_bytes, shape.used_bits, verdicts, gate);
}

}  // namespace bellows::cuda::detail

namespace bellows::cuda {

/// Writes `shape.header` at the start of `payload`, flagged non-finite when *non_finite (device
/// memory), and zeroes the padding after the packed bytes; enqueued.
inline void finish_payload(executor& exec, std::span<std::byte> payload, const scaled_payload& shape,
                           const unsigned* non_finite) {
  detail::launch(&detail::finish_payload_kernel, 1u, 1u, exec.stream(), payload.data(), shape.header, non_finite,
                 shape.codes_at + shape.code_bytes, shape.bytes);
}

/// Every gathered payload of `shape` validated on the device, the gate set and the verdicts sent
/// back (payload_slots::send_verdicts); enqueued, no wait. slots.status() gives the result
/// after the caller's next wait; `check`, the CPU's validation, is for the CPU's slots.
template <class Check>
void check_payloads(executor& exec, payload_slots& slots, std::string_view /*who*/, const layer_info& /*layer*/,
                    const scaled_payload& shape, Check&& /*check*/) {
  detail::check_scaled(exec, slots.all().data(), slots.slot(), slots.ranks(), shape, slots.verdicts(), slots.gate());
  slots.send_verdicts(exec);
}

/// The status of one payload of `shape` in device memory, as `check` (the CPU's validation)
/// gives it: see validate_device_payload.
template <class Check>
[[nodiscard]] step_status validate_payload(executor& exec, std::string_view who, const layer_info& layer,
                                           std::span<const std::byte> payload, const scaled_payload& shape,
                                           Check&& check) {
  return validate_device_payload(
      who, layer, exec, payload, shape.bytes, shape.bytes,
      [&](const payload_words& words) {
        detail::check_scaled(exec, payload.data(), shape.bytes, 1, shape, words.verdicts, nullptr);
      },
      [&](std::span<const std::byte> host) { return check(host); });
}

/// The next error memory is not written when this rank's payload is, as on the CPU: the
/// averaging pass writes it (average_scaled), reading m once for both.
template <class Layout>
void stage_memory(executor& /*exec*/, std::span<const std::byte> /*payload*/, const Layout& /*layout*/,
                  const scaled_payload& /*shape*/, std::span<float> /*me*/) noexcept {}

/// The average of a step's validated payloads into `out`, and, when `e` is not empty, e = m -
/// this rank's decoded payload, in one pass (e may be m itself: each element reads m before it
/// writes e); `decode` is the codec's decoder. Enqueued after
/// check_payloads, it writes nothing unless every payload proved good and finite (the slots'
/// gate, read on the device).
template <class Decode>
void average_scaled(executor& exec, const payload_slots& slots, const scaled_payload& shape, std::size_t rank,
                    Decode decode, std::span<float> out, std::span<const float> m, std::span<float> e) {
  if (out.empty()) return;
  detail::launch(&detail::average_payloads_kernel<Decode>, detail::stride_blocks(out.size()),
                 detail::elementwise_threads, exec.stream(), slots.all().data(), slots.slot(), slots.ranks(), rank,
                 out.size(), decode, shape.codes_at, out.data(), m.data(), e.empty() ? nullptr : e.data(),
                 slots.gate());
}

}  // namespace bellows::cuda
