// SPDX-License-Identifier: Apache-2.0
// Rand-k on the device: randk<cuda::executor>, the compressor of compressors/randk.hpp with its
// state in device memory, exchanged through a DeviceCollective (collectives::nccl). Every rank's result, error memory and step counter are those of
// randk<cpu::executor> for the same inputs, bit for bit: the same draw (cuda/sample.cuh gives
// the CPU's indices), the same gathered values, and the same quotient for the average.
//
// One step, all on the executor's stream (the collective's too):
//   draw the k indices -> gather the kept values of g (+ e) and stage the next memory, in one
//   pass -> append the non-finite flag -> allreduce of the k + 1 floats -> the flag copied back:
//   the one wait of the step -> when every rank was finite: the average scattered into g (zero
//   elsewhere) and the staged memory made current; enqueued and not waited for.
// Per-rank mode: each rank draws its own indices (the Philox stream keyed by its rank) into its
// payload slot, and the step averages by allgather as top-k's does
// (detail::device_sparse_codec::average_by_allgather): the CPU's payload bytes and sums.
//
// PayloadCodec on device memory, for a trainer that carries the payloads itself: encode (below)
// draws the step's indices (shared, or the given rank's) and gathers its input as it is into the caller's device
// storage, the CPU's bytes; validate, decode_add and max_payload_bytes are
// detail::device_sparse_codec's, each the CPU's member.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "bellows/compressors/detail/device_sparse.cuh"
#include "bellows/compressors/randk.hpp"
#include "bellows/concepts.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/philox.hpp"
#include "bellows/cuda/buffer.cuh"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/transfer.cuh"
#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/sample.cuh"
#include "bellows/cuda/sparse.cuh"
#include "bellows/plan/sample.hpp"

namespace bellows {

template <>
class randk<cuda::executor> : public detail::device_sparse_codec<randk<cuda::executor>, randk_params> {
  using base = detail::device_sparse_codec<randk<cuda::executor>, randk_params>;

public:
  /// One layer: step counter, error memory and its staged successor (device_sparse_state), its
  /// draw's plan, and in device memory the kept indices and the allreduce buffer.
  struct state : detail::device_sparse_state {
    sample_plan plan;
    cuda::device_buffer<std::uint32_t> index;
    cuda::device_buffer<float> values;  ///< the k kept values, then the non-finite flag
    float flag = 0.0f;                  ///< the flag's sum over ranks, read back
    cuda::payload_slots slots;          ///< per-rank mode: every rank's payload, and the verdicts

    /// The elements kept per step.
    [[nodiscard]] std::size_t k() const noexcept { return plan.k; }
  };

  static constexpr wire::codec codec = randk_method::codec;
  static constexpr const char* name = "randk";

  /// Raises bellows::error naming a parameter out of range (randk_params::validate).
  explicit randk(randk_params params = {}, cuda::executor& exec = cuda::executor::shared()) : base(params, exec) {
    params.validate();
  }

  /// Shared mode: one allreduce of the k values and the verdict; per rank: one allgather of
  /// this rank's payload of k entries.
  [[nodiscard]] exchange_rounds rounds(const state& st, std::size_t /*ranks*/) const {
    return detail::randk_rounds(st.layer, detail::kept_count(st.layer, params_.ratio, params_.k),
                                params_.mode == randk_mode::shared);
  }

  /// A state for the layer; reserves the executor's workspace for the draw (raising
  /// bellows::error for a layer of 2^32 elements or more) and for the validation of one payload.
  [[nodiscard]] state make_state(const layer_info& layer) const {
    state st;
    start(st, layer);
    follow(st);
    return st;
  }

  /// One step (a collective call; see the file's comment). `inout` is device memory; the
  /// collective enqueues on the executor's stream. Waits for that stream once, for the flag.
  template <DeviceCollective Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    check(st, inout.size(), coll);
    follow(st);
    const std::size_t k = st.plan.k;
    if (params_.mode == randk_mode::per_rank) {
      const reduce_result r = average_by_allgather(st.slots, st, inout, coll, [&](sparse_arrays<std::uint32_t> mine) {
        cuda::sample_workspace ws(st.plan, exec_->workspace());
        draw_and_gather(st, ws, inout, st.memory.values(), st.staged.values(), mine, coll.rank());
        return detail::device_selection{ws.non_finite};
      });
      if (r.status == step_status::ok) commit(st);
      return r;
    }
    const cudaStream_t stream = exec_->stream();
    const std::span<float> values(st.values.data(), k);

