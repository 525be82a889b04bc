// SPDX-License-Identifier: Apache-2.0
// PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019): a rank-r approximation of each layer's
// gradient matrix by one step of subspace iteration, exchanged as two allreduces of the skinny
// factors. The steps follow PyTorch's PowerSGD communication hook, as docs/spec.md#powersgd fixes them:
//
//   M = g + e; orthogonalise Q; P = M Q; allreduce_sum(P); orthogonalise P;
//   Q = M^T P; allreduce_sum(Q); Q = Q / W; out = P Q^T; e = M - out
//
// Written once over the executor: powersgd<cpu::executor> keeps its state in host memory,
// powersgd<cuda::executor> (compressors/powersgd.cuh brings its kernels) in device memory, with
// a DeviceCollective exchanging on the executor's stream. The backends' kernels give the same
// statuses, counters, traffic and dense averages; the products sum in another order on the
// device (cuda/skinny_gemm.cuh), so P, Q and what is built from them agree within rounding.
//
// Per layer, the matrix view is n = d0 rows by m = d1 * ... * dk columns. A layer is compressed
// only when (n + m) r' min_compression_rate < n m, with r' = min(r, n, m); 1-D tensors and
// scalars never are. Layers left uncompressed are averaged by one allreduce and keep no memory;
// `rounds(state, ranks)` tells which way a layer goes.
//
// Cost: M is never stored. One step reads g and e three times (P = M Q, Q = M^T P, and the
// reconstruction) and writes e and the output once: eight streams of n m floats.
//
// Non-finite input: one float appended to the P allreduce carries each rank's verdict (is its
// local P finite? a NaN or Inf anywhere in row i of M makes row i of P non-finite). The summed
// verdict is raised again where the summed P, and then the summed Q (M^T P may overflow where M
// is finite), is not finite; the reconstruction reads it on the device and writes g and e only
// when it stayed 0, so every rank skips the step alike, and the query and the counter change only
// in conclude, after the verdict was read on the host. Finite values overflow nowhere while
// |M| <= FLT_MAX / (1 + sqrt(n)) (|Q|, |out| <= sqrt(n) max |M|); beyond that, out = P Q^T or
// e = M - out may still overflow. A layer averaged dense: m = g (+ e) and its verdict in one
// pass, the verdict appended, one allreduce of n + 1 floats, g = sums / W unless the summed
// verdict is not 0, then e = 0 in conclude.
//
// Phases (concepts.hpp, PhasedCompressor): begin forms P and the verdict into part 0 (or the
// dense values); next orthogonalises the summed P and forms Q into part 1; finish divides Q by W
// and reconstructs; conclude commits. reduce runs them on the state's own buffers (`exchange`,
// `next`) and reads the verdict after the P round (its first wait), so that a non-finite step
// makes no Q round; a step run by phases makes every round and skips its writes on the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "bellows/compressors/detail/powersgd_rules.hpp"
#include "bellows/compressors/detail/step_checks.hpp"
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
#include "bellows/cpu/float_array.hpp"
#include "bellows/cpu/gram_schmidt.hpp"
#include "bellows/cpu/normals.hpp"
#include "bellows/cpu/skinny_gemm.hpp"
#include "bellows/plan/float_array.hpp"

namespace bellows {

template <class Exec = cpu::executor>
class powersgd : public detail::powersgd_common<powersgd<Exec>, Exec> {
  static_assert(Executor<Exec> && detail::LowRankExecutor<Exec>,
                "powersgd<Exec>: Exec must model Executor and provide the low-rank kernels (detail::LowRankExecutor)");
  using base = detail::powersgd_common<powersgd<Exec>, Exec>;
  using array = float_array_for<Exec>;
  friend base;

public:
  /// One layer: sizes, rank and step counter (powersgd_layer); in the backend's memory the error
  /// memory e, the query Q and the workspaces, all sized at make_state.
  struct state : detail::powersgd_layer {
    array memory;    ///< e (n x m, row-major) once compressed with feedback on; else empty
    array query;     ///< Q, m x (columns held) column-major, kept between steps
    array next;      ///< workspace: this step's Q (reduce's part 1), swapped into `query` on commit
    array exchange;  ///< workspace: P (n x r') and the verdict, or the dense sums and it (reduce's part 0)
    host_values_for<Exec, float> verdicts;  ///< the summed verdict after the P round and after the last, on the host
  };

