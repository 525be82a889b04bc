// SPDX-License-Identifier: Apache-2.0
// Rand-k sparsification (SPEC.md, Rand-k): each rank keeps k entries of its compensated gradient
// m = g + e at k distinct indices drawn uniformly without replacement, in ascending order.
//
// The indices come from the Philox stream {seed, step, layer id, rank}, where rank is
// philox::stream::shared in shared mode, by the draw that cpu/sample.hpp documents: proposals of
// 32-bit (or, for n >= 2^32, 64-bit) words mapped to [0, n) by multiplication with exact
// rejection, deduplicated in a bitmap, the surplus dropped by Floyd's algorithm over ranks. Every
// step but the short last one runs in parallel, so a GPU backend can draw the same indices.
//
// Shared mode (default): every rank keeps the same indices, and one allreduce of k + 1 floats
// (the k values, then a non-finite flag) averages them. Per-rank mode draws per rank and
// averages by allgather, as top-k does. Error feedback (residual by default: unscaled rand-k
// keeps k / n of the gradient in expectation, and its memory carries the rest into later steps)
// is fused into the pass that gathers the kept values: it reads g and e and writes the next e.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "bellows/compressors/detail/gather_average.hpp"
#include "bellows/compressors/detail/sparse_codec.hpp"
#include "bellows/compressors/randk_types.hpp"
#include "bellows/concepts.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/philox.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/cpu/sample.hpp"
#include "bellows/cpu/sparse.hpp"

namespace bellows {

template <class Exec = cpu::executor>
class randk {
public:
  /// A layer's state: its step counter and error memory (public), and the workspace of its
  /// draws. It may serve rand-k compressors of other ratios too; it keeps its memory.
  class state : public detail::sparse_state {
  public:
    /// The elements kept per step.
    [[nodiscard]] std::size_t k() const noexcept { return plan_.k; }

  private:
    friend class randk;
    cpu::sample_plan plan_{};
    cpu::sample_workspace work_;
    std::vector<std::uint32_t> index32_;  // shared mode: the indices of the step
    std::vector<std::uint64_t> index64_;
    std::vector<float> values_;  // shared mode: the k values, then the non-finite flag
  };

  explicit randk(randk_params params = {}, Exec& exec = Exec::shared()) : params_(params), exec_(&exec) {}

  [[nodiscard]] const randk_params& params() const noexcept { return params_; }
  [[nodiscard]] bellows::aggregation aggregation() const noexcept {
    return params_.mode == randk_mode::shared ? bellows::aggregation::allreduce
                                              : bellows::aggregation::allgather;
  }

  /// Validates the parameters for the layer (raising bellows::error that names the layer and
  /// the value) and sizes its memory and workspace.
  [[nodiscard]] state make_state(const layer_info& layer) const {
    state st;
    st.layer = layer;
    fit(st);
    return st;
  }

  /// One step (a collective call).
  template <Collective Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    reduce_result r;
    if (params_.mode == randk_mode::per_rank) {
      const std::span<const std::byte> mine = stage(st, inout, coll.rank());
      r.status = detail::gather_average(
          *this, st, mine, inout, coll, detail::sparse_steps::gathered(st),
          [&](std::span<float> v) { fill(*exec_, v, 0.0f); },
          [&](std::span<float> v, float d) {
            if (d != 1.0f) divide(*exec_, v, d);  // x / 1 is x
          });
      const std::uint64_t kept = detail::header_of(mine).count;
      r.sent = {mine.size(), kept, kept};
    } else {
      fit(st);
      check_size(st, inout.size());
      const std::size_t k = st.plan_.k;
      const std::span<float> values(st.values_.data(), k);
      const auto m = detail::sparse_steps::compensation_of(st);
      const bool finite =
          detail::wide_indices(inout.size())
              ? draw_and_gather(st, inout, m.memory, m.staged, std::span(st.index64_), values, 0)
              : draw_and_gather(st, inout, m.memory, m.staged, std::span(st.index32_), values, 0);
      detail::sparse_steps::staged_without_payload(st, finite);
      st.values_[k] = finite ? 0.0f : 1.0f;
      coll.allreduce_sum(st.values_);
      r.sent = {st.values_.size() * sizeof(float), st.values_.size(), k};
      r.status = st.values_[k] != 0.0f ? step_status::non_finite : step_status::ok;
      if (r.status == step_status::ok) {
        const float w = static_cast<float>(coll.size());
        if (w != 1.0f) divide(*exec_, values, w);
        fill(*exec_, inout, 0.0f);
        if (detail::wide_indices(inout.size()))
          scatter_add(*exec_, inout, std::span<const std::uint64_t>(st.index64_), values);
        else
          scatter_add(*exec_, inout, std::span<const std::uint32_t>(st.index32_), values);
      }
    }
    if (r.status == step_status::ok)
      commit(st);
    else
      detail::sparse_steps::discard(st);
    return r;
  }

