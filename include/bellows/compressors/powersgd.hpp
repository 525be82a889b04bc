// SPDX-License-Identifier: Apache-2.0
// PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019): a rank-r approximation of each layer's
// gradient matrix by one step of subspace iteration, exchanged as two allreduces of the skinny
// factors. The steps follow PyTorch's PowerSGD communication hook, as docs/spec.md#powersgd fixes them:
//
//   M = g + e; orthogonalise Q; P = M Q; allreduce_sum(P); orthogonalise P;
//   Q = M^T P; allreduce_sum(Q); Q = Q / W; out = P Q^T; e = M - out
//
// Per layer, the matrix view is n = d0 rows by m = d1 * ... * dk columns. A layer is compressed
// only when (n + m) r' min_compression_rate < n m, with r' = min(r, n, m); 1-D tensors and
// scalars never are. Layers left uncompressed are averaged by one allreduce and keep no memory;
// `aggregation(state)` tells which way a layer goes (`aggregation()` names the compressed way).
//
// Cost: M is never stored. One step reads g and e three times (P = M Q, Q = M^T P, and the
// reconstruction) and writes e and the output once: eight streams of n m floats.
//
// Non-finite input: one float appended to the P allreduce carries each rank's verdict (is its
// local P finite? a NaN or Inf anywhere in row i of M makes row i of P non-finite), so the ranks
// agree in their first exchange. Until that exchange shows every rank finite, the step writes
// only workspace; then every rank commits. Finite values overflow nowhere while
// |M| <= FLT_MAX / (1 + sqrt(n)) (|Q|, |out| <= sqrt(n) max |M|); beyond that, a summed Q that
// overflowed skips the step the same way on every rank, but out = P Q^T or e = M - out may
// still overflow.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "bellows/compressors/detail/powersgd_rules.hpp"
#include "bellows/compressors/powersgd_types.hpp"
#include "bellows/concepts.hpp"
#include "bellows/core/checked.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/philox.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/cpu/gram_schmidt.hpp"
#include "bellows/cpu/normals.hpp"
#include "bellows/cpu/skinny_gemm.hpp"
#include "bellows/feedback/error_feedback.hpp"

namespace bellows {

template <class Exec = cpu::executor>
class powersgd : public detail::powersgd_common<powersgd<Exec>, Exec> {
  using base = detail::powersgd_common<powersgd<Exec>, Exec>;
  friend base;

public:
  /// One layer: sizes, rank and step counter (powersgd_layer); the error memory e, the query Q
  /// and workspace, all sized at make_state.
  struct state : detail::powersgd_layer {
    error_memory memory;          ///< e (n x m, row-major) of a compressed layer, if feedback is on
    std::vector<float> query;     ///< Q, m x (columns held) column-major, kept between steps
    std::vector<float> next;      ///< workspace: this step's Q, swapped into `query` on commit
    std::vector<float> exchange;  ///< workspace: P (n x r') and the non-finite vote, or the dense buffer
  };

  explicit powersgd(const powersgd_params& params = {}, Exec& exec = Exec::shared()) : base(params, exec) {}

  template <Collective Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    BELLOWS_EXPECTS(inout.size() == st.layer.size(), "powersgd: layer '", st.layer.name, "' of shape ",
                    st.layer.shape.to_string(), " has ", st.layer.size(), " elements, the buffer ", inout.size());
    this->follow_rank(st);
    return st.compressed() ? reduce_low_rank(st, inout, coll) : reduce_dense(st, inout, coll);
  }

  /// Appends what a layer carries from step to step: r', step, e (if any) and Q.
  void save(const state& st, checkpoint_writer& out) const {
    detail::write_powersgd_record(out, st.rank, st.step, st.memory.values(), st.query, st.cols);
  }

  /// Reads what save wrote for the same layer. All of it is checked (ranks within the layer's,
  /// array sizes) before the state changes; a mismatch raises bellows::wire_error.
  void load(state& st, checkpoint_reader& in) const {
    detail::powersgd_record rec = detail::read_powersgd_record(st.layer, in);
    state next = st;
    next.step = rec.step;
    if (rec.memory.empty()) {
      next.memory = error_memory();
    } else {
      if (next.memory.values().empty())
        next.memory = error_memory(
            this->params_.feedback == feedback::none ? feedback::residual : this->params_.feedback, st.layer.size());
      std::ranges::copy(rec.memory, next.memory.values().begin());
    }
    next.query = std::move(rec.query);
    next.rank = 0;
    resize(next, static_cast<std::size_t>(rec.rank));  // a record of rank 0 sizes the dense buffer too
    st = std::move(next);
  }

private:
  /// Sizes a state for effective rank r (0: uncompressed): the memory once it is first
  /// compressed, Q keeping the columns it holds, and the workspaces.
  void resize(state& st, std::size_t r) const {
    const std::size_t n = st.rows, m = st.cols;
    st.rank = r;
    if (r == 0) {
      st.exchange.assign(detail::checked_add(st.layer.size(), 1, "powersgd: layer '", st.layer.name, "'"), 0.0f);
      return;
    }
    detail::check_powersgd_sizes(st.layer, r);
    if (st.memory.values().empty() && this->params_.feedback != feedback::none)
      st.memory = error_memory(this->params_.feedback, n * m);
    const std::size_t held = st.query.size() / m;
    st.query.resize(m * r);
    if (r > held) draw_columns(st, std::span<float>(st.query).subspan(held * m), held, 0);
    st.next.assign(m * r, 0.0f);
    st.exchange.assign(n * r + 1, 0.0f);
  }

