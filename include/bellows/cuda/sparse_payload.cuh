// SPDX-License-Identifier: Apache-2.0
// The device's sparse payloads (plan/sparse.hpp: header, ascending indices, then their values),
// at the level the code written once over executors asks for (compressors/detail/sparse_codec.hpp),
// as the CPU's are in cpu/sparse_payload.hpp: top-k's selection and rand-k's draw written into a
// payload's storage (32-bit indices: the device takes layers below 2^31 elements for top-k and
// below 2^32 for rand-k, and refuses others when a state is made), top-k's selection written
// densely, the header, the validation of every rank's payload in one launch and their average.
// A layer's selection and draw carve their workspace from the executor's at each call, so the
// workspace a state holds is empty here; fit_workspace reserves the executor's instead.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

#include "bellows/core/philox.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/launch.cuh"
#include "bellows/cuda/payload_slots.cuh"
#include "bellows/cuda/sample.cuh"
#include "bellows/cuda/select.cuh"
#include "bellows/cuda/sparse.cuh"
#include "bellows/plan/payload_slots.hpp"
#include "bellows/plan/sample.hpp"
#include "bellows/plan/select.hpp"
#include "bellows/plan/sparse.hpp"

namespace bellows::cuda {

namespace detail {

/// Launches the validation of `ranks` sparse payloads of `shape` laid `slot` bytes apart.
inline void check_sparse(executor& exec, const std::byte* slots, std::size_t slot, std::size_t ranks,
                         const sparse_payload& shape, std::size_t least, std::size_t most, unsigned* verdicts,
                         std::uint32_t* counts, float* gate) {
  const unsigned blocks = std::min(blocks_for(ranks * (most + 1), 256), 4096u);
  launch(&check_sparse_payloads_kernel, blocks, 256u, exec.stream(), slots, slot, ranks, shape.header, least, most,
         verdicts, counts, gate);
}

}  // namespace detail

/// Reserves the executor's workspace for a selection or a draw of `plan` (raising bellows::error
/// for a layer the device does not take).
template <class Workspace, class Plan>
void fit_workspace(executor& exec, Workspace& /*held*/, const Plan& plan) {
  exec.reserve(Workspace::bytes(plan));
}

/// cpu::select_into_payload on the device: the selection into `body` (room for plan.max_count
/// entries), its count and non-finite word in the executor's workspace.
inline sparse_words<std::uint32_t> select_into_payload(executor& exec, const select_plan& plan,
                                                       const philox::stream& draw, std::span<const float> g,
                                                       std::span<const float> e, std::span<float> staged,
                                                       select_workspace& /*held*/, std::span<std::byte> body) {
  select_workspace ws(plan, exec.workspace());
  select_top(exec, plan, draw, g, e, staged, ws,
             {payload_entries<std::uint32_t>(body.data(), plan.max_count).first, {}});
  return {ws.non_finite, ws.selected};
}

/// cpu::select_into_dense on the device: the selection into `body` as scratch (indices, then
/// values, room for plan.max_count each), then scattered into `dense` zeroed.
inline sparse_words<std::uint32_t> select_into_dense(executor& exec, const select_plan& plan,
                                                     const philox::stream& draw, std::span<const float> g,
                                                     std::span<const float> e, std::span<float> staged,
                                                     select_workspace& /*held*/, std::span<std::byte> body,
                                                     std::span<float> dense) {
  select_workspace ws(plan, exec.workspace());
  const auto [index, value] = payload_entries<std::uint32_t>(body.data(), plan.max_count);
  select_top(exec, plan, draw, g, e, staged, ws, {index, value});
  fill(exec, dense, 0.0f);
  scatter(exec, dense, std::span<const std::uint32_t>(index), std::span<const float>(value), ws.selected);
  return {ws.non_finite, ws.selected};
}

/// cpu::draw_into_payload on the device: the draw, then its k entries into `body`.
inline sparse_words<std::uint32_t> draw_into_payload(executor& exec, const sample_plan& plan,
                                                     const philox::stream& draw, sample_workspace& /*held*/,
                                                     std::span<const float> g, std::span<const float> e,
                                                     std::span<float> staged, std::span<std::byte> body, float scale) {
  sample_workspace ws(plan, exec.workspace());
  draw_sample(exec, plan, draw, ws);
  const auto [index, value] = payload_entries<std::uint32_t>(body.data(), plan.k);
  gather_sample(exec, plan, ws, g, e, staged, {index, value}, scale);
  return {ws.non_finite};
}

/// Writes the header of the payload a selection reported in `words` (device memory), as the
/// CPU's finish_payload does; enqueued. Entries of 32-bit indices leave no padding.
inline void finish_payload(executor& exec, std::span<std::byte> payload, const sparse_payload& shape,
                           sparse_words<std::uint32_t> words) {
  detail::launch(&detail::finish_sparse_payload_kernel, 1u, 1u, exec.stream(), payload.data(), shape.header,
                 words.non_finite, words.count);
}

/// Every gathered sparse payload of `shape` validated on the device, each rank's count written,
/// the gate set and the verdicts and counts sent back, as the scaled payloads' check_payloads
/// does; enqueued, no wait.
template <class Check>
void check_payloads(executor& exec, payload_slots& slots, std::string_view /*who*/, const layer_info& /*layer*/,
                    const sparse_payload& shape, Check&& /*check*/) {
  detail::check_sparse(exec, slots.all().data(), slots.slot(), slots.ranks(), shape, shape.least, shape.most,
                       slots.verdicts(), slots.counts(), slots.gate());
  slots.send_verdicts(exec);
}

/// The status of one sparse payload of `shape` in device memory, as `check` (the CPU's
/// validation) gives it: see validate_device_payload. Its count is read from its size.
template <class Check>
[[nodiscard]] step_status validate_payload(executor& exec, std::string_view who, const layer_info& layer,
                                           std::span<const std::byte> payload, const sparse_payload& shape,
                                           Check&& check) {
  const std::size_t entries =
      payload.size() > wire::header_bytes ? (payload.size() - wire::header_bytes) / detail::sparse_body_bytes(1) : 0;
  const std::size_t count = std::clamp(entries, shape.least, shape.most);
  return validate_device_payload(
      who, layer, exec, payload, sparse_payload_bytes(shape.header.n, count), wire::header_bytes,
      [&](const payload_words& words) {
        detail::check_sparse(exec, payload.data(), payload.size(), 1, shape, count, count, words.verdicts, words.count,
                             nullptr);
      },
      [&](std::span<const std::byte> host) { return check(host); });
}

/// After check_payloads: out zeroed, every rank's entries (as many as its count in device
/// memory) added in rank order, the sums divided by W (the CPU's scatter_average); enqueued,
/// and nothing written unless every payload proved good and finite (the slots' gate).
inline void average_payloads(executor& exec, const payload_slots& slots, const sparse_payload& shape,
                             std::span<float> out) {
  fill(exec, out, 0.0f, slots.gate());
  for (std::size_t q = 0; q < slots.ranks(); ++q)
    detail::scatter_payload(exec, out, slots.of(q) + wire::header_bytes, shape.most, slots.device_count(q),
                            slots.gate());
  if (slots.ranks() != 1) divide(exec, out, out, static_cast<float>(slots.ranks()), slots.gate());
}

}  // namespace bellows::cuda

namespace bellows {
template <>
struct sparse_count_of<cuda::executor> {
  using type = std::uint32_t;
};
template <>
struct select_workspace_of<cuda::executor> {
  using type = cuda::select_workspace;
};
template <>
struct sample_workspace_of<cuda::executor> {
  using type = cuda::sample_workspace;
};
}  // namespace bellows
