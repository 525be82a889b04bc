// SPDX-License-Identifier: Apache-2.0
// What PowerSGD is on every backend: its checked parameters, the effective rank of a layer, the
// sizes a rank must keep within, the checkpoint record with its complete validation, and the
// kernels it asks of an executor (LowRankExecutor). compressors/powersgd.hpp builds the one
// compressor on it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "bellows/compressors/powersgd_types.hpp"
#include "bellows/concepts.hpp"
#include "bellows/core/checked.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/philox.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/plan/low_rank.hpp"

namespace bellows::detail {

/// r' for a layer at rank r, or 0 when the layer is not worth compressing at that rank:
/// (n + m) r' min_compression_rate >= n m, or a layer of fewer than two dimensions.
[[nodiscard]] inline std::size_t powersgd_effective_rank(const powersgd_params& params, const layer_info& layer,
                                                         std::size_t rank) noexcept {
  if (layer.shape.rank() < 2 || rank == 0) return 0;
  const std::size_t n = layer.shape.rows(), m = layer.shape.cols();
  const std::size_t r = std::min({rank, n, m});
  const double compressed = static_cast<double>(n + m) * static_cast<double>(r) * params.min_compression_rate;
  return compressed < static_cast<double>(n) * static_cast<double>(m) ? r : 0;
}

/// Raises bellows::error when (n + m) r' + 1, the traffic of a step, does not fit std::size_t
/// (r' <= min(n, m) keeps n r' and m r' within n m, the layer's checked size, but not that).
inline void check_powersgd_sizes(const layer_info& layer, std::size_t r) {
  const std::size_t n = layer.shape.rows(), m = layer.shape.cols();
  (void)checked_add(checked_mul(checked_add(n, m, "powersgd: layer '", layer.name, "'"), r, "powersgd: layer '",
                                layer.name, "' at rank ", r),
                    1, "powersgd: layer '", layer.name, "'");
}

/// What a layer carries from step to step, as a checkpoint holds it: r', the step counter, e
/// (empty without a memory) and the columns of Q held (m x columns, column-major).
struct powersgd_record {
  std::uint64_t rank = 0;
  std::uint64_t step = 0;
  std::vector<float> memory;
  std::vector<float> query;
};

inline void write_powersgd_record(checkpoint_writer& out, std::uint64_t rank, std::uint64_t step,
                                  std::span<const float> memory, std::span<const float> query, std::size_t cols) {
  out.put<std::uint64_t>(rank);
  out.put(step);
  out.put<std::uint8_t>(memory.empty() ? 0 : 1);
  out.put_array(memory);
  out.put<std::uint64_t>(cols == 0 ? 0 : query.size() / cols);
  out.put_array(query);
}

/// Reads a record written for `layer` and checks all of it (ranks within the layer's, array
/// sizes, finite values), raising bellows::wire_error naming the layer and the field.
[[nodiscard]] inline powersgd_record read_powersgd_record(const layer_info& layer, checkpoint_reader& in) {
  powersgd_record rec;
  rec.rank = in.get<std::uint64_t>("powersgd rank");
  rec.step = in.get<std::uint64_t>("powersgd step");
  const auto has_memory = in.get<std::uint8_t>("powersgd memory flag");
  const std::size_t cols = layer.shape.rank() < 2 ? 0 : layer.shape.cols();
  const std::size_t most = layer.shape.rank() < 2 ? 0 : std::min(layer.shape.rows(), cols);
  if (rec.rank > most || has_memory > 1)
    fail<wire_error>("powersgd: layer '", layer.name, "' of shape ", layer.shape.to_string(), ": checkpoint rank ",
                     rec.rank, " (at most ", most, "), memory flag ", unsigned{has_memory});
  rec.memory.resize(has_memory != 0 ? layer.size() : 0);
  in.get_finite_array(std::span<float>(rec.memory), "powersgd error memory");
  const auto columns = in.get<std::uint64_t>("powersgd query columns");
  if (columns > most || columns < rec.rank)
    fail<wire_error>("powersgd: layer '", layer.name, "': checkpoint query of ", columns, " columns for rank ",
                     rec.rank);
  rec.query.resize(static_cast<std::size_t>(columns) * cols);
  in.get_finite_array(std::span<float>(rec.query), "powersgd query");
  return rec;
}

/// LowRankExecutor: what PowerSGD asks of an executor beyond Executor (concepts.hpp), found by
/// argument-dependent lookup beside E, on spans of the backend's memory:
///  1. `fill_normals(e, out, stream, first)`: out[t] = normal number first + t of the Philox stream.
///  2. `warm_query(e, query, next, m, stream)`: next = query column by column (m floats each),
///     an all-zero column drawn instead as normals j m .. j m + m - 1 of the stream.
///  3. `orthogonalize(e, x, m, eps)`: Gram-Schmidt on the columns (m floats each) of x.
///  4. `project_rows(e, M, q, p)` (p = M q), `project_cols(e, M, p, q)` (q = M^T p) and
///     `reconstruct_update(e, g, mem, n, m, p, q, skip)` (g = p q^T, mem = M - g when mem is not
///     empty; nothing when *skip, a float of the backend's memory, is not 0).
///  5. `compensate(e, out, g, mem, flag)`: out = g + mem, *flag = 1 when out holds NaN or Inf.
///  6. `reserve_projections(e, n, m, r)`: makes room for the products' scratch (at registration).
/// Models: cpu::executor (cpu/skinny_gemm.hpp, cpu/normals.hpp, ...), cuda::executor.
template <class E>
concept LowRankExecutor = requires(E& e, std::span<float> x, std::span<const float> y, const compensated_matrix& M,
                                   const philox::stream& s, std::uint64_t first, std::size_t k, float eps,
                                   float* flag) {
  fill_normals(e, x, s, first);
  warm_query(e, y, x, k, s);
  orthogonalize(e, x, k, eps);
  project_rows(e, M, y, x);
  project_cols(e, M, y, x);
  reconstruct_update(e, x, x, k, k, y, y, flag);
  compensate(e, x, y, y, flag);
  reserve_projections(e, k, k, k);
};

/// The part of a PowerSGD layer's state that every backend keeps alike.
struct powersgd_layer {
  layer_info layer;
  std::uint64_t step = 0;
  std::size_t rows = 0;  ///< n
  std::size_t cols = 0;  ///< m
  std::size_t rank = 0;  ///< r' of a compressed layer; 0 for a layer left uncompressed

