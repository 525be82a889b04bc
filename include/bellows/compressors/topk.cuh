// SPDX-License-Identifier: Apache-2.0
// Top-k on the device: topk<cuda::executor>, the compressor of compressors/topk.hpp (exact or
// approximate mode) with its state and payloads in device memory, exchanged through a
// DeviceCollective (collectives::nccl). Every rank's result, error memory, step counter and
// traffic are those of topk<cpu::executor> for the same inputs, bit for bit: the same kept set
// (cuda/select.cuh finds the CPU's: ties to the lower index, and in approximate mode the CPU's
// sample, keyed by seed, step, layer and rank), the same payload bytes, and the sums in the CPU's
// order.
//
// One step, all on the executor's stream (the collective's too), averaged as the CPU averages it:
//  - by allgather: select into this rank's slot (the next memory staged in the same pass) ->
//    header (with the count kept; flagged and empty for non-finite input, as on the CPU) ->
//    allgather of the slots (room for the most entries) -> validation of every payload on the
//    device -> the verdicts and counts copied back: the one wait -> when all are good and finite:
//    zero g, add every rank's entries in rank order, divide;
//  - by one dense allreduce of n + 1 floats when dense_switch finds it cheaper (W most 8 >= 4 n):
//    select -> kept entries written densely, then the non-finite flag -> allreduce -> the flag
//    and the count copied back: the one wait -> when every rank was finite: g = the sums / W.
// Then the staged memory becomes current. A malformed payload raises the CPU validation's
// wire_error (cuda::payload_slots copies it back for detail::read_sparse), naming the rank.
//
// PayloadCodec on device memory, for a trainer that carries the payloads itself: encode (below)
// selects from its input as it is, into the caller's device storage, the CPU's bytes; validate,
// decode_add and max_payload_bytes are detail::device_sparse_codec's, each the CPU's member.
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
#include "bellows/core/philox.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/cuda/buffer.cuh"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/transfer.cuh"
#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/launch.cuh"
#include "bellows/cuda/payload_slots.cuh"
#include "bellows/cuda/select.cuh"
#include "bellows/cuda/sparse.cuh"
#include "bellows/plan/select.hpp"

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
    std::uint32_t count = 0;           ///< dense: this rank's count kept, read back

    /// The elements kept per step (in approximate mode, the least).
    [[nodiscard]] std::size_t k() const noexcept { return plan.k; }
  };

  static constexpr wire::codec codec = topk_method::codec;
  static constexpr const char* name = "topk";

  /// Raises bellows::error naming a parameter out of range (topk_params::validate).
  explicit topk(topk_params params = {}, cuda::executor& exec = cuda::executor::shared()) : base(params, exec) {
    params.validate();
  }

  /// The CPU compressor's rounds: one allgather of the payload, or the dense switch's allreduce.
  [[nodiscard]] exchange_rounds rounds(const state& st, std::size_t ranks) const {
    return detail::topk_rounds(st.layer, counts(st.layer), params_.dense_switch, ranks);
  }

  /// A state for the layer; reserves the executor's workspace for the selection (raising
  /// bellows::error for a layer of 2^31 elements or more) and for the validation of one payload.
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
    check(st, inout.size(), coll);
    follow(st);
    const reduce_result r =
        params_.dense_switch && detail::dense_is_cheaper(st.layer.size(), coll.size(), st.plan.max_count)
            ? dense_step(st, inout, coll)
            : sparse_step(st, inout, coll);
    if (r.status == step_status::ok) commit(st);
    return r;
  }

  /// PayloadCodec encode on device memory: this rank's payload of the entries of largest
  /// magnitude of `in` as it is (no error memory; the step counter is not advanced), written
  /// into `out` (max_payload_bytes from a multiple of 8), the CPU's bytes; in approximate mode
  /// the sample is keyed by the state's step and `rank`, as on the CPU. Waits for the executor's
  /// stream once: the count, and whether the input was finite (the payload of non-finite input
  /// is its header alone, flagged), are known only then. Raises bellows::error when `in`, `out`
  /// or the state does not fit.
  [[nodiscard]] std::span<std::byte> encode(const state& st, std::span<const float> in, std::span<std::byte> out,
                                            std::size_t rank = 0) const {
    const std::size_t k = st.plan.k, most = st.plan.max_count, ours = counts(st.layer).second;
    check_encode(st, in.size(), out, k);
    BELLOWS_EXPECTS(most == ours, name, ": layer '", st.layer.name, "': the state keeps ", k, " to ", most,
                    " elements, this compressor up to ", ours, " (make the state with it)");
    cuda::select_workspace ws(st.plan, exec_->workspace());
    select_top(*exec_, st.plan, sample_key(st, rank), in, {}, {}, ws,
               {detail::sparse_entries_at(out.data(), most).index, {}});
    return finish_encode(st, out, k, {ws.non_finite, ws.selected});
  }

