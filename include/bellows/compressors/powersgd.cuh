// SPDX-License-Identifier: Apache-2.0
// PowerSGD on the device: powersgd<cuda::executor>, the compressor of compressors/powersgd.hpp
// with its error memory, query and workspaces in device memory, exchanged by the two allreduces
// of a DeviceCollective (collectives::nccl). Statuses, step counters, traffic and the layers'
// ways (compressed or averaged dense) are the CPU's exactly; so are the dense averages, bit for
// bit. The products sum in another order than the CPU's (cuda/skinny_gemm.cuh), so P, Q and what
// is built from them agree with powersgd<cpu::executor> within float rounding, not bit for bit.
//
// One step of a compressed layer, all on the executor's stream (the collective's too):
//   the query: the previous Q copied, any all-zero column drawn again (warm start), or a new
//   draw -> orthogonalise -> P = M Q -> this rank's verdict on P appended as a float ->
//   allreduce of n r' + 1 floats -> the summed P and the summed verdict checked into one device
//   word, copied back: the first wait -> orthogonalise P -> Q = M^T P -> allreduce -> Q / W ->
//   the summed Q checked, the word copied back: the second wait -> g = P Q^T and e = M - g in
//   one pass; enqueued and not waited for. Until the second wait shows every value finite, only
//   workspace was written.
// A layer averaged dense: m = g (+ e) with its check in one pass -> the verdict appended ->
//   allreduce of n + 1 floats -> the verdict copied back: the one wait -> g = sums / W, e = 0.
//
// The query's normals come from cuda::fill_normals (cuda/normals.cuh), the device form of
// cpu::fill_normals. Rank changes (set_rank, or a compressor of another rank) reallocate, as on
// the CPU: not for the steady state.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "bellows/compressors/detail/powersgd_rules.hpp"
#include "bellows/compressors/powersgd.hpp"
#include "bellows/concepts.hpp"
#include "bellows/core/checked.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/philox.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/cuda/buffer.cuh"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/transfer.cuh"
#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/gram_schmidt.cuh"
#include "bellows/cuda/launch.cuh"
#include "bellows/compressors/detail/device_state.cuh"
#include "bellows/cuda/normals.cuh"
#include "bellows/cuda/skinny_gemm.cuh"

namespace bellows::cuda {

namespace detail {

/// Block j copies column j (m floats) of the previous query into the next one and, when all of
/// it is zero, draws it instead: normals j m .. j m + m - 1 of stream s, as the first draw did.
__global__ void warm_query_kernel(const float* query, float* next, std::size_t m, philox::stream s) {
  const std::size_t j = blockIdx.x;
  bool nonzero = false;
  for (std::size_t i = threadIdx.x; i < m; i += blockDim.x) {
    const float v = query[j * m + i];
    next[j * m + i] = v;
    nonzero |= v != 0.0f;
  }
  if (__syncthreads_or(nonzero)) return;
  normals_range(next + j * m, m, s, j * m, threadIdx.x, blockDim.x);
}

/// Sets *flag when the allreduced verdict *vote is not zero (some rank saw a non-finite P).
__global__ void vote_kernel(const float* vote, unsigned* flag) {
  if (*vote != 0.0f) *flag = 1u;
}

}  // namespace detail

}  // namespace bellows::cuda

namespace bellows {

template <>
class powersgd<cuda::executor> : public detail::powersgd_common<powersgd<cuda::executor>, cuda::executor> {
  using base = detail::powersgd_common<powersgd<cuda::executor>, cuda::executor>;
  friend base;

public:
  /// One layer: sizes, rank and step counter (powersgd_layer); in device memory the error memory
  /// e, the query Q, this step's Q, the allreduce buffer and the non-finite word.
  struct state : detail::powersgd_layer {
    cuda::device_buffer<float> memory;    ///< e (n x m), once compressed with feedback on; else empty
    cuda::device_buffer<float> query;     ///< Q, m x (columns held) column-major, kept between steps
    cuda::device_buffer<float> next;      ///< this step's Q, swapped into `query` on commit
    cuda::device_buffer<float> exchange;  ///< P (n x r') and the verdict, or the dense sums and it
    cuda::device_buffer<unsigned> flag;   ///< set on the device when something is not finite
    unsigned verdict = 0;                 ///< the flag, read back
    float votes = 0.0f;                   ///< dense: the verdict summed over ranks, read back
  };

  static constexpr const char* name = "powersgd";

  explicit powersgd(const powersgd_params& params = {}, cuda::executor& exec = cuda::executor::shared())
      : base(params, exec) {}