  static constexpr const char* name = "powersgd";

  explicit powersgd(const powersgd_params& params = {}, Exec& exec = Exec::shared()) : base(params, exec) {}

  /// One step (a collective call; see the file's comment): the phases on the state's buffers.
  /// Waits for the executor twice for a compressed layer (the verdicts), once for a dense one.
  /// Reallocates first when this compressor's rank gives the layer another r' than the state's.
  template <CollectiveFor<Exec> Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    detail::check_buffer(name, st.layer, inout.size());
    detail::check_stream(name, st.layer, coll, *this->exec_);
    this->follow_rank(st);  // before the parts are taken from the buffers it may replace
    const round_part parts[] = {{st.exchange.span()}, {st.next.span()}};
    const round_parts used(parts, st.compressed() ? 2 : 1);
    begin(st, inout, used, coll.rank(), coll.size());
    coll.allreduce_sum(parts[0].values);
    if (st.compressed()) {
      next(st, inout, 1, used);
      this->exec_->synchronize();
      if (st.verdicts[0] != 0.0f) return conclude(st);  // no rank sends its Q
      coll.allreduce_sum(parts[1].values);
    }
    finish(st, inout, used, coll.rank(), coll.size());
    this->exec_->synchronize();
    return conclude(st);
  }

  // Phases (concepts.hpp, PhasedCompressor). Part 0: P (n r') and the verdict, or the dense
  // values and it; part 1: Q (m r').

  /// Follows the compressor's rank (allocating only when it changes), then writes part 0 from
  /// M = grad + e: this step's query, P = M Q and the verdict on P; or, for a dense layer, M and
  /// the verdict on it.
  void begin(state& st, std::span<const float> grad, round_parts parts, std::size_t /*rank*/, std::size_t ranks) {
    Exec& exec = *this->exec_;
    detail::check_buffer(name, st.layer, grad.size());
    this->follow_rank(st);
    detail::check_parts(name, st.layer, this->rounds(st, ranks), parts, part_alignment);
    st.verdicts[0] = st.verdicts[1] = 0.0f;
    const std::size_t n = st.compressed() ? st.rows * st.rank : grad.size();
    const std::span<float> values = parts[0].values.first(n);
    float* vote = parts[0].values.data() + n;
    fill(exec, parts[0].values.subspan(n), 0.0f);
    if (st.compressed()) {
      prepare_query(st);
      project_rows(exec, matrix(st, grad), std::as_const(st.next).span(), values);
      flag_non_finite(exec, std::span<const float>(values), vote);
    } else if (st.memory.size() == 0) {
      copy(exec, values, grad);
      flag_non_finite(exec, std::span<const float>(values), vote);
    } else {
      compensate(exec, values, grad, st.memory.span(), vote);  // a memory left from compressed steps goes out with g
    }
  }

  /// Round 1 of a compressed layer, from the summed part 0: the verdict raised where the summed P
  /// is not finite and copied to the host, P orthogonalised in place, and Q = M^T P into part 1.
  void next(state& st, std::span<const float> grad, std::size_t round, round_parts parts) {
    Exec& exec = *this->exec_;
    BELLOWS_EXPECTS(st.compressed() && round == 1, name, ": layer '", st.layer.name, "' has no round ", round);
    const std::span<float> p = parts[0].values.first(st.rows * st.rank);
    float* vote = parts[0].values.data() + p.size();
    flag_non_finite(exec, std::span<const float>(p), vote);
    copy_word(exec, st.verdicts[0], vote);
    orthogonalize(exec, p, st.rows, this->params_.orthogonalization_eps);
    project_cols(exec, matrix(st, grad), std::as_const(p), parts[1].values);
  }

