// SPDX-License-Identifier: Apache-2.0
// Top-k on the device: topk<cuda::executor>, the compressor of compressors/topk.hpp in exact
// mode with its state and payloads in device memory, exchanged through a DeviceCollective
// (collectives::nccl). Every rank's result, error memory, step counter and traffic are those of
// topk<cpu::executor> for the same inputs, bit for bit: the same kept set (cuda/select.cuh finds
// the CPU's, ties to the lower index), the same payload bytes, and the sums in the CPU's order.
//
// One step, all on the executor's stream (the collective's too), averaged as the CPU averages it:
//  - by allgather: select into this rank's slot (the next memory staged in the same pass) ->
//    header (flagged and empty for non-finite input, as on the CPU) -> allgather of the slots ->
//    validation of every payload on the device -> the verdicts copied back: the one wait ->
//    when all are good and finite: zero g, add every rank's entries in rank order, divide;
//  - by one dense allreduce of n + 1 floats when dense_switch finds it cheaper (W k 8 >= 4 n):
//    select -> kept entries written densely, then the non-finite flag -> allreduce -> the flag
//    copied back: the one wait -> when every rank was finite: g = the sums / W.
// Then the staged memory becomes current. A malformed payload raises the CPU validation's
// wire_error (cuda::payload_slots copies it back for detail::read_sparse), naming the rank.
// Approximate mode is not on the device: the constructor refuses it.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "bellows/compressors/detail/device_sparse.cuh"
#include "bellows/compressors/detail/sparse_codec.hpp"
#include "bellows/compressors/topk.hpp"
#include "bellows/concepts.hpp"
#include "bellows/core/checked.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/cuda/buffer.cuh"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/transfer.cuh"
#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/launch.cuh"
#include "bellows/compressors/detail/device_state.cuh"
#include "bellows/cuda/payload_slots.cuh"
#include "bellows/cuda/select.cuh"
#include "bellows/cuda/sparse.cuh"
#include "bellows/plan/select.hpp"

namespace bellows::cuda::detail {

/// Writes the header `h` (k entries) at the start of this rank's payload, or, when *non_finite,
/// the header of the empty payload flagged non-finite. One thread.
__global__ void finish_sparse_payload_kernel(std::byte* payload, wire::header h, const unsigned* non_finite) {
  if (*non_finite != 0) {
    h.flags |= wire::flag::non_finite;
    h.count = 0;
    h.body_bytes = 0;
  }
  *reinterpret_cast<wire::header*>(payload) = h;
}

/// Validates `ranks` sparse payloads of 32-bit indices, slot r holding rank r's, as
/// detail::read_sparse does for exactly want.count entries: the header (or the empty flagged
/// one), every index below n and above the one before it, every value finite. Item j < k of a
/// rank is its entry j, item k its header. OR-s into verdict[r] and verdict[ranks].
__global__ void check_sparse_payloads_kernel(const std::byte* slots, std::size_t slot, std::size_t ranks,
                                             wire::header want, unsigned* verdict) {
  const std::size_t k = want.count, items = k + 1;
  for (std::size_t t = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; t < ranks * items;
       t += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t r = t / items, j = t % items;
    const std::byte* p = slots + r * slot;
    const wire::header& h = *reinterpret_cast<const wire::header*>(p);
    const bool flagged = (h.flags & wire::flag::non_finite) != 0;
    unsigned bad = 0;
    if (j < k) {
      const auto* index = reinterpret_cast<const std::uint32_t*>(p + wire::header_bytes);
      const float v = reinterpret_cast<const float*>(p + wire::header_bytes + 4 * k)[j];
      if (!flagged && (index[j] >= want.n || (j > 0 && index[j - 1] >= index[j]) ||
                       (__float_as_uint(v) & 0x7FFFFFFFu) >= 0x7F800000u))
        bad = cuda::payload_malformed;
    } else {
      const bool ok = h.magic == want.magic && h.version == want.version && h.codec == want.codec &&
                      (h.flags & ~wire::flag::non_finite) == 0 && h.n == want.n && h.param == 0 && h.reserved == 0 &&
                      (flagged ? h.count == 0 && h.body_bytes == 0 : h.count == k && h.body_bytes == want.body_bytes);
      bad = !ok ? cuda::payload_malformed : flagged ? cuda::payload_non_finite : 0u;
    }
    if (bad != 0) {
      atomicOr(&verdict[r], bad);
      atomicOr(&verdict[ranks], bad);
    }
  }
}

}  // namespace bellows::cuda::detail

