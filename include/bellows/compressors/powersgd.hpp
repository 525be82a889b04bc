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
// local P finite? a NaN or Inf anywhere in row i of M makes row i of P non-finite), so the ranks
// agree in their first exchange. The summed verdict and the summed P go into one flag in the
// backend's memory, read on the host: the step's first wait (the second reads the summed Q's
// flag, which catches M^T P overflowing where M is finite). Until both show every rank finite,
// the step writes only workspace; then every rank commits. Finite values overflow nowhere while
// |M| <= FLT_MAX / (1 + sqrt(n)) (|Q|, |out| <= sqrt(n) max |M|); beyond that, a summed Q that
// overflowed skips the step the same way on every rank, but out = P Q^T or e = M - out may
// still overflow. A layer averaged dense: m = g (+ e) and its verdict in one pass, the verdict
// appended, one allreduce of n + 1 floats, the summed verdict read (one wait), g = sums / W, e = 0.
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
    array memory;                ///< e (n x m, row-major) once compressed with feedback on; else empty
    array query;                 ///< Q, m x (columns held) column-major, kept between steps
    array next;                  ///< workspace: this step's Q, swapped into `query` on commit
    array exchange;              ///< workspace: P (n x r') and the verdict, or the dense sums and it
    array flag;                  ///< workspace: one float, set when something is not finite
    std::vector<float> staging;  ///< the flag read back, where the backend's memory is not the host's
  };

  static constexpr const char* name = "powersgd";

  explicit powersgd(const powersgd_params& params = {}, Exec& exec = Exec::shared()) : base(params, exec) {}

  /// One step (a collective call; see the file's comment). Waits for the executor twice for a
  /// compressed layer (the verdicts), once for a dense one. Reallocates first when this
  /// compressor's rank gives the layer another r' than the state's.
  template <CollectiveFor<Exec> Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    detail::check_buffer(name, st.layer, inout.size());
    detail::check_stream(name, st.layer, coll, *this->exec_);
    this->follow_rank(st);
    return st.compressed() ? reduce_low_rank(st, inout, coll) : reduce_dense(st, inout, coll);
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
    if (st.flag.size() == 0) st.flag = array(exec, 1);
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

  /// The flag read on the host (a wait for the executor): true when something was not finite.
  bool flag_raised(state& st) const { return st.flag.host(*this->exec_, st.staging)[0] != 0.0f; }

  template <class Coll>
  reduce_result reduce_low_rank(state& st, std::span<float> inout, Coll& coll) {
    Exec& exec = *this->exec_;
    const std::size_t n = st.rows, m = st.cols, r = st.rank;
    const compensated_matrix M{inout, st.memory.span(), n, m};
    const std::span<float> p = st.exchange.span().first(n * r);
    const std::span<float> vote = st.exchange.span().subspan(n * r, 1);

    prepare_query(st);
    project_rows(exec, M, std::as_const(st.next).span(), p);
    fill(exec, vote, 0.0f);  // this rank's verdict, in the float the allreduce sums
    flag_non_finite(exec, p, vote.data());
    coll.allreduce_sum(st.exchange.span());
    // One flag for the summed verdict and the summed P (finite terms may overflow).
    copy(exec, st.flag.span(), vote);
    flag_non_finite(exec, p, st.flag.span().data());
    traffic sent{(n * r + 1) * sizeof(float), n * r + 1, (n + m) * r};
    if (flag_raised(st)) return {step_status::non_finite, sent};

    orthogonalize(exec, p, n, this->params_.orthogonalization_eps);
    project_cols(exec, M, p, st.next.span());
    coll.allreduce_sum(st.next.span());
    if (coll.size() != 1) divide(exec, st.next.span(), static_cast<float>(coll.size()));
    sent += traffic{m * r * sizeof(float), m * r, 0};
    // M^T P may overflow where M is finite: every rank holds the same summed Q, so all skip the
    // step here alike, before anything but workspace was written. The flag is still clear: it
    // was read back clear.
    flag_non_finite(exec, std::as_const(st.next).span(), st.flag.span().data());
    if (flag_raised(st)) return {step_status::non_finite, sent};

    reconstruct_update(exec, inout, st.memory.span(), n, m, p, std::as_const(st.next).span());
    this->commit(st);
    return {step_status::ok, sent};
  }

  template <class Coll>
  reduce_result reduce_dense(state& st, std::span<float> inout, Coll& coll) {
    Exec& exec = *this->exec_;
    const std::size_t n = inout.size();
    const std::span<float> values = st.exchange.span().first(n);
    const std::span<float> vote = st.exchange.span().subspan(n, 1);
    const std::span<float> e = st.memory.span();
    fill(exec, vote, 0.0f);
    if (e.empty()) {
      copy(exec, values, inout);
      flag_non_finite(exec, values, vote.data());
    } else {
      compensate(exec, values, inout, e, vote.data());  // a memory left from compressed steps goes out with g
    }
    coll.allreduce_sum(st.exchange.span());
    copy(exec, st.flag.span(), vote);
    const traffic sent{(n + 1) * sizeof(float), n + 1, n};
    if (flag_raised(st)) return {step_status::non_finite, sent};
    divide(exec, inout, values, static_cast<float>(coll.size()));
    if (!e.empty()) fill(exec, e, 0.0f);
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