  /// From the summed parts: Q = the sum / W, the verdict raised where it is not finite, then
  /// grad = P Q^T and e = M - grad unless the verdict is not 0 (read on the device); the verdict
  /// copied to the host. A dense layer: grad = the sums / W unless its verdict is not 0.
  void finish(state& st, std::span<float> grad, round_parts parts, std::size_t /*rank*/, std::size_t ranks) {
    Exec& exec = *this->exec_;
    if (!st.compressed()) {
      divide(exec, grad, std::as_const(parts[0].values).first(grad.size()), static_cast<float>(ranks),
             parts[0].values.data() + grad.size());
      copy_word(exec, st.verdicts[0], parts[0].values.data() + grad.size());
      return;
    }
    const std::span<const float> p = std::as_const(parts[0].values).first(st.rows * st.rank);
    const float* vote = parts[0].values.data() + p.size();
    const std::span<float> q = parts[1].values;
    if (ranks != 1) divide(exec, q, static_cast<float>(ranks));
    flag_non_finite(exec, std::span<const float>(q), parts[0].values.data() + p.size());
    reconstruct_update(exec, grad, st.memory.span(), st.rows, st.cols, p, std::as_const(q), vote);
    if (q.data() != st.next.span().data()) copy(exec, st.next.span(), std::as_const(q));
    copy_word(exec, st.verdicts[1], vote);
  }

  /// The status and traffic. When every rank was finite: a compressed layer's Q becomes the one
  /// kept; a dense layer's memory, sent with its gradient, becomes 0; the counter advances.
  reduce_result conclude(state& st) {
    const std::size_t n = st.rows, m = st.cols, r = st.rank;
    if (!st.compressed()) {
      const std::size_t size = st.layer.size();
      const traffic sent{(size + 1) * sizeof(float), size + 1, size};
      if (st.verdicts[0] != 0.0f) return {step_status::non_finite, sent};
      if (st.memory.size() != 0) fill(*this->exec_, st.memory.span(), 0.0f);
      ++st.step;
      return {step_status::ok, sent};
    }
    traffic sent{(n * r + 1) * sizeof(float), n * r + 1, (n + m) * r};
    if (st.verdicts[0] != 0.0f) return {step_status::non_finite, sent};
    sent += traffic{m * r * sizeof(float), m * r, 0};
    if (st.verdicts[1] != 0.0f) return {step_status::non_finite, sent};
    this->commit(st);
    return {step_status::ok, sent};
  }

  /// When the trainer's learning rate changes from lr_old to lr_new: a feedback::scaled memory
  /// is multiplied by lr_old / lr_new, so that it stands for the same parameter update; other
  /// memories are left alone.
  void rescale(state& st, float lr_old, float lr_new) const {
    BELLOWS_EXPECTS(lr_old > 0 && lr_new > 0, name, ": learning rates must be > 0, got ", lr_old, " and ", lr_new);
    if (this->params_.feedback == feedback::scaled && lr_old != lr_new)
      scale(*this->exec_, st.memory.span(), lr_old / lr_new);
  }

  /// Appends what a layer carries from step to step: r', step, e (if any) and Q; the same record
  /// on every backend, so either reads what the other wrote. Waits for the executor.
  void save(const state& st, checkpoint_writer& out) const {
    std::vector<float> memory, query;
    detail::write_powersgd_record(out, st.rank, st.step, st.memory.host(*this->exec_, memory),
                                  st.query.host(*this->exec_, query), st.cols);
  }

