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
// The query's normals come from cuda::fill_normals below, the device form of cpu::fill_normals:
// the same Philox words and the same double-precision Box-Muller, so the two agree but where the
// device's libm rounds log, sin or cos differently in the last bit of a double (then one float
// apart at most). Rank changes (set_rank, or a compressor of another rank) reallocate, as on
// the CPU: not for the steady state.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <utility>
#include <vector>

// First: cuda/skinny_gemm.cuh brings cpu/skinny_gemm.hpp (which compressors/powersgd.hpp
// includes too) with nvcc's note on its GCC loop hints silenced.
#include "bellows/cuda/skinny_gemm.cuh"
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
#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/gram_schmidt.cuh"
#include "bellows/cuda/launch.cuh"

namespace bellows::cuda {

namespace detail {

/// Normal numbers first .. first + count - 1 of stream s into out, as cpu::fill_normals numbers
/// them (number i is the first (i even) or second (i odd) of the pair from words 2 (i / 2) and
/// 2 (i / 2) + 1); thread `thread` of `threads` takes every threads-th pair.
__device__ inline void normals_range(float* out, std::size_t count, const philox::stream& s, std::uint64_t first,
                                     std::uint64_t thread, std::uint64_t threads) {
  const std::uint64_t end = first + count;
  for (std::uint64_t pair = first / 2 + thread; 2 * pair < end; pair += threads) {
    const std::uint64_t i = 2 * pair;
    const philox::normal_pair z = philox::to_normals(s.word(i), s.word(i + 1));
    if (i >= first) out[i - first] = z.first;
    if (i + 1 < end) out[i + 1 - first] = z.second;
  }
}

__global__ void normals_kernel(float* out, std::size_t count, philox::stream s, std::uint64_t first) {
  normals_range(out, count, s, first, blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x,
                std::uint64_t{gridDim.x} * blockDim.x);
}

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

/// cpu::fill_normals on the device: out[t] = normal number first + t of stream s (see the
/// file's comment for how closely the two agree). One launch on the executor's stream.
inline void fill_normals(executor& exec, std::span<float> out, const philox::stream& s, std::uint64_t first) {
  BELLOWS_EXPECTS(2 * (first + out.size()) <= philox::stream::max_words, "cuda::fill_normals: normals ", first,
                  " .. ", first + out.size(), " overrun the stream");
  if (out.empty()) return;
  detail::launch(&detail::normals_kernel, detail::stride_blocks(out.size() / 2 + 1), detail::elementwise_threads,
                 exec.stream(), out.data(), out.size(), s, first);
}

}  // namespace bellows::cuda

namespace bellows {

template <>
class powersgd<cuda::executor> {
public:
  /// One layer: its sizes, rank and step counter; in device memory the error memory e, the
  /// query Q, this step's Q, the allreduce buffer and the non-finite word.
  struct state {
    layer_info layer;
    std::uint64_t step = 0;
    std::size_t rows = 0;                 ///< n
    std::size_t cols = 0;                 ///< m
    std::size_t rank = 0;                 ///< r' of a compressed layer; 0 for a layer left uncompressed
    cuda::device_buffer<float> memory;    ///< e (n x m), once compressed with feedback on; else empty
    cuda::device_buffer<float> query;     ///< Q, m x (columns held) column-major, kept between steps
    cuda::device_buffer<float> next;      ///< this step's Q, swapped into `query` on commit
    cuda::device_buffer<float> exchange;  ///< P (n x r') and the verdict, or the dense sums and it
    cuda::device_buffer<unsigned> flag;   ///< set on the device when something is not finite
    unsigned verdict = 0;                 ///< the flag, read back
    float votes = 0.0f;                   ///< dense: the verdict summed over ranks, read back

    [[nodiscard]] bool compressed() const noexcept { return rank != 0; }
  };

  static constexpr const char* name = "powersgd";

  explicit powersgd(const powersgd_params& params = {}, cuda::executor& exec = cuda::executor::shared())
      : params_(params), exec_(&exec) {
    BELLOWS_EXPECTS(params.rank >= 1, "powersgd: rank must be >= 1, got ", params.rank);
    BELLOWS_EXPECTS(params.min_compression_rate > 0.0f &&
                        params.min_compression_rate <= std::numeric_limits<float>::max(),
                    "powersgd: min_compression_rate must be a finite number > 0, got ",
                    params.min_compression_rate);
    BELLOWS_EXPECTS(params.orthogonalization_eps >= 0.0f &&
                        params.orthogonalization_eps <= std::numeric_limits<float>::max(),
                    "powersgd: orthogonalization_eps must be a finite number >= 0, got ",
                    params.orthogonalization_eps);
  }

  [[nodiscard]] const powersgd_params& params() const noexcept { return params_; }