private:
  friend base;

  /// The least and the most entries of a payload: k, and topk_most of it.
  [[nodiscard]] std::pair<std::size_t, std::size_t> counts(const layer_info& layer) const {
    const std::size_t k = kept(layer);
    return {k, topk_most(params_.mode, layer.size(), k)};
  }

  /// The key of the sample of approximate mode, the CPU's.
  [[nodiscard]] philox::stream sample_key(const state& st, std::size_t rank) const noexcept {
    return {params_.seed, static_cast<std::uint32_t>(st.step), st.layer.id, static_cast<std::uint32_t>(rank)};
  }

  /// Plans the selection of this compressor's k (validating the parameters for the layer) and
  /// reserves its workspace, which also serves the validation of one payload.
  void plan(state& st) const {
    const auto [k, most] = counts(st.layer);
    st.plan = plan_select(st.layer.size(), k, most);
    exec_->reserve(std::max(cuda::select_workspace::bytes(st.plan), cuda::payload_words::bytes()));
  }

  /// plan() again for a state planned for another k or mode (made by the other level's
  /// compressor of a Synchronizer), as the CPU's fit() does: allocates only then.
  void follow(state& st) const {
    const auto [k, most] = counts(st.layer);
    if (st.plan.k != k || st.plan.max_count != most) plan(st);
  }

  template <class Coll>
  reduce_result sparse_step(state& st, std::span<float> inout, Coll& coll) {
    return average_by_allgather(st.slots, st, inout, coll, [&](sparse_arrays<std::uint32_t> mine) {
      cuda::select_workspace ws(st.plan, exec_->workspace());
      select_top(*exec_, st.plan, sample_key(st, coll.rank()), inout, st.memory.values(), st.staged.values(), ws,
                 {mine.index, {}});
      return detail::device_selection{ws.non_finite, ws.selected};
    });
  }

  template <class Coll>
  reduce_result dense_step(state& st, std::span<float> inout, Coll& coll) {
    const std::size_t n = st.layer.size(), most = st.plan.max_count;
    const cudaStream_t stream = exec_->stream();
    st.index.fit(most, stream);
    st.values.fit(most, stream);
    st.dense.fit(n + 1, stream);
    const std::span<float> sums(st.dense.data(), n);
    cuda::select_workspace ws(st.plan, exec_->workspace());
    select_top(*exec_, st.plan, sample_key(st, coll.rank()), inout, st.memory.values(), st.staged.values(), ws,
               sparse_arrays<std::uint32_t>{{st.index.data(), most}, {st.values.data(), most}});
    fill(*exec_, sums, 0.0f);
    scatter(*exec_, sums, std::span<const std::uint32_t>(st.index.data(), most),
            std::span<const float>(st.values.data(), most), ws.selected);
    flag_to_float(*exec_, ws.non_finite, st.dense.data() + n);
    coll.allreduce_sum(std::span<float>(st.dense.data(), n + 1));
    BELLOWS_CUDA_CHECK(cudaMemcpyAsync(&st.flag, st.dense.data() + n, sizeof(float), cudaMemcpyDeviceToHost, stream));
    BELLOWS_CUDA_CHECK(cudaMemcpyAsync(&st.own, ws.non_finite, sizeof(unsigned), cudaMemcpyDeviceToHost, stream));
    BELLOWS_CUDA_CHECK(cudaMemcpyAsync(&st.count, ws.selected, sizeof(std::uint32_t), cudaMemcpyDeviceToHost, stream));
    exec_->synchronize();
    const reduce_result r{st.flag != 0.0f ? step_status::non_finite : step_status::ok,
                          {(n + 1) * sizeof(float), n + 1, st.own != 0 ? 0 : std::size_t{st.count}}};
    if (r.status == step_status::ok) divide(*exec_, inout, sums, static_cast<float>(coll.size()));
    return r;
  }
};

static_assert(Compressor<topk<cuda::executor>, archetypes::device_collective>,
              "topk<cuda::executor> must model Compressor over a DeviceCollective");
static_assert(PayloadCodec<topk<cuda::executor>>, "topk<cuda::executor> must model PayloadCodec (device memory)");

}  // namespace bellows