  /// Reads what save wrote for the same layer. All of it is checked (ranks within the layer's,
  /// array sizes, finite values) before the state changes; a mismatch raises
  /// bellows::wire_error. Waits for the executor.
  void load(state& st, checkpoint_reader& in) const {
    const detail::powersgd_record rec = detail::read_powersgd_record(st.layer, in);
    if (rec.rank != 0) check_rank(st, static_cast<std::size_t>(rec.rank));  // before anything changes
    array memory(*this->exec_, rec.memory.size()), query(*this->exec_, rec.query.size());
    memory.assign(*this->exec_, rec.memory);
    query.assign(*this->exec_, rec.query);
    st.memory = std::move(memory);
    st.query = std::move(query);
    st.step = rec.step;
    st.rank = 0;
    resize(st, static_cast<std::size_t>(rec.rank));  // a record of rank 0 sizes the dense buffer too
  }

private:
  /// Sizes a state for effective rank r (0: uncompressed): the memory (zero) once it is first
  /// compressed, Q keeping the first min(held, r) columns it holds and the others drawn, and the
  /// workspaces. Waits for the executor before it replaces anything.
  void resize(state& st, std::size_t r) const {
    Exec& exec = *this->exec_;
    const std::size_t n = st.rows, m = st.cols;
    if (r != 0) check_rank(st, r);  // before anything changes
    if (st.verdicts.size() == 0) st.verdicts = host_values_for<Exec, float>(exec, 2);
    st.rank = r;
    if (r == 0) {
      array exchange(exec, detail::checked_add(st.layer.size(), 1, "powersgd: layer '", st.layer.name, "'"));
      exec.synchronize();  // work enqueued before may still use the buffer replaced
      st.exchange = std::move(exchange);
      return;
    }
    if (st.memory.size() == 0 && this->params_.feedback != feedback::none) st.memory = array(exec, n * m);
    const std::size_t held = st.query.size() / m;
    array query;
    if (held != r) {
      query = array(exec, m * r);
      const std::size_t kept = std::min(held, r);
      copy(exec, query.span().first(kept * m), std::as_const(st.query).span().first(kept * m));
      if (r > held) draw_columns(st, query.span().subspan(held * m), held, 0);
    }
    array next(exec, m * r), exchange(exec, n * r + 1);
    reserve_projections(exec, n, m, r);
    exec.synchronize();  // work enqueued before (the copy above too) may still use the buffers replaced
    if (held != r) st.query = std::move(query);
    st.next = std::move(next);
    st.exchange = std::move(exchange);
  }

  /// Raises bellows::error when the layer cannot be compressed at effective rank r: a step's
  /// traffic overflows std::size_t, or the query, every column of which may be drawn again (warm
  /// start's redraw), overruns the random stream.
  static void check_rank(const state& st, std::size_t r) {
    detail::check_powersgd_sizes(st.layer, r);
    BELLOWS_EXPECTS(2 * st.cols * r <= philox::stream::max_words, "powersgd: layer '", st.layer.name, "': a query of ",
                    st.cols * r, " floats overruns the random stream");
  }

  /// Columns first_col, first_col + 1, ... of the query drawn at `step`.
  void draw_columns(const state& st, std::span<float> out, std::size_t first_col, std::uint64_t step) const {
    fill_normals(*this->exec_, out, this->query_stream(st, step), first_col * st.cols);
  }

  /// This step's query in st.next, orthogonalised: the previous Q with its all-zero columns drawn
  /// again (warm start: a zero column would otherwise stay zero for good), or a new draw.
  void prepare_query(state& st) const {
    if (this->params_.warm_start)
      warm_query(*this->exec_, std::as_const(st.query).span(), st.next.span(), st.cols, this->query_stream(st, 0));
    else
      draw_columns(st, st.next.span(), 0, st.step);
    orthogonalize(*this->exec_, st.next.span(), st.cols, this->params_.orthogonalization_eps);
  }

  /// M = g + e as the products read it (e empty without a memory).
  [[nodiscard]] static compensated_matrix matrix(const state& st, std::span<const float> grad) noexcept {
    return {grad, std::as_const(st.memory).span(), st.rows, st.cols};
  }
};

static_assert(Compressor<powersgd<>, archetypes::collective>, "powersgd must model Compressor");
static_assert(CheckpointedCompressor<powersgd<>>, "powersgd must model CheckpointedCompressor");
static_assert(SelectiveCompressor<powersgd<>>, "powersgd must model SelectiveCompressor");
static_assert(PhasedCompressor<powersgd<>>, "powersgd must model PhasedCompressor");

template <>
struct method_slot<powersgd_method::codec.id> {
  using type = powersgd_method;
};

}  // namespace bellows

#if defined(__CUDACC__)  // the device compressor, for device code that includes the list
#include "bellows/compressors/powersgd.cuh"
#endif
