// SPDX-License-Identifier: Apache-2.0
// Products of a tall n x m matrix with skinny factors, as PowerSGD needs them: P = M Q, Q = M^T P
// and the reconstruction P Q^T fused with the error update. M is never stored: it is the sum
// g + e of the gradient and the error memory (or g alone when there is no memory), formed on the
// fly, so each kernel reads g and e once and writes nothing but its result.
//
// Layouts: g and e are row-major n x m (row i holds elements i*m .. i*m+m-1, the matrix view of
// shape.hpp); the factors are column-major, P as r columns of n floats (p[k*n + i]) and Q as r
// columns of m floats (q[k*m + j]).
//
// Determinism: every output element is computed by one task with an order of operations fixed by
// the shape alone (row chunks for P and the reconstruction, column panels for Q; lanes of
// `lane_width` consecutive columns summed in a fixed tree), so results are bit-identical for any
// thread count and any instruction set the compiler picks. The kernels run in their AVX2 build
// where the processor has it (cpu/isa.hpp), which gives the same bits.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "bellows/core/error.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/cpu/isa.hpp"
#include "bellows/plan/low_rank.hpp"

#if defined(__GNUC__)
#define BELLOWS_PREFETCH(address) __builtin_prefetch(address)
#else
#define BELLOWS_PREFETCH(address) ((void)(address))
#endif