  /// r' for a layer at rank r, or 0 when the layer is not worth compressing (as on the CPU).
  [[nodiscard]] std::size_t effective_rank(const layer_info& layer, std::size_t rank) const noexcept {
    if (layer.shape.rank() < 2 || rank == 0) return 0;
    const std::size_t n = layer.shape.rows(), m = layer.shape.cols();
    const std::size_t r = std::min({rank, n, m});
    const double compressed = static_cast<double>(n + m) * static_cast<double>(r) * params_.min_compression_rate;
    return compressed < static_cast<double>(n) * static_cast<double>(m) ? r : 0;
  }

  /// Sizes the state in device memory (the query drawn on the device) and reserves the
  /// executor's workspace for project_cols.
  [[nodiscard]] state make_state(const layer_info& layer) const {
    state st;
    st.layer = layer;
    st.rows = layer.shape.rows();
    st.cols = layer.shape.cols();
    st.flag = cuda::device_buffer<unsigned>(1);
    resize(st, effective_rank(layer, params_.rank));
    return st;
  }

  [[nodiscard]] bellows::aggregation aggregation() const noexcept {
    return bellows::aggregation::allreduce_two_round;
  }
  /// How this layer is exchanged: two allreduces when compressed, else one.
  [[nodiscard]] bellows::aggregation aggregation(const state& st) const noexcept {
    return st.compressed() ? bellows::aggregation::allreduce_two_round : bellows::aggregation::allreduce;
  }

  /// One step (a collective call; see the file's comment). `inout` is device memory; the
  /// collective enqueues on the executor's stream. Waits for that stream twice for a compressed
  /// layer, once for a dense one. Reallocates first when this compressor's rank gives the layer
  /// another r' than the state's, as the CPU does.
  template <DeviceCollective Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    BELLOWS_EXPECTS(inout.size() == st.layer.size(), name, ": layer '", st.layer.name, "' of shape ",
                    st.layer.shape.to_string(), " has ", st.layer.size(), " elements, the buffer ", inout.size());
    BELLOWS_EXPECTS(coll.stream() == exec_->stream(), name, ": layer '", st.layer.name,
                    "': the collective and the executor enqueue on different streams; give both the same one");
    if (const std::size_t r = effective_rank(st.layer, params_.rank); r != st.rank) resize(st, r);
    return st.compressed() ? reduce_low_rank(st, inout, coll) : reduce_dense(st, inout, coll);
  }

  [[nodiscard]] bool compresses(const state& st) const noexcept { return st.compressed(); }

  /// Sets a layer's rank as the CPU's set_rank does: keeps e and the first min(r'_old, r'_new)
  /// columns of Q, draws the others as the first draw would have. Allocates and waits for the
  /// stream; not for the steady state.
  void set_rank(state& st, std::size_t rank) const {
    BELLOWS_EXPECTS(rank >= 1, "powersgd: layer '", st.layer.name, "': rank must be >= 1, got ", rank);
    resize(st, effective_rank(st.layer, rank));
  }

  /// The CPU compressor's record (r', step, e if any, Q): either backend reads what the other
  /// wrote. Waits for the executor's stream.
  void save(const state& st, checkpoint_writer& out) const {
    const std::vector<float> e = to_host(st.memory), q = to_host(st.query);
    out.put<std::uint64_t>(st.rank);
    out.put(st.step);
    out.put<std::uint8_t>(e.empty() ? 0 : 1);
    out.put_array(std::span<const float>(e));
    out.put<std::uint64_t>(st.cols == 0 ? 0 : q.size() / st.cols);
    out.put_array(std::span<const float>(q));
  }