  /// One step (a collective call; see the file's comment). `inout` is device memory; the
  /// collective enqueues on the executor's stream. Waits for that stream twice for a compressed
  /// layer, once for a dense one. Reallocates first when this compressor's rank gives the layer
  /// another r' than the state's, as the CPU does.
  template <DeviceCollective Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    detail::check_step(name, st.layer, inout.size(), coll.stream(), *exec_);
    follow_rank(st);
    return st.compressed() ? reduce_low_rank(st, inout, coll) : reduce_dense(st, inout, coll);
  }

  /// The CPU compressor's record (r', step, e if any, Q): either backend reads what the other
  /// wrote. Waits for the executor's stream.
  void save(const state& st, checkpoint_writer& out) const {
    const std::vector<float> e = cuda::to_host(*exec_, st.memory), q = cuda::to_host(*exec_, st.query);
    detail::write_powersgd_record(out, st.rank, st.step, e, q, st.cols);
  }

  /// When the trainer's learning rate changes from lr_old to lr_new: a feedback::scaled memory
  /// is multiplied by lr_old / lr_new, as state.memory.rescale(exec, lr_old, lr_new) does on the
  /// CPU (enqueued); other memories are left alone.
  void rescale(state& st, float lr_old, float lr_new) const {
    detail::rescale_memory("powersgd", *exec_, st.memory, params_.feedback, lr_old, lr_new);
  }

  /// Reads what save (or the CPU's save) wrote for the same layer, checking all of it as the
  /// CPU does (raising bellows::wire_error) before the state changes. Waits for the stream.
  void load(state& st, checkpoint_reader& in) const {
    const detail::powersgd_record rec = detail::read_powersgd_record(st.layer, in);
    st.memory = cuda::to_device(*exec_, rec.memory);  // waits for the stream: the buffers replaced are idle
    st.query = cuda::to_device(*exec_, rec.query);
    st.step = rec.step;
    st.rank = 0;
    resize(st, static_cast<std::size_t>(rec.rank));
  }

private:
  /// Sizes a state for effective rank r (0: uncompressed), as the CPU's resize: the memory
  /// (zero) once it is first compressed, Q keeping the first min(held, r) columns it holds and
  /// the others drawn, the workspaces. Waits for the stream before it frees anything.
  void resize(state& st, std::size_t r) const {
    const std::size_t n = st.rows, m = st.cols;
    const cudaStream_t stream = exec_->stream();
    if (st.flag.size() == 0) st.flag = cuda::device_buffer<unsigned>(1);
    st.rank = r;
    if (r == 0) {
      cuda::device_buffer<float> exchange(
          detail::checked_add(st.layer.size(), 1, "powersgd: layer '", st.layer.name, "'"));
      exec_->synchronize();  // work enqueued before may still use the buffer replaced
      st.exchange = std::move(exchange);
      return;
    }
    detail::check_powersgd_sizes(st.layer, r);
    // every column of the query may be drawn again (warm start's redraw), so all must be in the stream
    BELLOWS_EXPECTS(2 * m * r <= philox::stream::max_words, "powersgd: layer '", st.layer.name, "': a query of ", m * r,
                    " floats overruns the random stream");
    if (st.memory.size() == 0) st.memory = detail::zero_memory(params_.feedback, n * m, *exec_);
    const std::size_t held = st.query.size() / m;
    cuda::device_buffer<float> query;
    if (held != r) {
      query = cuda::device_buffer<float>(m * r);
      const std::size_t kept = std::min(held, r);
      if (kept != 0)
        BELLOWS_CUDA_CHECK(
            cudaMemcpyAsync(query.data(), st.query.data(), kept * m * sizeof(float), cudaMemcpyDeviceToDevice, stream));
      if (r > held) draw_columns(st, query.span().subspan(held * m), held, 0);
    }
    cuda::device_buffer<float> next(m * r), exchange(n * r + 1);
    exec_->reserve(cuda::project_cols_workspace_bytes(n, m, r));
    exec_->synchronize();  // work enqueued before (the copy above too) may still use the buffers replaced
    if (held != r) st.query = std::move(query);
    st.next = std::move(next);
    st.exchange = std::move(exchange);
  }

  /// Columns first_col, first_col + 1, ... of the query drawn at `step`.
  void draw_columns(const state& st, std::span<float> out, std::size_t first_col, std::uint64_t step) const {
    cuda::fill_normals(*exec_, out, query_stream(st, step), first_col * st.cols);
  }

  /// This step's query in st.next, orthogonalised: the previous Q with its all-zero columns
  /// drawn again (warm start), or a new draw.
  void prepare_query(state& st) const {
    const std::size_t m = st.cols;
    if (params_.warm_start) {
      cuda::detail::launch(&cuda::detail::warm_query_kernel, static_cast<unsigned>(st.rank),
                           cuda::detail::elementwise_threads, exec_->stream(), st.query.data(), st.next.data(), m,
                           query_stream(st, 0));
    } else {
      draw_columns(st, st.next.span(), 0, st.step);
    }
    cuda::orthogonalize(*exec_, st.next.span(), m, params_.orthogonalization_eps);
  }