  [[nodiscard]] bool compressed() const noexcept { return rank != 0; }
};

/// What the CPU and device compressors (powersgd<Exec>) share beyond the step itself: the checked
/// parameters, the effective rank, the way a layer is exchanged, rank changes and the query's
/// stream. Derived (CRTP) provides resize(state&, r') for its buffers.
template <class Derived, class Exec>
class powersgd_common {
public:
  powersgd_common(const powersgd_params& params, Exec& exec) : params_(params), exec_(&exec) { params.validate(); }

  [[nodiscard]] const powersgd_params& params() const noexcept { return params_; }

  /// r' for a layer at rank r, or 0 when the layer is not worth compressing at that rank.
  [[nodiscard]] std::size_t effective_rank(const layer_info& layer, std::size_t rank) const noexcept {
    return powersgd_effective_rank(params_, layer, rank);
  }

  /// The rounds of this compressor's next step of a layer: at its r' (this compressor's rank,
  /// which the step adopts), one allreduce of P and the verdict (n r' + 1 floats) and one of Q
  /// (m r'); at r' = 0, one allreduce of the n values and the verdict.
  [[nodiscard]] exchange_rounds rounds(const powersgd_layer& st, std::size_t /*ranks*/) const {
    const std::size_t r = effective_rank(st.layer, params_.rank);
    if (r == 0) return {{collective_op::allreduce_sum, (st.layer.size() + 1) * sizeof(float)}};
    return {{collective_op::allreduce_sum, (st.rows * r + 1) * sizeof(float)},
            {collective_op::allreduce_sum, st.cols * r * sizeof(float)}};
  }

  /// Whether this layer is compressed at the state's current rank.
  [[nodiscard]] bool compresses(const powersgd_layer& st) const noexcept { return st.compressed(); }

  /// Sets a layer's rank (reduce does this itself when the compressor's rank differs from the
  /// state's, as when Accordion switches a layer between two instances): keeps e and the first
  /// min(r'_old, r'_new) columns of Q, and draws the others as the first draw would have. A
  /// layer that the new rank leaves uncompressed keeps Q for later and sends its memory with its
  /// next gradient. Allocates (on the device, waits for the stream); not for the steady state.
  template <class State>
  void set_rank(State& st, std::size_t rank) const {
    BELLOWS_EXPECTS(rank >= 1, "powersgd: layer '", st.layer.name, "': rank must be >= 1, got ", rank);
    derived().resize(st, effective_rank(st.layer, rank));
  }

  /// A layer's state, sized for the compressor's rank.
  [[nodiscard]] auto make_state(const layer_info& layer) const {
    typename Derived::state st;
    st.layer = layer;
    st.rows = layer.shape.rows();
    st.cols = layer.shape.cols();
    derived().resize(st, effective_rank(layer, params_.rank));
    return st;
  }

protected:
  /// Resizes the state when this compressor's rank gives the layer another r' than the state's.
  template <class State>
  void follow_rank(State& st) const {
    if (const std::size_t r = effective_rank(st.layer, params_.rank); r != st.rank) derived().resize(st, r);
  }

  /// After a step every rank found finite: this step's query becomes the one kept.
  template <class State>
  static void commit(State& st) noexcept {
    std::swap(st.query, st.next);
    ++st.step;
  }

  /// The stream of the query drawn at `step`: element i of column j is its normal number j m + i.
  [[nodiscard]] philox::stream query_stream(const powersgd_layer& st, std::uint64_t step) const noexcept {
    return st.layer.stream(params_.seed, step, philox::stream::shared);
  }

  powersgd_params params_;
  Exec* exec_;

private:
  [[nodiscard]] const Derived& derived() const noexcept { return static_cast<const Derived&>(*this); }
};

}  // namespace bellows::detail
