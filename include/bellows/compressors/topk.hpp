// SPDX-License-Identifier: Apache-2.0
// Top-k sparsification with error feedback (SPEC.md, Top-k; Stich, Cordonnier and Jaggi,
// "Sparsified SGD with Memory"): each rank keeps the k entries of largest magnitude of its
// compensated gradient m = g + e, sends them as (index, value) pairs, and keeps the rest in its
// error memory, e = m with zeros at the kept indices. The output, on every rank, is the average
// over ranks of the scattered payloads.
//
// One step reads g and e once: the selection pass (cpu/select.hpp) forms m, writes the next
// memory into a second buffer and compacts the candidates; the exact selection among them fills
// the payload. The second buffer becomes the memory only once the exchange has shown every
// rank's input finite, so a non-finite step changes nothing.
//
//   bellows::topk<> c({.ratio = 0.01});                     // residual error feedback by default
//   auto st = c.make_state({0, "fc1.weight", bellows::shape{512, 784}});
//   c.reduce(st, grad, comm);                               // grad becomes the average
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "bellows/compressors/detail/gather_average.hpp"
#include "bellows/compressors/detail/sparse_codec.hpp"
#include "bellows/compressors/topk_types.hpp"
#include "bellows/concepts.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/philox.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/cpu/select.hpp"
#include "bellows/cpu/sparse.hpp"

namespace bellows {

template <class Exec = cpu::executor>
class topk {
public:
  /// A layer's state: its step counter and error memory (public), and the workspace of its
  /// selections. A state may serve top-k compressors of other ratios too (the two levels of an
  /// Accordion schedule): it keeps its memory, and its workspace is resized at the first step
  /// at a new ratio.
  class state : public detail::sparse_state {
  public:
    /// The elements kept per step (in approximate mode, the least).
    [[nodiscard]] std::size_t k() const noexcept { return plan_.k; }

  private:
    friend class topk;
    cpu::select_plan plan_{};
    cpu::select_workspace work_;
    std::vector<float> dense_;  // sized at the first step that averages densely
  };

  explicit topk(topk_params params = {}, Exec& exec = Exec::shared()) : params_(params), exec_(&exec) {}

  [[nodiscard]] const topk_params& params() const noexcept { return params_; }
  [[nodiscard]] bellows::aggregation aggregation() const noexcept {
    return bellows::aggregation::allgather;
  }

  /// Validates the parameters for the layer (raising bellows::error that names the layer and
  /// the value) and sizes its memory and workspace.
  [[nodiscard]] state make_state(const layer_info& layer) const {
    state st;
    st.layer = layer;
    fit(st);
    return st;
  }

  /// One step (a collective call): stage, exchange, and on success commit. Averages by
  /// allgather, or by a dense allreduce of n + 1 floats (the last one the non-finite flag) when
  /// dense_switch is on and W * k * (index + value bytes) >= 4 n.
  template <Collective Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    const std::span<const std::byte> mine = stage(st, inout, coll.rank());
    const wire::header head = detail::header_of(mine);
    const std::size_t n = inout.size(), w = coll.size();
    reduce_result r;
    if (averages_densely(st.layer, w)) {
      st.dense_.resize(n + 1);
      const std::span<float> sum(st.dense_.data(), n);
      fill(*exec_, sum, 0.0f);
      st.dense_[n] = (head.flags & wire::flag::non_finite) != 0 ? 1.0f : 0.0f;
      if (st.dense_[n] == 0.0f) (void)decode_add(st, mine, sum);
      coll.allreduce_sum(st.dense_);
      r.sent = {st.dense_.size() * sizeof(float), st.dense_.size(), head.count};
      r.status = st.dense_[n] != 0.0f ? step_status::non_finite : step_status::ok;
      if (r.status == step_status::ok) divide_into(*exec_, inout, sum, static_cast<float>(w));
    } else {
      r.status = detail::gather_average(
          *this, st, mine, inout, coll, detail::sparse_steps::gathered(st),
          [&](std::span<float> v) { fill(*exec_, v, 0.0f); },
          [&](std::span<float> v, float d) {
            if (d != 1.0f) divide(*exec_, v, d);  // x / 1 is x
          });
      r.sent = {mine.size(), head.count, head.count};
    }
    if (r.status == step_status::ok)
      commit(st);
    else
      detail::sparse_steps::discard(st);
    return r;
  }