namespace bellows {

template <>
class topk<cuda::executor> : public detail::device_sparse_codec<topk<cuda::executor>, topk_params> {
  using base = detail::device_sparse_codec<topk<cuda::executor>, topk_params>;

public:
  /// One layer: step counter, error memory and its staged successor (device_sparse_state), the
  /// selection plan, and in device memory the workspace of either way of averaging (sized by the
  /// first step).
  struct state : detail::device_sparse_state {
    select_plan plan;
    cuda::payload_slots slots;                 ///< by allgather: every rank's payload, and the verdicts
    cuda::device_buffer<std::uint32_t> index;  ///< dense: the kept entries
    cuda::device_buffer<float> values;
    cuda::device_buffer<float> dense;  ///< dense: n sums, then the non-finite flag
    float flag = 0.0f;                 ///< dense: the flag's sum over ranks, read back
    unsigned own = 0;                  ///< dense: this rank's non-finite word, read back

    /// The elements kept per step.
    [[nodiscard]] std::size_t k() const noexcept { return plan.k; }
  };

  static constexpr const char* name = "topk";

  explicit topk(topk_params params = {}, cuda::executor& exec = cuda::executor::shared()) : base(params, exec) {
    BELLOWS_EXPECTS(params.mode == topk_mode::exact, "topk<cuda::executor>: mode ", to_string(params.mode),
                    " is not on the device (exact mode only)");
  }

  [[nodiscard]] bellows::aggregation aggregation() const noexcept { return bellows::aggregation::allgather; }

  /// Validates the parameters for the layer (raising bellows::error that names both) and sizes
  /// the state; reserves the executor's workspace for the selection (layers below 2^31 elements).
  [[nodiscard]] state make_state(const layer_info& layer) const {
    state st;
    start(st, layer);
    plan(st);
    return st;
  }

  /// One step (a collective call; see the file's comment). `inout` is device memory; the
  /// collective enqueues on the executor's stream. Waits for that stream once, for the verdicts.
  template <DeviceCollective Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    check(st, inout.size(), coll.stream());
    follow(st);
    const reduce_result r = params_.dense_switch && detail::dense_is_cheaper(st.layer.size(), coll.size(), st.plan.k)
                                ? dense_step(st, inout, coll)
                                : sparse_step(st, inout, coll);
    if (r.status == step_status::ok) commit(st);
    return r;
  }

private:
  /// Plans the selection of this compressor's k (validating the parameters for the layer) and
  /// reserves its workspace.
  void plan(state& st) const {
    const std::size_t k = kept(st.layer);
    st.plan = plan_select(st.layer.size(), k, k);
    exec_->reserve(cuda::select_workspace::bytes(st.plan));
  }

  /// plan() again for a state planned for another k (made by the other level's compressor of a
  /// Synchronizer), as the CPU's fit() does: allocates only then.
  void follow(state& st) const {
    if (st.plan.k != kept(st.layer)) plan(st);
  }

