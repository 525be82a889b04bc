// SPDX-License-Identifier: Apache-2.0
// Top-k sparsification with error feedback (docs/spec.md#top-k; Stich, Cordonnier and Jaggi,
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
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "bellows/compressors/detail/sparse_codec.hpp"
#include "bellows/compressors/topk_types.hpp"
#include "bellows/core/checked.hpp"
#include "bellows/cpu/select.hpp"

namespace bellows {

template <class Exec = cpu::executor>
class topk : public detail::sparse_codec<topk<Exec>, Exec> {
  using base = detail::sparse_codec<topk<Exec>, Exec>;

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
    select_plan plan_{};
    cpu::select_workspace work_;
    std::vector<float> dense_;  // sized at the first step that averages densely
  };

  static constexpr wire::codec codec = topk_method::codec;
  static constexpr const char* name = topk_method::codec.name;

  /// Raises bellows::error naming a parameter out of range (topk_params::validate).
  explicit topk(topk_params params = {}, Exec& exec = Exec::shared()) : base(exec), params_(params) {
    params_.validate();
  }

  [[nodiscard]] const topk_params& params() const noexcept { return params_; }
  /// One allgather of this rank's payload (k entries; in approximate mode up to topk_most of
  /// them), or, where the dense switch finds it cheaper over `ranks`, one allreduce of n + 1 floats.
  [[nodiscard]] exchange_rounds rounds(const state& st, std::size_t ranks) const {
    return detail::topk_rounds(st.layer, counts(st.layer), params_.dense_switch, ranks);
  }

  /// One step (a collective call). By allgather: stage, exchange the payloads, average them,
  /// and on success commit. When dense_switch is on and W * k * (index + value bytes) >= 4 n,
  /// by one allreduce of n + 1 floats instead: the kept entries written densely, then the
  /// non-finite flag. The traffic counts the kept values as the payload's elements.
  template <Collective Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    if (!averages_densely(st.layer, coll.size()))
      return this->conclude(st, this->average_by_allgather(st, this->stage(st, inout, coll.rank()), inout, coll));
    this->fit(st);
    detail::check_buffer(name, st.layer, inout.size());
    const std::size_t n = inout.size();
    st.dense_.resize(n + 1);
    const std::span<float> sum(st.dense_.data(), n);
    const auto [memory, staged] = this->compensation(st);
    const std::optional<std::size_t> kept =
        select_top_dense(*this->exec_, st.plan_, sample_key(st, coll.rank()), inout, memory, staged, st.work_, sum);
    this->staged_without_payload(st, kept.has_value());
    st.dense_[n] = kept ? 0.0f : 1.0f;
    coll.allreduce_sum(st.dense_);
    const reduce_result r{st.dense_[n] != 0.0f ? step_status::non_finite : step_status::ok,
                          {st.dense_.size() * sizeof(float), st.dense_.size(), kept.value_or(0)}};
    if (r.status == step_status::ok) divide(*this->exec_, inout, sum, static_cast<float>(coll.size()));
    return this->conclude(st, r);
  }

private:
  friend base;

  /// k, and the most approximate mode may keep: ceil(1.25 k), at most n.
  [[nodiscard]] std::pair<std::size_t, std::size_t> counts(const layer_info& layer) const {
    const std::size_t k = detail::kept_count(layer, params_.ratio, params_.k);
    return {k, topk_most(params_.mode, layer.size(), k)};
  }

  [[nodiscard]] bool averages_densely(const layer_info& layer, std::size_t ranks) const {
    return params_.dense_switch && detail::dense_is_cheaper(layer.size(), ranks, counts(layer).second);
  }

  void fit(state& st) const {
    const auto [k, most] = counts(st.layer);
    const select_plan plan = plan_select(st.layer.size(), k, most);
    if (!(plan == st.plan_)) {
      st.work_.fit(plan);
      st.plan_ = plan;
    }
    this->fit_memory(st, params_.feedback);
  }

  /// The key of the sample that sets the selection threshold.
  [[nodiscard]] philox::stream sample_key(const state& st, std::size_t rank) const noexcept {
    return {params_.seed, static_cast<std::uint32_t>(st.step), st.layer.id, static_cast<std::uint32_t>(rank)};
  }

  std::span<std::byte> write(state& st, std::span<const float> g, std::span<const float> e, std::span<float> staged,
                             std::span<std::byte> out, std::size_t rank) const {
    return detail::write_sparse<sparse_arrays>(out, codec, g.size(), [&](auto begin) {
      return select_top(*this->exec_, st.plan_, sample_key(st, rank), g, e, staged, st.work_, begin);
    });
  }

  topk_params params_;
};

static_assert(Compressor<topk<>, archetypes::collective>, "topk must model Compressor");
static_assert(CheckpointedCompressor<topk<>>, "topk must model CheckpointedCompressor");
static_assert(PayloadCodec<topk<>>, "topk must model PayloadCodec");

template <>
struct method_slot<topk_method::codec.id> {
  using type = topk_method;
};

}  // namespace bellows

#if defined(__CUDACC__)  // the device compressor, for device code that includes the list
#include "bellows/compressors/topk.cuh"
#endif