  /// The first half of a step, for a trainer that exchanges payloads itself: selects from
  /// m = grad + e, writes the next error memory aside, and returns this rank's payload (held by
  /// the state until the next stage). Changes neither the memory nor the step counter. Once
  /// every rank's payload validated without non_finite, call commit.
  std::span<const std::byte> stage(state& st, std::span<const float> grad, std::size_t rank = 0) const {
    fit(st);
    check_size(st, grad.size());
    return detail::sparse_steps::stage(st, max_payload_bytes(st), [&](auto m, std::span<std::byte> out) {
      return write(st, grad, m.memory, m.staged, out, rank);
    });
  }

  /// The second half: the staged memory becomes current and the step counter advances.
  void commit(state& st) const { detail::sparse_steps::commit(st, "topk"); }

  // PayloadCodec: the selection of `in` as it is (no error memory), keyed by state.step.

  [[nodiscard]] std::size_t max_payload_bytes(const state& st) const {
    return detail::sparse_payload_bytes(st.layer.size(), counts(st.layer).second);
  }

  [[nodiscard]] std::span<std::byte> encode(state& st, std::span<const float> in,
                                            std::span<std::byte> out, std::size_t rank = 0) const {
    fit(st);
    check_size(st, in.size());
    return write(st, in, {}, {}, out, rank);
  }

  [[nodiscard]] step_status validate(const state& st, std::span<const std::byte> payload) const {
    return read(st, payload).status;
  }

  [[nodiscard]] step_status decode_add(const state& st, std::span<const std::byte> payload,
                                       std::span<float> acc) const {
    check_size(st, acc.size());
    const detail::sparse_entries e = read(st, payload);
    if (e.status == step_status::ok) {
      if (detail::wide_indices(st.layer.size()))
        scatter_add(*exec_, acc, e.index64, e.value);
      else
        scatter_add(*exec_, acc, e.index32, e.value);
    }
    return e.status;
  }

  /// Checkpoint of a layer's state: its step counter and error memory.
  void save(const state& st, checkpoint_writer& out) const { detail::sparse_steps::save(st, out); }
  void load(state& st, checkpoint_reader& in) const { detail::sparse_steps::load(st, in, "topk state"); }

private:
  /// k, and the most approximate mode may keep: ceil(1.25 k), at most n.
  [[nodiscard]] std::pair<std::size_t, std::size_t> counts(const layer_info& layer) const {
    const std::size_t k = detail::kept_count("topk", layer, params_.ratio, params_.k);
    if (params_.mode == topk_mode::exact) return {k, k};
    return {k, std::min(layer.size(), k + (k + 3) / 4)};
  }

  [[nodiscard]] bool averages_densely(const layer_info& layer, std::size_t ranks) const {
    const std::uint64_t entry = (detail::wide_indices(layer.size()) ? 8 : 4) + sizeof(float);
    return params_.dense_switch &&
           std::uint64_t{ranks} * counts(layer).second * entry >= 4 * std::uint64_t{layer.size()};
  }

  void fit(state& st) const {
    const auto [k, most] = counts(st.layer);
    const cpu::select_plan plan = cpu::plan_select(st.layer.size(), k, most);
    if (!(plan == st.plan_)) {
      st.work_.fit(plan);
      st.plan_ = plan;
    }
    detail::sparse_steps::fit_memory(st, params_.feedback, "topk");
  }

  std::span<std::byte> write(state& st, std::span<const float> g, std::span<const float> e,
                             std::span<float> staged, std::span<std::byte> out, std::size_t rank) const {
    const philox::stream draw{params_.seed, static_cast<std::uint32_t>(st.step), st.layer.id,
                              static_cast<std::uint32_t>(rank)};
    return detail::write_sparse<cpu::sparse_arrays>(out, wire::codec::topk, g.size(), [&](auto begin) {
      return select_top(*exec_, st.plan_, draw, g, e, staged, st.work_, begin);
    });
  }

  [[nodiscard]] detail::sparse_entries read(const state& st, std::span<const std::byte> payload) const {
    const auto [k, most] = counts(st.layer);
    return detail::read_sparse(payload, wire::codec::topk, st.layer, k, most);
  }

  static void check_size(const state& st, std::size_t n) {
    BELLOWS_EXPECTS(n == st.layer.size(), "topk: layer '", st.layer.name, "' of shape ",
                    st.layer.shape.to_string(), " has ", st.layer.size(), " elements, the buffer ", n);
  }

  topk_params params_;
  Exec* exec_;
};

static_assert(Compressor<topk<>, archetypes::collective>, "topk must model Compressor");
static_assert(PayloadCodec<topk<>>, "topk must model PayloadCodec");

}  // namespace bellows
