// SPDX-License-Identifier: Apache-2.0
// Rand-k sparsification (docs/spec.md#rand-k): each rank keeps k entries of its compensated gradient
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
#include <utility>
#include <vector>

#include "bellows/compressors/detail/sparse_codec.hpp"
#include "bellows/compressors/randk_types.hpp"
#include "bellows/cpu/sample.hpp"

namespace bellows {

template <class Exec = cpu::executor>
class randk : public detail::sparse_codec<randk<Exec>, Exec> {
  using base = detail::sparse_codec<randk<Exec>, Exec>;

public:
  /// A layer's state: its step counter and error memory (public), and the workspace of its
  /// draws. It may serve rand-k compressors of other ratios too; it keeps its memory.
  class state : public detail::sparse_state {
  public:
    /// The elements kept per step.
    [[nodiscard]] std::size_t k() const noexcept { return plan_.k; }

  private:
    friend class randk;
    sample_plan plan_{};
    cpu::sample_workspace work_;
    std::vector<std::uint32_t> index32_;  // shared mode: the indices of the step
    std::vector<std::uint64_t> index64_;
    std::vector<float> values_;  // shared mode: the k values, then the non-finite flag
  };

  static constexpr wire::codec codec = randk_method::codec;
  static constexpr const char* name = randk_method::codec.name;

  /// Raises bellows::error naming a parameter out of range (randk_params::validate).
  explicit randk(randk_params params = {}, Exec& exec = Exec::shared()) : base(exec), params_(params) {
    params_.validate();
  }

  [[nodiscard]] const randk_params& params() const noexcept { return params_; }
  /// Shared mode: one allreduce of the k values and the verdict; per rank: one allgather of
  /// this rank's payload of k entries.
  [[nodiscard]] exchange_rounds rounds(const state& st, std::size_t /*ranks*/) const {
    return detail::randk_rounds(st.layer, detail::kept_count(st.layer, params_.ratio, params_.k),
                                params_.mode == randk_mode::shared);
  }

  /// One step (a collective call). Shared mode: one allreduce of the k kept values and a
  /// non-finite flag, then the average scattered into `inout`. Per-rank mode: stage, allgather
  /// and average of the payloads. On success the staged memory is committed.
  template <Collective Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    if (params_.mode == randk_mode::per_rank)
      return this->conclude(st, this->average_by_allgather(st, this->stage(st, inout, coll.rank()), inout, coll));
    fit(st);
    detail::check_buffer(name, st.layer, inout.size());
    const std::size_t k = st.plan_.k;
    const std::span<float> values(st.values_.data(), k);
    const auto [memory, staged] = this->compensation(st);
    const bool finite = detail::wide_indices(inout.size())
                            ? draw_and_gather(st, inout, memory, staged, std::span(st.index64_), values, 0)
                            : draw_and_gather(st, inout, memory, staged, std::span(st.index32_), values, 0);
    this->staged_without_payload(st, finite);
    st.values_[k] = finite ? 0.0f : 1.0f;
    coll.allreduce_sum(st.values_);
    const reduce_result r{st.values_[k] != 0.0f ? step_status::non_finite : step_status::ok,
                          {st.values_.size() * sizeof(float), st.values_.size(), k}};
    if (r.status == step_status::ok) {
      const float w = static_cast<float>(coll.size());
      if (w != 1.0f) divide(*this->exec_, values, w);
      fill(*this->exec_, inout, 0.0f);
      if (detail::wide_indices(inout.size()))
        scatter_add(*this->exec_, inout, std::span<const std::uint64_t>(st.index64_), values);
      else
        scatter_add(*this->exec_, inout, std::span<const std::uint32_t>(st.index32_), values);
    }
    return this->conclude(st, r);
  }

private:
  friend base;

  [[nodiscard]] std::pair<std::size_t, std::size_t> counts(const layer_info& layer) const {
    const std::size_t k = detail::kept_count(layer, params_.ratio, params_.k);
    return {k, k};
  }

  void fit(state& st) const {
    const std::size_t k = counts(st.layer).first;
    const sample_plan plan = plan_sample(st.layer.size(), k);
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
    this->fit_memory(st, params_.feedback);
  }

  /// Draws this step's indices into `index` and gathers the kept entries of m = g (+ e) into
  /// `values`, writing the next memory into `staged` when `e` is not empty; false when m holds
  /// NaN or Inf.
  template <class Index>
  bool draw_and_gather(state& st, std::span<const float> g, std::span<const float> e, std::span<float> staged,
                       std::span<Index> index, std::span<float> values, std::size_t rank) const {
    const philox::stream draw{params_.seed, static_cast<std::uint32_t>(st.step), st.layer.id,
                              params_.mode == randk_mode::shared ? philox::stream::shared
                                                                 : static_cast<std::uint32_t>(rank)};
    draw_sample(*this->exec_, st.plan_, draw, st.work_);
    const float scale = params_.unbiased
                            ? static_cast<float>(static_cast<double>(st.layer.size()) / static_cast<double>(st.plan_.k))
                            : 1.0f;
    return gather_sample(*this->exec_, st.plan_, st.work_, g, e, staged, sparse_arrays<Index>{index, values}, scale);
  }

  std::span<std::byte> write(state& st, std::span<const float> g, std::span<const float> e, std::span<float> staged,
                             std::span<std::byte> out, std::size_t rank) const {
    return detail::write_sparse<sparse_arrays>(out, codec, g.size(), [&](auto begin) {
      const auto arrays = begin(st.plan_.k);
      return draw_and_gather(st, g, e, staged, arrays.index, arrays.value, rank);
    });
  }

  randk_params params_;
};

static_assert(Compressor<randk<>, archetypes::collective>, "randk must model Compressor");
static_assert(CheckpointedCompressor<randk<>>, "randk must model CheckpointedCompressor");
static_assert(PayloadCodec<randk<>>, "randk must model PayloadCodec");

template <>
struct method_slot<randk_method::codec.id> {
  using type = randk_method;
};

}  // namespace bellows

#if defined(__CUDACC__)  // the device compressor, for device code that includes the list
#include "bellows/compressors/randk.cuh"
#endif
