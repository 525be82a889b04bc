// SPDX-License-Identifier: Apache-2.0
// Top-k sparsification with error feedback (docs/spec.md#top-k; Stich, Cordonnier and Jaggi,
// "Sparsified SGD with Memory"): each rank keeps the k entries of largest magnitude of its
// compensated gradient m = g + e, sends them as (index, value) pairs, and keeps the rest in its
// error memory, e = m with zeros at the kept indices. The output, on every rank, is the average
// over ranks of the scattered payloads.
//
// One class over the executor, on the sparse step of compressors/detail/sparse_codec.hpp; the
// device's selection (cuda/select.cuh, through compressors/topk.cuh) keeps the CPU's set, so both
// backends give the same bits. On the CPU one step reads g and e once: the selection pass
// (cpu/select.hpp) forms m, writes the next memory into a second buffer and compacts the
// candidates; the exact selection among them fills the payload. The second buffer becomes the
// memory only once the exchange has shown every rank's input finite, so a non-finite step
// changes nothing.
//
//   bellows::topk<> c({.ratio = 0.01});                     // residual error feedback by default
//   auto st = c.make_state({0, "fc1.weight", bellows::shape{512, 784}});
//   c.reduce(st, grad, comm);                               // grad becomes the average
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "bellows/compressors/detail/sparse_codec.hpp"
#include "bellows/compressors/topk_types.hpp"
#include "bellows/core/error.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/cpu/float_array.hpp"
#include "bellows/cpu/sparse_payload.hpp"
#include "bellows/plan/select.hpp"

namespace bellows {

template <class Exec = cpu::executor>
class topk : public detail::sparse_codec<topk<Exec>, Exec, topk_method, select_plan, select_workspace_for<Exec>> {
  using base = detail::sparse_codec<topk<Exec>, Exec, topk_method, select_plan, select_workspace_for<Exec>>;
  using base::name;
  using base::params_;

public:
  using state = typename base::state;

  /// Raises bellows::error naming a parameter out of range (topk_params::validate).
  explicit topk(topk_params params = {}, Exec& exec = Exec::shared()) : base(params, exec) {}

  /// One allgather of this rank's payload (k entries; in approximate mode up to topk_most of
  /// them), or, where the dense switch finds it cheaper over `ranks`, one allreduce of n + 1 floats.
  [[nodiscard]] exchange_rounds rounds(const state& st, std::size_t ranks) const {
    return detail::topk_rounds(st.layer, counts(st.layer), params_.dense_switch, ranks);
  }

  /// One step (a collective call). By allgather (detail::sparse_codec). When dense_switch is on
  /// and W * most * (index + value bytes) >= 4 n, by one allreduce of n + 1 floats instead, the
  /// phases below on the state's buffer: the verdicts and this rank's count read back (on the
  /// device, the step's one wait). The traffic counts the kept values as the payload's elements.
  template <CollectiveFor<Exec> Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    this->begin_step(st, inout.size(), coll);
    if (!averages_densely(st.layer, coll.size())) return this->average_by_allgather(st, inout, coll);
    Exec& exec = *this->exec_;
    if (st.dense_.size() != inout.size() + 1) {
      exec.synchronize();  // work enqueued before may still use the buffer replaced
      st.dense_ = float_array_for<Exec>(exec, inout.size() + 1);
    }
    const round_part parts[] = {{st.dense_.span()}};
    begin(st, inout, parts, coll.rank(), coll.size());
    coll.allreduce_sum(parts[0].values);
    finish(st, inout, parts, coll.rank(), coll.size());
    exec.synchronize();
    return conclude(st);
  }

  // Phases (concepts.hpp, PhasedCompressor), one round as rounds() says: an allgather of this
  // rank's payload in part 0 (detail::sparse_codec), or, with the dense switch, an allreduce of
  // the kept entries written densely and the verdict after them.