  /// Reads what save (or the CPU's save) wrote for the same layer, checking all of it as the
  /// CPU does (raising bellows::wire_error) before the state changes. Waits for the stream.
  void load(state& st, checkpoint_reader& in) const {
    const auto rank = in.get<std::uint64_t>("powersgd rank");
    const auto step = in.get<std::uint64_t>("powersgd step");
    const auto has_memory = in.get<std::uint8_t>("powersgd memory flag");
    const std::size_t most = st.layer.shape.rank() < 2 ? 0 : std::min(st.rows, st.cols);
    if (rank > most || has_memory > 1)
      detail::fail<wire_error>("powersgd: layer '", st.layer.name, "' of shape ", st.layer.shape.to_string(),
                               ": checkpoint rank ", rank, " (at most ", most, "), memory flag ",
                               unsigned{has_memory});
    std::vector<float> e(has_memory != 0 ? st.layer.size() : 0);
    in.get_finite_array(std::span<float>(e), "powersgd error memory");
    const auto columns = in.get<std::uint64_t>("powersgd query columns");
    if (columns > most || columns < rank)
      detail::fail<wire_error>("powersgd: layer '", st.layer.name, "': checkpoint query of ", columns,
                               " columns for rank ", rank);
    std::vector<float> q(static_cast<std::size_t>(columns) * st.cols);
    in.get_finite_array(std::span<float>(q), "powersgd query");

    st.memory = to_device(e);  // to_device waits for the stream: the buffers replaced are idle
    st.query = to_device(q);
    st.step = step;
    st.rank = 0;
    resize(st, static_cast<std::size_t>(rank));
  }

private:
  /// Sizes a state for effective rank r (0: uncompressed), as the CPU's resize: the memory
  /// (zero) once it is first compressed, Q keeping the first min(held, r) columns it holds and
  /// the others drawn, the workspaces. Waits for the stream before it frees anything.
  void resize(state& st, std::size_t r) const {
    const std::size_t n = st.rows, m = st.cols;
    const cudaStream_t stream = exec_->stream();
    st.rank = r;
    if (r == 0) {
      cuda::device_buffer<float> exchange(
          detail::checked_add(st.layer.size(), 1, "powersgd: layer '", st.layer.name, "'"));
      exec_->synchronize();  // work enqueued before may still use the buffer replaced
      st.exchange = std::move(exchange);
      return;
    }
    // as on the CPU: r' <= min(n, m) keeps n r' and m r' within n m, but not (n + m) r' + 1
    (void)detail::checked_add(detail::checked_mul(detail::checked_add(n, m, "powersgd: layer '", st.layer.name, "'"), r,
                                                  "powersgd: layer '", st.layer.name, "' at rank ", r),
                              1, "powersgd: layer '", st.layer.name, "'");
    // every column of the query may be drawn again (warm start's redraw), so all must be in the stream
    BELLOWS_EXPECTS(2 * m * r <= philox::stream::max_words, "powersgd: layer '", st.layer.name, "': a query of ",
                    m * r, " floats overruns the random stream");
    if (st.memory.size() == 0 && params_.feedback != feedback::none) {
      st.memory = cuda::device_buffer<float>(n * m);
      BELLOWS_CUDA_CHECK(cudaMemsetAsync(st.memory.data(), 0, n * m * sizeof(float), stream));
    }
    const std::size_t held = st.query.size() / m;
    cuda::device_buffer<float> query;
    if (held != r) {
      query = cuda::device_buffer<float>(m * r);
      const std::size_t kept = std::min(held, r);
      if (kept != 0)
        BELLOWS_CUDA_CHECK(cudaMemcpyAsync(query.data(), st.query.data(), kept * m * sizeof(float),
                                           cudaMemcpyDeviceToDevice, stream));
      if (r > held) draw_columns(st, query.span().subspan(held * m), held, 0);
    }
    cuda::device_buffer<float> next(m * r), exchange(n * r + 1);
    exec_->reserve(cuda::project_cols_workspace_bytes(n, m, r));
    exec_->synchronize();  // work enqueued before (the copy above too) may still use the buffers replaced
    if (held != r) st.query = std::move(query);
    st.next = std::move(next);
    st.exchange = std::move(exchange);
  }

  /// The stream of the query drawn at `step`: element i of column j is its normal number j m + i.
  [[nodiscard]] philox::stream query_stream(const state& st, std::uint64_t step) const noexcept {
    return {params_.seed, static_cast<std::uint32_t>(step), st.layer.id, philox::stream::shared};
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
    const cpu::compensated_matrix M{inout, e, n, m};
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
    std::swap(st.query, st.next);
    ++st.step;
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
      cuda::compensate(*exec_, values, inout, e, st.flag.data());  // a memory left from compressed steps goes out with g
    }
    cuda::flag_to_float(*exec_, st.flag.data(), st.exchange.data() + n);
    coll.allreduce_sum(st.exchange.span());
    BELLOWS_CUDA_CHECK(
        cudaMemcpyAsync(&st.votes, st.exchange.data() + n, sizeof(float), cudaMemcpyDeviceToHost, stream));
    exec_->synchronize();
    const traffic sent{(n + 1) * sizeof(float), n + 1, n};
    if (st.votes != 0.0f) return {step_status::non_finite, sent};
    cuda::divide_into(*exec_, inout, values, static_cast<float>(coll.size()));
    if (!e.empty()) cuda::fill(*exec_, e, 0.0f);
    ++st.step;
    return {step_status::ok, sent};
  }

  /// A device array copied back, after the work enqueued before.
  [[nodiscard]] std::vector<float> to_host(const cuda::device_buffer<float>& d) const {
    std::vector<float> h(d.size());
    if (!h.empty())
      BELLOWS_CUDA_CHECK(
          cudaMemcpyAsync(h.data(), d.data(), h.size() * sizeof(float), cudaMemcpyDeviceToHost, exec_->stream()));
    exec_->synchronize();
    return h;
  }

  /// A device copy of h, complete on return.
  [[nodiscard]] cuda::device_buffer<float> to_device(const std::vector<float>& h) const {
    cuda::device_buffer<float> d(h.size());
    if (!h.empty())
      BELLOWS_CUDA_CHECK(
          cudaMemcpyAsync(d.data(), h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice, exec_->stream()));
    exec_->synchronize();
    return d;
  }

  powersgd_params params_;
  cuda::executor* exec_;
};

static_assert(Compressor<powersgd<cuda::executor>, archetypes::device_collective>,
              "powersgd<cuda::executor> must model Compressor over a DeviceCollective");

}  // namespace bellows
