// SPDX-License-Identifier: Apache-2.0
// Rand-k sparsification (docs/spec.md#rand-k): each rank keeps k entries of its compensated gradient
// m = g + e at k distinct indices drawn uniformly without replacement, in ascending order.
//
// The indices come from the layer's Philox stream (layer_info::stream: {seed, step, layer id,
// rank} unless the layer has a key of its own), where rank is philox::stream::shared in shared
// mode, by the draw that cpu/sample.hpp documents: proposals of
// 32-bit (or, for n >= 2^32, 64-bit) words mapped to [0, n) by multiplication with exact
// rejection, deduplicated in a bitmap, the surplus dropped by Floyd's algorithm over ranks. Every
// step but the short last one runs in parallel, so a GPU backend can draw the same indices.
//
// Shared mode (default): every rank keeps the same indices, and one allreduce of k + 1 floats
// (the k values, then a non-finite flag) averages them. Per-rank mode draws per rank and
// averages by allgather, as top-k does. Error feedback (residual by default: unscaled rand-k
// keeps k / n of the gradient in expectation, and its memory carries the rest into later steps)
// is fused into the pass that gathers the kept values: it reads g and e and writes the next e.
// One class over the executor, on the sparse step of compressors/detail/sparse_codec.hpp; the
// device's draw (cuda/sample.cuh, through compressors/randk.cuh) gives the CPU's indices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "bellows/compressors/detail/sparse_codec.hpp"
#include "bellows/compressors/randk_types.hpp"
#include "bellows/core/error.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/cpu/float_array.hpp"
#include "bellows/cpu/sparse_payload.hpp"
#include "bellows/plan/sample.hpp"

namespace bellows {

template <class Exec = cpu::executor>
class randk : public detail::sparse_codec<randk<Exec>, Exec, randk_method, sample_plan, sample_workspace_for<Exec>> {
  using base = detail::sparse_codec<randk<Exec>, Exec, randk_method, sample_plan, sample_workspace_for<Exec>>;
  using base::name;
  using base::params_;

public:
  using state = typename base::state;

  /// Raises bellows::error naming a parameter out of range (randk_params::validate).
  explicit randk(randk_params params = {}, Exec& exec = Exec::shared()) : base(params, exec) {}

  /// Shared mode: one allreduce of the k values and the verdict; per rank: one allgather of
  /// this rank's payload of k entries, or under scatter an alltoall of chunk payloads, then an
  /// allgather of the owners'.
  [[nodiscard]] exchange_rounds rounds(const state& st, std::size_t ranks) const {
    if (this->scatters()) return this->scatter_rounds(st.layer, ranks);
    return detail::randk_rounds(st.layer, detail::kept_count(st.layer, params_.ratio, params_.k),
                                params_.mode == randk_mode::shared);
  }

  /// One step (a collective call). Per-rank mode: by allgather (detail::sparse_codec). Shared
  /// mode: the phases below on the state's payload slot, where the draw's k values and the flag
  /// after them form the part: the summed verdict read back (on the device, the step's one wait).
  /// Under scatter, on the CPU, by its alltoall and allgather (detail::reduce_scattered).
  template <CollectiveFor<Exec> Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    this->begin_step(st, inout.size(), coll);
    if constexpr (detail::runs_on_host<Exec>)
      if (this->scatters()) return detail::reduce_scattered(name, *this, st, *this->exec_, inout, coll);
    if (params_.mode == randk_mode::per_rank) return this->average_by_allgather(st, inout, coll);
    const round_part parts[] = {{shared_values(st)}};
    begin(st, inout, parts, coll.rank(), coll.size());
    coll.allreduce_sum(parts[0].values);
    finish(st, inout, parts, coll.rank(), coll.size());
    this->exec_->synchronize();
    return conclude(st);
  }

  // Phases (concepts.hpp, PhasedCompressor), one round: in shared mode an allreduce of the k
  // values drawn and the verdict after them in part 0; per rank, an allgather of this rank's
  // payload in part 0 (detail::sparse_codec).