  /// The selection from m = grad + e (the next memory staged) into part 0: a payload, or the
  /// entries written densely and this rank's verdict, whose verdict and count are copied back.
  void begin(state& st, std::span<const float> grad, round_parts parts, std::size_t rank, std::size_t ranks) {
    Exec& exec = *this->exec_;
    this->begin_phases(st, grad.size(), parts, ranks);
    if (!averages_densely(st.layer, ranks)) return this->begin_gathered(st, grad, parts, rank, ranks);
    st.by_allgather_ = false;
    const std::size_t n = grad.size();
    st.slots_.prepare(exec, 1, this->max_payload_bytes(st));  // the device's scratch
    const auto [memory, staged] = this->compensation(st);
    const auto words = select_into_dense(exec, st.plan_, sample_key(st, rank), grad, memory, staged, st.work_,
                                         st.slots_.mine(0), parts[0].values.first(n));
    flag_to_float(exec, words.non_finite, parts[0].values.data() + n);
    copy_word(exec, st.reported_[0].own, words.non_finite);
    copy_word(exec, st.reported_[0].count, words.count);
  }
  /// Top-k has one round.
  void next(state& st, std::span<const float> /*grad*/, std::size_t round, round_parts /*parts*/) {
    fail<error>(name, ": layer '", st.layer.name, "' has no round ", round);
  }
  /// The gathered payloads validated and averaged (detail::sparse_codec); or grad = the sums / W
  /// unless the summed verdict is not 0, the summed verdict copied back.
  void finish(state& st, std::span<float> grad, round_parts parts, std::size_t rank, std::size_t ranks) {
    if (st.by_allgather_) return this->finish_gathered(st, grad, parts, rank, ranks);
    const std::size_t n = grad.size();
    divide(*this->exec_, grad, std::as_const(parts[0].values).first(n), static_cast<float>(ranks),
           parts[0].values.data() + n);
    copy_word(*this->exec_, st.reported_[0].sum, parts[0].values.data() + n);
  }
  /// The status and traffic; the staged memory becomes current when every rank was finite.
  reduce_result conclude(state& st) {
    if (st.by_allgather_) return base::conclude(st, this->gathered(st));
    const auto& got = st.reported_[0];
    const std::size_t n = st.layer.size();
    const reduce_result r{got.sum != 0.0f ? step_status::non_finite : step_status::ok,
                          {(n + 1) * sizeof(float), n + 1, got.own != 0 ? 0 : std::size_t{got.count}}};
    return base::conclude(st, r);
  }

private:
  friend base;

  /// k, and the most approximate mode may keep: ceil(1.25 k), at most n.
  [[nodiscard]] std::pair<std::size_t, std::size_t> counts(const layer_info& layer) const {
    const std::size_t k = detail::kept_count(layer, params_.ratio, params_.k);
    return {k, topk_most(params_.mode, layer.size(), k)};
  }

  [[nodiscard]] select_plan plan_for(const layer_info& layer) const {
    const auto [k, most] = counts(layer);
    return plan_select(layer.size(), k, most);
  }

  [[nodiscard]] bool averages_densely(const layer_info& layer, std::size_t ranks) const {
    return params_.dense_switch && detail::dense_is_cheaper(layer.size(), ranks, counts(layer).second);
  }

  /// The key of the sample that sets the selection threshold in approximate mode.
  [[nodiscard]] philox::stream sample_key(const state& st, std::size_t rank) const noexcept {
    return st.layer.stream(params_.seed, st.step, static_cast<std::uint32_t>(rank));
  }

  auto select(state& st, std::span<const float> g, std::span<const float> e, std::span<float> staged,
              std::span<std::byte> body, std::size_t rank) const {
    return select_into_payload(*this->exec_, st.plan_, sample_key(st, rank), g, e, staged, st.work_, body);
  }
};

static_assert(Compressor<topk<>, archetypes::collective>, "topk must model Compressor");
static_assert(CheckpointedCompressor<topk<>>, "topk must model CheckpointedCompressor");
static_assert(PayloadCodec<topk<>>, "topk must model PayloadCodec");
static_assert(PhasedCompressor<topk<>>, "topk must model PhasedCompressor");

template <>
struct method_slot<topk_method::codec.id> {
  using type = topk_method;
};

}  // namespace bellows

#if defined(__CUDACC__)  // the device compressor, for device code that includes the list
#include "bellows/compressors/topk.cuh"
#endif