  template <class Coll>
  reduce_result sparse_step(state& st, std::span<float> inout, Coll& coll) {
    const std::size_t n = st.layer.size(), k = st.plan.k, ranks = coll.size(), rank = coll.rank();
    const std::size_t bytes = detail::sparse_payload_bytes(n, k);
    const cudaStream_t stream = exec_->stream();
    cuda::payload_slots& slots = st.slots;
    slots.prepare(ranks, bytes, stream);
    wire::header h{};
    h.codec = topk_method::codec.id;
    h.n = n;
    h.count = k;
    h.body_bytes = bytes - wire::header_bytes;

    std::byte* mine = slots.of(rank);
    const auto index_of = [&](std::size_t r) {
      return reinterpret_cast<std::uint32_t*>(slots.of(r) + wire::header_bytes);
    };
    const auto values_of = [&](std::size_t r) {
      return reinterpret_cast<float*>(slots.of(r) + wire::header_bytes + 4 * k);
    };
    cuda::select_workspace ws(st.plan, exec_->workspace());
    select_top(*exec_, st.plan, inout, st.memory.span(), st.staged.span(), ws,
               sparse_arrays<std::uint32_t>{{index_of(rank), k}, {values_of(rank), k}});
    cuda::detail::launch(&cuda::detail::finish_sparse_payload_kernel, 1u, 1u, stream, mine, h, ws.non_finite);
    coll.allgather_slots(std::span<const std::byte>(mine, bytes), slots.all(), slots.slot());
    const unsigned blocks = std::min(cuda::blocks_for(ranks * (k + 1), 256), 4096u);
    cuda::detail::launch(&cuda::detail::check_sparse_payloads_kernel, blocks, 256u, stream, slots.all().data(),
                         slots.slot(), ranks, h, slots.verdicts());
    slots.read_verdicts(*exec_);

    if ((slots.worst() & cuda::payload_malformed) != 0)
      slots.report_malformed(*exec_, name, st.layer, [&](std::span<const std::byte> payload) {
        (void)detail::read_sparse(payload, topk_method::codec, st.layer, k, k);
      });
    const bool mine_finite = (slots.verdict(rank) & cuda::payload_non_finite) == 0;
    const reduce_result r{slots.worst() != 0 ? step_status::non_finite : step_status::ok,
                          mine_finite ? traffic{bytes, k, k} : traffic{wire::header_bytes, 0, 0}};
    if (r.status != step_status::ok) return r;
    fill(*exec_, inout, 0.0f);
    for (std::size_t q = 0; q < ranks; ++q)
      scatter_add(*exec_, inout, std::span<const std::uint32_t>(index_of(q), k),
                  std::span<const float>(values_of(q), k));
    if (ranks != 1) divide(*exec_, inout, static_cast<float>(ranks));
    return r;
  }

  template <class Coll>
  reduce_result dense_step(state& st, std::span<float> inout, Coll& coll) {
    const std::size_t n = st.layer.size(), k = st.plan.k;
    const cudaStream_t stream = exec_->stream();
    st.index.fit(k, stream);
    st.values.fit(k, stream);
    st.dense.fit(n + 1, stream);
    const std::span<float> sums(st.dense.data(), n);
    cuda::select_workspace ws(st.plan, exec_->workspace());
    select_top(*exec_, st.plan, inout, st.memory.span(), st.staged.span(), ws,
               sparse_arrays<std::uint32_t>{{st.index.data(), k}, {st.values.data(), k}});
    fill(*exec_, sums, 0.0f);
    scatter(*exec_, sums, std::span<const std::uint32_t>(st.index.data(), k),
            std::span<const float>(st.values.data(), k));
    flag_to_float(*exec_, ws.non_finite, st.dense.data() + n);
    coll.allreduce_sum(std::span<float>(st.dense.data(), n + 1));
    BELLOWS_CUDA_CHECK(cudaMemcpyAsync(&st.flag, st.dense.data() + n, sizeof(float), cudaMemcpyDeviceToHost, stream));
    BELLOWS_CUDA_CHECK(cudaMemcpyAsync(&st.own, ws.non_finite, sizeof(unsigned), cudaMemcpyDeviceToHost, stream));
    exec_->synchronize();
    const reduce_result r{st.flag != 0.0f ? step_status::non_finite : step_status::ok,
                          {(n + 1) * sizeof(float), n + 1, st.own != 0 ? 0 : k}};
    if (r.status == step_status::ok) divide(*exec_, inout, sums, static_cast<float>(coll.size()));
    return r;
  }
};

static_assert(Compressor<topk<cuda::executor>, archetypes::device_collective>,
              "topk<cuda::executor> must model Compressor over a DeviceCollective");

}  // namespace bellows