    cuda::sample_workspace ws(st.plan, exec_->workspace());
    draw_and_gather(st, ws, inout, st.memory.values(), st.staged.values(),
                    sparse_arrays<std::uint32_t>{st.index.span(), values}, coll.rank());
    flag_to_float(*exec_, ws.non_finite, st.values.data() + k);
    coll.allreduce_sum(st.values.span());
    BELLOWS_CUDA_CHECK(cudaMemcpyAsync(&st.flag, st.values.data() + k, sizeof(float), cudaMemcpyDeviceToHost, stream));
    exec_->synchronize();

    const reduce_result r{st.flag != 0.0f ? step_status::non_finite : step_status::ok,
                          {(k + 1) * sizeof(float), k + 1, k}};
    if (r.status != step_status::ok) return r;
    const auto w = static_cast<float>(coll.size());
    if (w != 1.0f) divide(*exec_, values, w);
    fill(*exec_, inout, 0.0f);
    scatter_add(*exec_, inout, std::span<const std::uint32_t>(st.index.span()), values);
    commit(st);
    return r;
  }

  /// PayloadCodec encode on device memory: the payload of the step's draw (keyed by state.step,
  /// and in per-rank mode by `rank`) of `in` as it is (no error memory;
  /// the step counter is not advanced), written into `out` (max_payload_bytes from a multiple
  /// of 8), the CPU's bytes. Waits for the executor's stream once: the payload of non-finite
  /// input is its header alone (flagged), so its length is known only then. Raises
  /// bellows::error when `in` or `out` does not fit.
  [[nodiscard]] std::span<std::byte> encode(const state& st, std::span<const float> in, std::span<std::byte> out,
                                            std::size_t rank = 0) const {
    const std::size_t k = st.plan.k;
    check_encode(st, in.size(), out, k);
    cuda::sample_workspace ws(st.plan, exec_->workspace());
    draw_and_gather(st, ws, in, {}, {}, detail::sparse_entries_at(out.data(), k), rank);
    return finish_encode(st, out, k, {ws.non_finite});
  }

private:
  friend base;

  /// Every payload holds k entries.
  [[nodiscard]] std::pair<std::size_t, std::size_t> counts(const layer_info& layer) const {
    const std::size_t k = kept(layer);
    return {k, k};
  }

  /// Plans the draw of this compressor's k (validating the parameters for the layer) and sizes
  /// the buffers when the state was made for another k (by the other level's compressor, or
  /// fresh): allocates only then.
  void follow(state& st) const {
    const std::size_t k = kept(st.layer);
    if (st.values.size() == k + 1 && st.plan.k == k) return;
    st.plan = plan_sample(st.layer.size(), k);
    // raises for layers of 2^32 elements or more
    exec_->reserve(std::max(cuda::sample_workspace::bytes(st.plan), cuda::payload_words::bytes()));
    st.index = cuda::device_buffer<std::uint32_t>(k);
    st.values = cuda::device_buffer<float>(k + 1);
  }

  /// The step's draw (shared, or `rank`'s in per-rank mode) into `ws`, then the kept entries of v = g (+ e) into `out`, scaled
  /// when unbiased, with the next memory into `staged` when `e` is not empty; *ws.non_finite set
  /// for NaN or Inf in v.
  void draw_and_gather(const state& st, cuda::sample_workspace& ws, std::span<const float> g, std::span<const float> e,
                       std::span<float> staged, sparse_arrays<std::uint32_t> out, std::size_t rank) const {
    const std::uint32_t key =
        params_.mode == randk_mode::shared ? philox::stream::shared : static_cast<std::uint32_t>(rank);
    draw_sample(*exec_, st.plan, {params_.seed, static_cast<std::uint32_t>(st.step), st.layer.id, key}, ws);
    const float scale = params_.unbiased
                            ? static_cast<float>(static_cast<double>(st.layer.size()) / static_cast<double>(st.plan.k))
                            : 1.0f;
    gather_sample(*exec_, st.plan, ws, g, e, staged, out, scale);
  }
};

static_assert(Compressor<randk<cuda::executor>, archetypes::device_collective>,
              "randk<cuda::executor> must model Compressor over a DeviceCollective");
static_assert(PayloadCodec<randk<cuda::executor>>, "randk<cuda::executor> must model PayloadCodec (device memory)");

}  // namespace bellows