  /// Columns first_col, first_col + 1, ... of the query drawn at `step`.
  void draw_columns(const state& st, std::span<float> out, std::size_t first_col, std::uint64_t step) const {
    fill_normals(*this->exec_, out, this->query_stream(st, step), first_col * st.cols);
  }

  /// This step's query in st.next: the previous Q (warm start) or a new draw, with any all-zero
  /// column of a warm-started Q drawn again (it would otherwise stay zero for good), then
  /// orthogonalised.
  void prepare_query(state& st) const {
    const std::size_t m = st.cols;
    if (this->params_.warm_start) {
      std::ranges::copy(st.query, st.next.begin());
      for (std::size_t j = 0; j < st.rank; ++j) {
        const std::span<float> col = std::span<float>(st.next).subspan(j * m, m);
        if (std::ranges::all_of(col, [](float v) { return v == 0.0f; })) draw_columns(st, col, j, 0);
      }
    } else {
      draw_columns(st, st.next, 0, st.step);
    }
    orthogonalize(*this->exec_, st.next, m, this->params_.orthogonalization_eps);
  }

  template <Collective Coll>
  reduce_result reduce_low_rank(state& st, std::span<float> inout, Coll& coll) {
    const std::size_t n = st.rows, m = st.cols, r = st.rank;
    const std::span<float> e = st.memory.values();
    const compensated_matrix M{inout, e, n, m};
    const std::span<float> p = std::span<float>(st.exchange).first(n * r);
    float& vote = st.exchange[n * r];

    prepare_query(st);
    project_rows(*this->exec_, M, st.next, p);
    vote = all_finite(*this->exec_, std::span<const float>(p)) ? 0.0f : 1.0f;
    coll.allreduce_sum(std::span<float>(st.exchange));
    traffic sent{st.exchange.size() * sizeof(float), st.exchange.size(), (n + m) * r};
    if (vote != 0.0f || !all_finite(*this->exec_, std::span<const float>(p))) return {step_status::non_finite, sent};

    orthogonalize(*this->exec_, p, n, this->params_.orthogonalization_eps);
    project_cols(*this->exec_, M, p, st.next);
    coll.allreduce_sum(std::span<float>(st.next));
    divide(*this->exec_, st.next, static_cast<float>(coll.size()));
    sent += traffic{st.next.size() * sizeof(float), st.next.size(), 0};
    // M^T P overflows where M is finite but near the largest float: every rank holds the same
    // summed Q, so all skip the step here, before anything but workspace was written.
    if (!all_finite(*this->exec_, std::span<const float>(st.next))) return {step_status::non_finite, sent};

    reconstruct_update(*this->exec_, inout, e, n, m, p, st.next);
    this->commit(st);
    return {step_status::ok, sent};
  }

  template <Collective Coll>
  reduce_result reduce_dense(state& st, std::span<float> inout, Coll& coll) {
    const std::size_t n = inout.size();
    const std::span<float> values = std::span<float>(st.exchange).first(n);
    const std::span<float> e = st.memory.values();
    if (e.empty())
      std::ranges::copy(inout, values.begin());
    else
      add(*this->exec_, values, inout, e);  // a memory left from compressed steps goes out with g
    st.exchange[n] = all_finite(*this->exec_, std::span<const float>(values)) ? 0.0f : 1.0f;
    coll.allreduce_sum(std::span<float>(st.exchange));
    const traffic sent{st.exchange.size() * sizeof(float), st.exchange.size(), n};
    if (st.exchange[n] != 0.0f) return {step_status::non_finite, sent};
    std::ranges::copy(values, inout.begin());
    divide(*this->exec_, inout, static_cast<float>(coll.size()));
    if (!e.empty()) fill(*this->exec_, e, 0.0f);
    ++st.step;
    return {step_status::ok, sent};
  }
};

static_assert(Compressor<powersgd<>, archetypes::collective>, "powersgd must model Compressor");
static_assert(CheckpointedCompressor<powersgd<>>, "powersgd must model CheckpointedCompressor");
static_assert(SelectiveCompressor<powersgd<>>, "powersgd must model SelectiveCompressor");

template <>
struct method_slot<powersgd_method::codec.id> {
  using type = powersgd_method;
};

}  // namespace bellows

#if defined(__CUDACC__)  // the device compressor, for device code that includes the list
#include "bellows/compressors/powersgd.cuh"
#endif