  /// Copies the flag word back and waits for the stream: true when something was not finite.
  bool flag_raised(state& st) const {
    BELLOWS_CUDA_CHECK(
        cudaMemcpyAsync(&st.verdict, st.flag.data(), sizeof(unsigned), cudaMemcpyDeviceToHost, exec_->stream()));
    exec_->synchronize();
    return st.verdict != 0;
  }

  template <DeviceCollective Coll>
  reduce_result reduce_low_rank(state& st, std::span<float> inout, Coll& coll) {
    const std::size_t n = st.rows, m = st.cols, r = st.rank;
    const cudaStream_t stream = exec_->stream();
    const std::span<float> e = st.memory.span();
    const compensated_matrix M{inout, e, n, m};
    const std::span<float> p = st.exchange.span().first(n * r);
    float* vote = st.exchange.data() + n * r;

    prepare_query(st);
    cuda::project_rows(*exec_, M, st.next.span(), p);
    BELLOWS_CUDA_CHECK(cudaMemsetAsync(st.flag.data(), 0, sizeof(unsigned), stream));
    cuda::flag_non_finite(*exec_, p, st.flag.data());
    cuda::flag_to_float(*exec_, st.flag.data(), vote);
    coll.allreduce_sum(st.exchange.span());
    // One word for the summed verdict and the summed P (finite terms may overflow): a rank that
    // raised the word locally voted, so it is raised again here anyway.
    cuda::flag_non_finite(*exec_, p, st.flag.data());
    cuda::detail::launch(&cuda::detail::vote_kernel, 1u, 1u, stream, vote, st.flag.data());
    traffic sent{(n * r + 1) * sizeof(float), n * r + 1, (n + m) * r};
    if (flag_raised(st)) return {step_status::non_finite, sent};

    cuda::orthogonalize(*exec_, p, n, params_.orthogonalization_eps);
    cuda::project_cols(*exec_, M, p, st.next.span());
    coll.allreduce_sum(st.next.span());
    if (coll.size() != 1) cuda::divide(*exec_, st.next.span(), static_cast<float>(coll.size()));
    sent += traffic{m * r * sizeof(float), m * r, 0};
    // M^T P may overflow where M is finite; every rank holds the same summed Q, so all skip the
    // step here alike. The word is still clear: it was read back clear.
    cuda::flag_non_finite(*exec_, st.next.span(), st.flag.data());
    if (flag_raised(st)) return {step_status::non_finite, sent};

    cuda::reconstruct_update(*exec_, inout, e, n, m, p, st.next.span());
    commit(st);
    return {step_status::ok, sent};
  }

  template <DeviceCollective Coll>
  reduce_result reduce_dense(state& st, std::span<float> inout, Coll& coll) {
    const std::size_t n = inout.size();
    const cudaStream_t stream = exec_->stream();
    const std::span<float> values = st.exchange.span().first(n);
    const std::span<float> e = st.memory.span();
    BELLOWS_CUDA_CHECK(cudaMemsetAsync(st.flag.data(), 0, sizeof(unsigned), stream));
    if (e.empty()) {
      if (n != 0)
        BELLOWS_CUDA_CHECK(
            cudaMemcpyAsync(values.data(), inout.data(), n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
      cuda::flag_non_finite(*exec_, values, st.flag.data());
    } else {
      // a memory left from compressed steps goes out with g
      cuda::compensate(*exec_, values, inout, e, st.flag.data());
    }
    cuda::flag_to_float(*exec_, st.flag.data(), st.exchange.data() + n);
    coll.allreduce_sum(st.exchange.span());
    BELLOWS_CUDA_CHECK(
        cudaMemcpyAsync(&st.votes, st.exchange.data() + n, sizeof(float), cudaMemcpyDeviceToHost, stream));
    exec_->synchronize();
    const traffic sent{(n + 1) * sizeof(float), n + 1, n};
    if (st.votes != 0.0f) return {step_status::non_finite, sent};
    cuda::divide(*exec_, inout, values, static_cast<float>(coll.size()));
    if (!e.empty()) cuda::fill(*exec_, e, 0.0f);
    ++st.step;
    return {step_status::ok, sent};
  }
};

static_assert(Compressor<powersgd<cuda::executor>, archetypes::device_collective>,
              "powersgd<cuda::executor> must model Compressor over a DeviceCollective");

}  // namespace bellows