  /// The first half of a step, for a trainer that exchanges payloads itself: draws the indices
  /// (the same on every rank in shared mode), gathers the kept entries of m = grad + e, writes
  /// the next error memory aside, and returns this rank's payload. Changes neither the memory
  /// nor the step counter; once every rank's payload validated without non_finite, call commit.
  std::span<const std::byte> stage(state& st, std::span<const float> grad, std::size_t rank = 0) const {
    fit(st);
    check_size(st, grad.size());
    return detail::sparse_steps::stage(st, max_payload_bytes(st), [&](auto m, std::span<std::byte> out) {
      return write(st, grad, m.memory, m.staged, out, rank);
    });
  }

  /// The second half: the staged memory becomes current and the step counter advances.
  void commit(state& st) const { detail::sparse_steps::commit(st, "randk"); }

  // PayloadCodec: the kept entries of `in` as it is (no error memory), keyed by state.step.

  [[nodiscard]] std::size_t max_payload_bytes(const state& st) const {
    return detail::sparse_payload_bytes(st.layer.size(), kept(st.layer));
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
  void load(state& st, checkpoint_reader& in) const { detail::sparse_steps::load(st, in, "randk state"); }

private:
  [[nodiscard]] std::size_t kept(const layer_info& layer) const {
    return detail::kept_count("randk", layer, params_.ratio, params_.k);
  }

  void fit(state& st) const {
    const std::size_t k = kept(st.layer);
    BELLOWS_EXPECTS(!params_.unbiased || params_.feedback == feedback::none, "randk: layer '",
                    st.layer.name, "': unbiased scaling needs feedback none, got feedback ",
                    to_string(params_.feedback));
    const cpu::sample_plan plan = cpu::plan_sample(st.layer.size(), k);
    if (!(plan == st.plan_)) {
      st.plan_ = plan;
      st.work_.fit(plan);
    }
    if (params_.mode == randk_mode::shared) {  // no-ops once sized
      if (detail::wide_indices(st.layer.size()))
        st.index64_.resize(k);
      else
        st.index32_.resize(k);
      st.values_.resize(k + 1);
    }
    detail::sparse_steps::fit_memory(st, params_.feedback, "randk");
  }

  /// Draws this step's indices into `index` and gathers the kept entries of m = g (+ e) into
  /// `values`, writing the next memory into `staged` when `e` is not empty; false when m holds
  /// NaN or Inf.
  template <class Index>
  bool draw_and_gather(state& st, std::span<const float> g, std::span<const float> e,
                       std::span<float> staged, std::span<Index> index, std::span<float> values,
                       std::size_t rank) const {
    const philox::stream draw{params_.seed, static_cast<std::uint32_t>(st.step), st.layer.id,
                              params_.mode == randk_mode::shared ? philox::stream::shared
                                                                 : static_cast<std::uint32_t>(rank)};
    draw_sample(*exec_, st.plan_, draw, st.work_);
    const float scale = params_.unbiased ? static_cast<float>(static_cast<double>(st.layer.size()) /
                                                              static_cast<double>(st.plan_.k))
                                         : 1.0f;
    return gather_sample(*exec_, st.plan_, st.work_, g, e, staged, cpu::sparse_arrays<Index>{index, values}, scale);
  }

  std::span<std::byte> write(state& st, std::span<const float> g, std::span<const float> e,
                             std::span<float> staged, std::span<std::byte> out, std::size_t rank) const {
    return detail::write_sparse<cpu::sparse_arrays>(out, wire::codec::randk, g.size(), [&](auto begin) {
      const auto arrays = begin(st.plan_.k);
      return draw_and_gather(st, g, e, staged, arrays.index, arrays.value, rank);
    });
  }

  [[nodiscard]] detail::sparse_entries read(const state& st, std::span<const std::byte> payload) const {
    const std::size_t k = kept(st.layer);
    return detail::read_sparse(payload, wire::codec::randk, st.layer, k, k);
  }

  static void check_size(const state& st, std::size_t n) {
    BELLOWS_EXPECTS(n == st.layer.size(), "randk: layer '", st.layer.name, "' of shape ",
                    st.layer.shape.to_string(), " has ", st.layer.size(), " elements, the buffer ", n);
  }

  randk_params params_;
  Exec* exec_;
};

static_assert(Compressor<randk<>, archetypes::collective>, "randk must model Compressor");
static_assert(PayloadCodec<randk<>>, "randk must model PayloadCodec");

}  // namespace bellows
