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
#include "bellows/cpu/index_list.hpp"
#include "bellows/cpu/sparse_payload.hpp"
#include "bellows/plan/index_list.hpp"
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
  /// The leader's exchange: an allreduce of the index list, then one of the values at it. The
  /// scatter exchange: an alltoall of chunk payloads, then an allgather of the owners'.
  [[nodiscard]] exchange_rounds rounds(const state& st, std::size_t ranks) const {
    if (this->scatters()) return this->scatter_rounds(st.layer, ranks);
    if (leads()) {
      const index_list_layout at = list_layout(st.layer);
      return {{collective_op::allreduce_sum, at.floats() * sizeof(float)},
              {collective_op::allreduce_sum, at.most * sizeof(float)}};
    }
    return detail::topk_rounds(st.layer, counts(st.layer), params_.dense_switch, ranks);
  }

  /// One step (a collective call). By allgather (detail::sparse_codec). When dense_switch is on
  /// and W * most * (index + value bytes) >= 4 n, by one allreduce of n + 1 floats instead, the
  /// phases below on the state's buffer: the verdicts and this rank's count read back (on the
  /// device, the step's one wait). The traffic counts the kept values as the payload's elements.
  /// With the leader's exchange, by its two allreduces, on the state's buffer; with the scatter
  /// exchange, on the CPU, by its alltoall and allgather (detail::reduce_scattered).
  template <CollectiveFor<Exec> Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    this->begin_step(st, inout.size(), coll);
    if constexpr (detail::runs_on_host<Exec>)
      if (this->scatters()) return detail::reduce_scattered(name, *this, st, *this->exec_, inout, coll);
    if (!leads() && !averages_densely(st.layer, coll.size())) return this->average_by_allgather(st, inout, coll);
    Exec& exec = *this->exec_;
    const exchange_rounds rounds = this->rounds(st, coll.size());
    const std::size_t first = rounds[0].bytes / sizeof(float);
    const std::size_t floats = first + (rounds.size() > 1 ? rounds[1].bytes / sizeof(float) : 0);
    if (st.dense_.size() != floats) {
      exec.synchronize();  // work enqueued before may still use the buffer replaced
      st.dense_ = float_array_for<Exec>(exec, floats);
    }
    const round_part parts[] = {{st.dense_.span().first(first)}, {st.dense_.span().subspan(first)}};
    const round_parts used(parts, rounds.size());
    begin(st, inout, used, coll.rank(), coll.size());
    coll.allreduce_sum(parts[0].values);
    if (leads()) {
      next(st, inout, 1, used);
      coll.allreduce_sum(parts[1].values);
    }
    finish(st, inout, used, coll.rank(), coll.size());
    exec.synchronize();
    verify(st);
    return conclude(st);
  }

  // Phases (concepts.hpp, PhasedCompressor), the rounds as rounds() says: an allgather of this
  // rank's payload in part 0 (detail::sparse_codec), or, with the dense switch, an allreduce of
  // the kept entries written densely and the verdict after them; or the leader's two
  // allreduces, its index list in part 0 (plan/index_list.hpp), then the values at it.

  /// The selection from m = grad + e (the next memory staged) into part 0: a payload, or the
  /// entries written densely and this rank's verdict, whose verdict and count are copied back.
  void begin(state& st, std::span<const float> grad, round_parts parts, std::size_t rank, std::size_t ranks) {
    Exec& exec = *this->exec_;
    this->begin_phases(st, grad.size(), parts, ranks);
    if constexpr (detail::runs_on_host<Exec>)
      if (this->scatters()) return this->begin_scattered(st, grad, parts, rank, ranks);
    if (leads()) return begin_led(st, grad, parts, rank, ranks);
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
  /// The leader's second round: the summed list checked (a malformed one raises
  /// bellows::wire_error on the CPU, after the wait on the device), and this rank's values of m at
  /// its indices into part 1, taken out of the next memory. Gather and the dense switch have one
  /// round. Under scatter, round 1 is the owner's (detail::sparse_codec::reselect_part).
  void next(state& st, std::span<const float> grad, std::size_t round, round_parts parts) {
    if constexpr (detail::runs_on_host<Exec>)
      if (this->scatters() && round == 1) return this->reselect_part(st, parts[0], parts[1]);
    BELLOWS_EXPECTS(leads() && round == 1, name, ": layer '", st.layer.name, "' has no round ", round);
    const index_list_layout at = list_layout(st.layer);
    auto& got = st.reported_[0];
    st.list_ = parts[0].values;
    st.listed_ =
        check_index_list(*this->exec_, st.slots_, parts[0].values, at, st.layer.size(), counts(st.layer).first, got.sum,
                         got.own, got.count, [&](std::span<const float> list) { return read_list(st, list); });
    const auto [memory, staged] = this->compensation(st);
    take_at_list(*this->exec_, parts[1].values, memory.empty() ? grad : std::as_const(staged), staged, parts[0].values,
                 at, st.listed_);
  }
  /// The gathered payloads validated and averaged (detail::sparse_codec); or grad = the sums / W
  /// unless the summed verdict is not 0, the summed verdict copied back.
  /// The leader's: grad = zeros but the summed values / W at the list's indices, unless the
  /// step is not finite.
  void finish(state& st, std::span<float> grad, round_parts parts, std::size_t rank, std::size_t ranks) {
    if constexpr (detail::runs_on_host<Exec>)
      if (this->scatters()) return this->concatenate_parts(st, grad, parts[1]);
    if (st.by_allgather_) return this->finish_gathered(st, grad, parts, rank, ranks);
    if (leads())
      return scatter_list(*this->exec_, grad, parts[0].values, list_layout(st.layer), parts[1].values,
                          static_cast<float>(ranks), st.listed_);
    const std::size_t n = grad.size();
    divide(*this->exec_, grad, std::as_const(parts[0].values).first(n), static_cast<float>(ranks),
           parts[0].values.data() + n);
    copy_word(*this->exec_, st.reported_[0].sum, parts[0].values.data() + n);
  }
  /// After the executor's synchronize(): raises the wire_error of a malformed gathered payload
  /// or leader's list that the device found.
  void verify(const state& st) const {
    base::verify(st);
    if (leads() && !st.by_allgather_)
      report_index_list(*this->exec_, st.list_, st.reported_[0].own,
                        [&](std::span<const float> list) { return read_list(st, list); });
  }
  /// The status and traffic; the staged memory becomes current when every rank was finite.
  reduce_result conclude(state& st) {
    if (this->scatters()) return base::conclude(st, this->scatter_result(st));
    if (st.by_allgather_) return base::conclude(st, this->gathered(st));
    const auto& got = st.reported_[0];
    if (leads()) {
      const index_list_layout at = list_layout(st.layer);
      const std::size_t floats = at.floats() + at.most;
      const bool finite = got.sum == 0.0f;
      return base::conclude(st, {finite ? step_status::ok : step_status::non_finite,
                                 {floats * sizeof(float), floats, finite ? std::size_t{got.count} : 0}});
    }
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

  [[nodiscard]] bool leads() const noexcept { return params_.exchange == exchange::leader; }

  [[nodiscard]] index_list_layout list_layout(const layer_info& layer) const {
    return {layer.size(), counts(layer).second};
  }

  /// The leader's step from m = grad + e (the next memory staged in full): part 0 zeroed, this
  /// rank's verdict (1 when m is not finite) at its start, and on the leader, rank step mod W,
  /// its selection from m written as the list.
  void begin_led(state& st, std::span<const float> grad, round_parts parts, std::size_t rank, std::size_t ranks) {
    Exec& exec = *this->exec_;
    st.by_allgather_ = false;
    const std::span<float> list = parts[0].values;
    st.slots_.prepare(exec, 1, this->max_payload_bytes(st));  // the leader's scratch, the device's words
    fill(exec, list, 0.0f);
    const auto [memory, staged] = this->compensation(st);
    if (memory.empty())
      flag_non_finite(exec, grad, list.data());
    else
      compensate(exec, staged, grad, memory, list.data());
    if (rank == st.step % ranks)
      select_index_list(exec, st.plan_, sample_key(st, rank), memory.empty() ? grad : std::as_const(staged), st.work_,
                        st.slots_.mine(0), list);
  }

  /// The leader's count in a summed list whose verdict is 0, after checking all of it: the
  /// count and every index below it whole numbers (plan/index_list.hpp), the count from k to
  /// the most a payload holds, the indices ascending strictly and below n. Raises
  /// bellows::wire_error naming the layer and the field.
  [[nodiscard]] std::size_t read_list(const state& st, std::span<const float> list) const {
    const index_list_layout at = list_layout(st.layer);
    const auto [least, most] = counts(st.layer);
    const std::uint64_t n = st.layer.size();
    std::uint64_t count = 0;
    if (!at.get(list.data() + at.count_at(), count) || count < least || count > most)
      fail<wire_error>(name, ": the leader's index list for layer '", st.layer.name, "' does not hold a count from ",
                       least, " to ", most);
    std::uint64_t before = 0;
    for (std::size_t j = 0; j < count; ++j) {
      std::uint64_t i = 0;
      if (!at.get(list.data() + at.entry_at(j), i) || i >= n || (j > 0 && i <= before))
        fail<wire_error>(name, ": entry ", j, " of the leader's index list for layer '", st.layer.name,
                         "' is not an index below ", n, " above the one before it");
      before = i;
    }
    return count;
  }

  [[nodiscard]] bool averages_densely(const layer_info& layer, std::size_t ranks) const {
    return params_.dense_switch && !this->scatters() &&
           detail::dense_is_cheaper(layer.size(), ranks, counts(layer).second);
  }

  /// The key of the sample that sets the selection threshold in approximate mode.
  [[nodiscard]] philox::stream sample_key(const state& st, std::size_t rank) const noexcept {
    return st.layer.stream(params_.seed, st.step, static_cast<std::uint32_t>(rank));
  }

  auto select(state& st, std::span<const float> g, std::span<const float> e, std::span<float> staged,
              std::span<std::byte> body, std::size_t rank) const {
    return select_into_payload(*this->exec_, st.plan_, sample_key(st, rank), g, e, staged, st.work_, body);
  }
  /// The scatter exchange's selection of k of a chunk's n elements (exact mode), keyed by the
  /// Philox rank word `word`, on the state's workspace for chunks.
  auto select_part(state& st, std::size_t n, std::size_t k, std::uint32_t word, std::span<const float> g,
                   std::span<const float> e, std::span<float> staged, std::span<std::byte> body) const {
    const select_plan plan = plan_select(n, k, k);
    return select_into_payload(*this->exec_, plan, st.layer.stream(params_.seed, st.step, word), g, e, staged,
                               this->fit_part(st, plan), body);
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