namespace bellows::cpu {

/// Consecutive columns one step of a skinny kernel handles as independent lanes (a multiple of
/// every vector width up to 256 bits, so the compiler can map the lanes onto registers).
inline constexpr std::size_t lane_width = 8;

namespace detail {

/// How far ahead (in floats) the row kernels ask for the lines of g and e they will read: the
/// hardware prefetcher alone falls behind while the core is busy with the products.
inline constexpr std::size_t prefetch_distance = 512;

/// Ranks handled together by the row kernels: the accumulators of one row and four columns of
/// a factor fit in the sixteen vector registers of the baseline x86-64 target.
inline constexpr std::size_t rank_block = 4;

/// Rows per task of the row kernels: about elementwise_chunk elements, at least one row.
[[nodiscard]] inline std::size_t rows_per_task(std::size_t cols) noexcept {
  return std::max<std::size_t>(1, elementwise_chunk / std::max<std::size_t>(cols, 1));
}

/// Columns per task of M^T P: row segments long enough to stream well (up to 16 KiB), while
/// the r accumulator columns of a panel (64 KiB) stay in the L2 cache.
[[nodiscard]] inline std::size_t panel_width(std::size_t rank) noexcept {
  const std::size_t w = std::clamp<std::size_t>(16384 / std::max<std::size_t>(rank, 1), 64, 4096);
  return w / lane_width * lane_width;
}

/// p + offset floats, as an integer computation (for prefetch addresses only).
[[nodiscard]] inline const float* shifted(const float* p, std::size_t offset) noexcept {
  return reinterpret_cast<const float*>(reinterpret_cast<std::uintptr_t>(p) + offset * sizeof(float));
}

/// Asks for the lines `prefetch_distance` floats past g and e. The address is computed as an
/// integer: it may lie past the end of the matrix, where a prefetch is harmless.
template <bool Memory>
inline void prefetch_lanes(const float* g, const float* e) noexcept {
  BELLOWS_PREFETCH(shifted(g, prefetch_distance));
  if constexpr (Memory) BELLOWS_PREFETCH(shifted(e, prefetch_distance));
}

/// x[l] = g[l] + e[l] for one lane block (or g[l] alone).
template <bool Memory>
inline void load_lanes(const float* g, const float* e, float* x) noexcept {
  for (std::size_t l = 0; l < lane_width; ++l) x[l] = Memory ? g[l] + e[l] : g[l];
}

template <bool Memory>
[[nodiscard]] inline float load_one(const float* g, const float* e, std::size_t j) noexcept {
  return Memory ? g[j] + e[j] : g[j];
}

/// out[k] = sum_j (g[j] + e[j]) * q[k*ldq + j] for K columns of Q and one row of length m.
template <std::size_t K, bool Memory>
void dot_row(const float* g, const float* e, const float* q, std::size_t ldq, std::size_t m, float* out,
             std::size_t out_stride) noexcept {
  float acc[K][lane_width] = {};
  const std::size_t body = m / lane_width * lane_width;
  for (std::size_t j = 0; j < body; j += lane_width) {
    float x[lane_width];
    prefetch_lanes<Memory>(g + j, e + j);
    load_lanes<Memory>(g + j, e + j, x);
#if !defined(__CUDACC__)  // nvcc's front end rejects GCC's pragmas (a .cu file may include this)
    _Pragma("GCC unroll 8")
#endif
        for (std::size_t k = 0; k < K; ++k) for (std::size_t l = 0; l < lane_width; ++l) acc[k][l] +=
        x[l] * q[k * ldq + j + l];
  }
  for (std::size_t k = 0; k < K; ++k) {
    const float* a = acc[k];
    float s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    for (std::size_t j = body; j < m; ++j) s += load_one<Memory>(g, e, j) * q[k * ldq + j];
    out[k * out_stride] = s;
  }
}

template <bool Memory>
void project_rows_range(const compensated_matrix& M, std::span<const float> q, std::span<float> p, std::size_t rank,
                        std::size_t lo, std::size_t hi) noexcept {
  const std::size_t n = M.rows, m = M.cols;
  for (std::size_t i = lo; i < hi; ++i) {
    const float* g = M.g.data() + i * m;
    const float* e = Memory ? M.e.data() + i * m : nullptr;
    std::size_t k = 0;
    for (; k + rank_block <= rank; k += rank_block)
      dot_row<rank_block, Memory>(g, e, q.data() + k * m, m, m, p.data() + k * n + i, n);
    switch (rank - k) {
      case 3: dot_row<3, Memory>(g, e, q.data() + k * m, m, m, p.data() + k * n + i, n); break;
      case 2: dot_row<2, Memory>(g, e, q.data() + k * m, m, m, p.data() + k * n + i, n); break;
      case 1: dot_row<1, Memory>(g, e, q.data() + k * m, m, m, p.data() + k * n + i, n); break;
      default: break;
    }
  }
}

/// Rows processed together by M^T P: each accumulator load and store serves two rows. Four
/// would halve that traffic, but their eight streams of g and e (plus the lines prefetched ahead)
/// share one set of the L1 cache when a row is a multiple of 4 KiB long, and conflict there:
/// measured at 4096 x 4096, rank 4, two rows took 3.0 streaming reads where four took 4.5.
inline constexpr std::size_t row_block = 2;

/// Eight consecutive floats as one value (GCC and Clang vector extension): the compiler keeps
/// them in one or two registers whatever the instruction set, where a loop over eight scalars
/// that also stores to q was left unvectorised. Element-wise arithmetic, so results equal the
/// scalar loop's bit for bit.
typedef float float_lanes __attribute__((vector_size(lane_width * sizeof(float))));

/// Taken and given by reference: a 32-byte vector passed by value has a different ABI with and
/// without AVX.
inline void load_vector(float_lanes& v, const float* p) noexcept { std::memcpy(&v, p, sizeof v); }
inline void store_vector(float* p, const float_lanes& v) noexcept { std::memcpy(p, &v, sizeof v); }

/// q[k][j] += sum over the R (1 or 2) rows of x_row[j] * p_row[k], for the K columns and the
/// panel [j0, j1); the R products are summed, then added to the accumulator.
template <std::size_t R, std::size_t K, bool Memory>
void axpy_rows(const compensated_matrix& M, std::size_t i, const float* p, std::size_t n, float* q, std::size_t j0,
               std::size_t j1) noexcept {
  const std::size_t m = M.cols;
  const float* g[R];
  const float* e[R];
  float pk[K][R];
  for (std::size_t r = 0; r < R; ++r) {
    g[r] = M.g.data() + (i + r) * m;
    e[r] = Memory ? M.e.data() + (i + r) * m : nullptr;
    for (std::size_t k = 0; k < K; ++k) pk[k][r] = p[k * n + i + r];
  }
  const std::size_t body = j0 + (j1 - j0) / lane_width * lane_width;
  for (std::size_t j = j0; j < body; j += lane_width) {
    float_lanes x[R];
    for (std::size_t r = 0; r < R; ++r) {
      prefetch_lanes<Memory>(g[r] + j, Memory ? e[r] + j : nullptr);
      load_vector(x[r], g[r] + j);
      if constexpr (Memory) {
        float_lanes er;
        load_vector(er, e[r] + j);
        x[r] += er;
      }
    }
    for (std::size_t k = 0; k < K; ++k) {
      float* qk = q + k * m + j;
      float_lanes acc;
      load_vector(acc, qk);
      if constexpr (R == 2)
        acc += x[0] * pk[k][0] + x[1] * pk[k][1];
      else
        acc += x[0] * pk[k][0];
      store_vector(qk, acc);
    }
  }
  for (std::size_t j = body; j < j1; ++j) {
    float x[R];
    for (std::size_t r = 0; r < R; ++r) x[r] = load_one<Memory>(g[r], e[r], j);
    for (std::size_t k = 0; k < K; ++k) {
      if constexpr (R == 2)
        q[k * m + j] += x[0] * pk[k][0] + x[1] * pk[k][1];
      else
        q[k * m + j] += x[0] * pk[k][0];
    }
  }
}

template <std::size_t R, bool Memory>
void axpy_rows_all_ranks(const compensated_matrix& M, std::size_t i, std::span<const float> p, std::span<float> q,
                         std::size_t rank, std::size_t j0, std::size_t j1) noexcept {
  const std::size_t n = M.rows, m = M.cols;
  std::size_t k = 0;
  for (; k + rank_block <= rank; k += rank_block)
    axpy_rows<R, rank_block, Memory>(M, i, p.data() + k * n, n, q.data() + k * m, j0, j1);
  switch (rank - k) {
    case 3: axpy_rows<R, 3, Memory>(M, i, p.data() + k * n, n, q.data() + k * m, j0, j1); break;
    case 2: axpy_rows<R, 2, Memory>(M, i, p.data() + k * n, n, q.data() + k * m, j0, j1); break;
    case 1: axpy_rows<R, 1, Memory>(M, i, p.data() + k * n, n, q.data() + k * m, j0, j1); break;
    default: break;
  }
}

template <bool Memory>
void project_cols_panel(const compensated_matrix& M, std::span<const float> p, std::span<float> q, std::size_t rank,
                        std::size_t j0, std::size_t j1) noexcept {
  const std::size_t n = M.rows, m = M.cols;
  for (std::size_t k = 0; k < rank; ++k) std::fill(q.data() + k * m + j0, q.data() + k * m + j1, 0.0f);
  std::size_t i = 0;
  for (; i + row_block <= n; i += row_block) axpy_rows_all_ranks<row_block, Memory>(M, i, p, q, rank, j0, j1);
  for (; i < n; ++i) axpy_rows_all_ranks<1, Memory>(M, i, p, q, rank, j0, j1);
}

/// One row of the reconstruction: o = sum_k p[k] * q[k][.], then e = (g + e) - o and g = o.
template <bool Memory>
void reconstruct_row(float* g, float* e, const float* p, std::size_t n, const float* q, std::size_t m,
                     std::size_t rank) noexcept {
  const std::size_t body = m / lane_width * lane_width;
  for (std::size_t j = 0; j < body; j += lane_width) {
    float o[lane_width];
    for (std::size_t l = 0; l < lane_width; ++l) o[l] = p[0] * q[j + l];
    for (std::size_t k = 1; k < rank; ++k)
      for (std::size_t l = 0; l < lane_width; ++l) o[l] += p[k * n] * q[k * m + j + l];
    prefetch_lanes<Memory>(g + j, e + j);
    if constexpr (Memory) {
      float x[lane_width];
      load_lanes<true>(g + j, e + j, x);
      for (std::size_t l = 0; l < lane_width; ++l) e[j + l] = x[l] - o[l];
    }
    for (std::size_t l = 0; l < lane_width; ++l) g[j + l] = o[l];
  }
  for (std::size_t j = body; j < m; ++j) {
    float o = p[0] * q[j];
    for (std::size_t k = 1; k < rank; ++k) o += p[k * n] * q[k * m + j];
    if constexpr (Memory) e[j] = (g[j] + e[j]) - o;
    g[j] = o;
  }
}

}  // namespace detail

/// The CPU's projections take no workspace: nothing to reserve (cuda::reserve_projections
/// grows the device's).
inline void reserve_projections(executor& /*exec*/, std::size_t /*rows*/, std::size_t /*cols*/,
                                std::size_t /*rank*/) noexcept {}

/// p = M q: p is n x r and q m x r, both column-major, r = q.size() / m. Reads M once when
/// r <= 4 (larger ranks re-read each row from the cache, not from memory).
inline void project_rows(executor& exec, const compensated_matrix& M, std::span<const float> q, std::span<float> p) {
  const std::size_t rank = bellows::detail::checked_rank("project_rows", M, p.size(), q.size(), false);
  if (rank == 0) return;
  exec.for_chunks(M.rows, detail::rows_per_task(M.cols), [&](std::size_t lo, std::size_t hi) {
    run_widest([&] {
      if (M.has_memory())
        detail::project_rows_range<true>(M, q, p, rank, lo, hi);
      else
        detail::project_rows_range<false>(M, q, p, rank, lo, hi);
    });
  });
}

/// q = M^T p: q is m x r and p n x r, both column-major, r = p.size() / n. Reads M once; each
/// task owns a panel of columns of q and sums over all rows in order, so no partial sums cross
/// tasks.
inline void project_cols(executor& exec, const compensated_matrix& M, std::span<const float> p, std::span<float> q) {
  const std::size_t rank = bellows::detail::checked_rank("project_cols", M, p.size(), q.size(), true);
  if (rank == 0) return;
  exec.for_chunks(M.cols, detail::panel_width(rank), [&](std::size_t j0, std::size_t j1) {
    run_widest([&] {
      if (M.has_memory())
        detail::project_cols_panel<true>(M, p, q, rank, j0, j1);
      else
        detail::project_cols_panel<false>(M, p, q, rank, j0, j1);
    });
  });
}

/// The decompression of PowerSGD fused with its error update, in one pass over g and e:
/// out = p q^T (r >= 1 columns each), then e = (g + e) - out when e is not empty, and g = out;
/// nothing when `skip` points to a float that is not 0 (a step's verdict).
inline void reconstruct_update(executor& exec, std::span<float> g, std::span<float> e, std::size_t rows,
                               std::size_t cols, std::span<const float> p, std::span<const float> q,
                               const float* skip = nullptr) {
  const compensated_matrix M{g, e, rows, cols};
  const std::size_t rank = bellows::detail::checked_rank("reconstruct_update", M, p.size(), q.size(), false);
  if (rows == 0 || cols == 0 || (skip != nullptr && *skip != 0.0f)) return;
  BELLOWS_EXPECTS(rank >= 1, "reconstruct_update: rank must be >= 1");
  exec.for_chunks(rows, detail::rows_per_task(cols), [&](std::size_t lo, std::size_t hi) {
    run_widest([&] {
      for (std::size_t i = lo; i < hi; ++i) {
        float* gi = g.data() + i * cols;
        if (e.empty())
          detail::reconstruct_row<false>(gi, nullptr, p.data() + i, rows, q.data(), cols, rank);
        else
          detail::reconstruct_row<true>(gi, e.data() + i * cols, p.data() + i, rows, q.data(), cols, rank);
      }
    });
  });
}

}  // namespace bellows::cpu