  /// The draw's entries of m = grad + e (the next memory staged): per rank, a payload in part 0;
  /// shared, into the state's payload slot, their values and this rank's verdict into part 0.
  void begin(state& st, std::span<const float> grad, round_parts parts, std::size_t rank, std::size_t ranks) {
    Exec& exec = *this->exec_;
    this->begin_phases(st, grad.size(), parts, ranks);
    if constexpr (detail::runs_on_host<Exec>)
      if (this->scatters()) return this->begin_scattered(st, grad, parts, rank, ranks);
    if (params_.mode == randk_mode::per_rank) return this->begin_gathered(st, grad, parts, rank, ranks);
    st.by_allgather_ = false;
    const std::span<float> values = shared_values(st);
    const auto [memory, staged] = this->compensation(st);
    const auto words = select(st, grad, memory, staged, st.slots_.mine(0).subspan(wire::header_bytes), rank);
    const std::size_t k = st.plan_.k;
    if (parts[0].values.data() != values.data()) copy(exec, parts[0].values.first(k), std::as_const(values).first(k));
    flag_to_float(exec, words.non_finite, parts[0].values.data() + k);
  }
  /// Rand-k has one round; under scatter, round 1 is the owner's (detail::sparse_codec::reselect_part).
  void next(state& st, std::span<const float> /*grad*/, std::size_t round, round_parts parts) {
    if constexpr (detail::runs_on_host<Exec>)
      if (this->scatters() && round == 1) return this->reselect_part(st, parts[0], parts[1]);
    fail<error>(name, ": layer '", st.layer.name, "' has no round ", round);
  }
  /// Per rank, the gathered payloads validated and averaged (detail::sparse_codec). Shared: the
  /// summed values / W, then, unless the summed verdict is not 0, grad = them scattered into
  /// zeros at the draw's indices; the summed verdict copied back.
  void finish(state& st, std::span<float> grad, round_parts parts, std::size_t rank, std::size_t ranks) {
    if constexpr (detail::runs_on_host<Exec>)
      if (this->scatters()) return this->concatenate_parts(st, grad, parts[1]);
    if (st.by_allgather_) return this->finish_gathered(st, grad, parts, rank, ranks);
    Exec& exec = *this->exec_;
    const std::size_t k = st.plan_.k;
    const std::span<float> values = parts[0].values.first(k);
    const float* skip = parts[0].values.data() + k;
    if (ranks != 1) divide(exec, values, static_cast<float>(ranks));
    fill(exec, grad, 0.0f, skip);
    this->add_entries(grad, st.slots_.mine(0).data() + wire::header_bytes, k, values, skip);
    copy_word(exec, st.reported_[0].sum, skip);
  }
  /// The status and traffic; the staged memory becomes current when every rank was finite.
  reduce_result conclude(state& st) {
    if (this->scatters()) return base::conclude(st, this->scatter_result(st));
    if (st.by_allgather_) return base::conclude(st, this->gathered(st));
    const std::size_t k = st.plan_.k;
    const reduce_result r{st.reported_[0].sum != 0.0f ? step_status::non_finite : step_status::ok,
                          {(k + 1) * sizeof(float), k + 1, k}};
    return base::conclude(st, r);
  }

private:
  friend base;

  /// The k values of the shared draw in the state's payload slot (right after the k indices)
  /// and the float after them: reduce's part. Makes room for them first.
  std::span<float> shared_values(state& st) const {
    const std::size_t n = st.layer.size(), k = st.plan_.k;
    st.slots_.prepare(*this->exec_, 1, sparse_payload_bytes(n, k) + sizeof(float));
    std::byte* body = st.slots_.mine(0).data() + wire::header_bytes;
    return {reinterpret_cast<float*>(body + (entry_bytes(n) - sizeof(float)) * k), k + 1};
  }

  [[nodiscard]] std::pair<std::size_t, std::size_t> counts(const layer_info& layer) const {
    const std::size_t k = detail::kept_count(layer, params_.ratio, params_.k);
    return {k, k};
  }

  [[nodiscard]] sample_plan plan_for(const layer_info& layer) const {
    return plan_sample(layer.size(), counts(layer).first);
  }

  /// The step's draw (keyed by rank in per-rank mode, else shared), then the kept entries of
  /// v = g (+ e), scaled by n / k when unbiased, into `body`, the next memory into `staged`.
  auto select(state& st, std::span<const float> g, std::span<const float> e, std::span<float> staged,
              std::span<std::byte> body, std::size_t rank) const {
    return draw(st, st.plan_, st.work_,
                params_.mode == randk_mode::shared ? philox::stream::shared : static_cast<std::uint32_t>(rank), g, e,
                staged, body);
  }
  /// The scatter exchange's draw of k of a chunk's n elements, keyed by the Philox rank word
  /// `word`, on the state's workspace for chunks.
  auto select_part(state& st, std::size_t n, std::size_t k, std::uint32_t word, std::span<const float> g,
                   std::span<const float> e, std::span<float> staged, std::span<std::byte> body) const {
    const sample_plan plan = plan_sample(n, k);
    return draw(st, plan, this->fit_part(st, plan), word, g, e, staged, body);
  }
  /// The draw of `plan` from the layer's stream with rank word `word`, scaled by n / k when
  /// unbiased.
  auto draw(const state& st, const sample_plan& plan, sample_workspace_for<Exec>& ws, std::uint32_t word,
            std::span<const float> g, std::span<const float> e, std::span<float> staged,
            std::span<std::byte> body) const {
    const float scale =
        params_.unbiased ? static_cast<float>(static_cast<double>(plan.n) / static_cast<double>(plan.k)) : 1.0f;
    return draw_into_payload(*this->exec_, plan, st.layer.stream(params_.seed, st.step, word), ws, g, e, staged, body,
                             scale);
  }
};

static_assert(Compressor<randk<>, archetypes::collective>, "randk must model Compressor");
static_assert(CheckpointedCompressor<randk<>>, "randk must model CheckpointedCompressor");
static_assert(PayloadCodec<randk<>>, "randk must model PayloadCodec");
static_assert(PhasedCompressor<randk<>>, "randk must model PhasedCompressor");

template <>
struct method_slot<randk_method::codec.id> {
  using type = randk_method;
};

}  // namespace bellows

#if defined(__CUDACC__)  // the device compressor, for device code that includes the list
#include "bellows/compressors/randk.cuh"
#endif
