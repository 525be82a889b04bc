// SPDX-License-Identifier: Apache-2.0
// PowerSGD's products on the device, under the names and arguments of cpu/skinny_gemm.hpp (the
// CUDA executor, spans over device memory): P = M Q, Q = M^T P, and the reconstruction P Q^T
// fused with the error update. M = g + e (or g alone) is formed as it is read, never stored;
// compensated_matrix is only a view of sizes and pointers here, its spans device memory.
//
// Every kernel streams M with 16-byte loads where the rows and factor columns allow it (m a
// multiple of four, 16-byte aligned pointers; otherwise one float at a time), and reads each
// element of g and e once per product for ranks up to 4. Larger ranks go in groups of four
// columns, one pass over M per group.
//  - project_rows: a block of 256 threads is split into groups of `tx` threads (whole warps,
//    tx a power of two from 32 to 256, enough to cover a row in one sweep where possible); a
//    group owns 8 consecutive rows and sums them against up to 4 columns of Q, so each Q value
//    read from the cache serves 8 rows. Partial sums are reduced by a butterfly within each
//    warp, then across the group's warps in order.
//  - project_cols: two passes. Blocks tile M into column strips of tx vectors and row tiles of
//    128 rows; each writes the column sums of its tile for up to 4 columns of P to the
//    workspace (or straight to Q when there is one row tile), and a second kernel adds the
//    tiles' sums in tile order. No atomics anywhere.
//  - reconstruct_update: one pass reading g and e and writing both, the rank-r product formed in
//    registers with the CPU's order of roundings (no fused multiply-add), so given the same P
//    and Q its g and e are the CPU's bits.
// Determinism: block shapes, tiles and reduction orders depend on the shape (and the alignment
// of the pointers) alone, so two runs give the same bytes. Sums use fused multiply-adds, so
// they are not the CPU's bits, only within its rounding bounds.
//
// Nothing here allocates or synchronises; project_cols carves its tile sums from the executor's
// workspace (project_cols_workspace_bytes says how much it needs).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <type_traits>

#include "bellows/core/error.hpp"
// The CPU kernels' view and shape checks are reused (host code only); nvcc's front end warns
// about the `GCC unroll` hints in that header's loops (diagnostic 1675), which concern the host
// code alone.
#pragma nv_diagnostic push
#pragma nv_diag_suppress 1675
#include "bellows/plan/low_rank.hpp"
#pragma nv_diagnostic pop
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/gram_schmidt.cuh"  // warp_sum
#include "bellows/cuda/launch.cuh"

namespace bellows::cuda {

namespace detail {

inline constexpr unsigned skinny_threads = 256;
/// Columns of a factor one kernel handles together (their accumulators live in registers).
inline constexpr unsigned skinny_rank_block = 4;
/// Rows one thread group of project_rows sums at once, sharing each Q value it loads.
inline constexpr unsigned rows_per_group = 8;
/// Rows of one tile of project_cols: the workspace holds rank * cols floats per tile.
inline constexpr std::size_t tile_rows = 128;
/// Rows per row lane of a reconstruct_update block.
inline constexpr std::size_t reconstruct_rows = 16;

/// V consecutive floats of one thread.
template <unsigned V>
struct floats {
  float v[V];
};

/// V floats at p (16-byte aligned when V is 4), loaded with the streaming hint: M is read once.
template <unsigned V>
__device__ inline floats<V> load_streaming(const float* p) {
  if constexpr (V == 4) {
    const float4 x = __ldcs(reinterpret_cast<const float4*>(p));
    return {{x.x, x.y, x.z, x.w}};
  } else {
    return {{__ldcs(p)}};
  }
}

/// V floats of a factor at p: read by many threads, kept in the caches.
template <unsigned V>
__device__ inline floats<V> load_factor(const float* p) {
  if constexpr (V == 4) {
    const float4 x = __ldg(reinterpret_cast<const float4*>(p));
    return {{x.x, x.y, x.z, x.w}};
  } else {
    return {{__ldg(p)}};
  }
}

/// V floats to p (16-byte aligned when V is 4), with the streaming hint: g and e are written once.
template <unsigned V>
__device__ inline void store_streaming(float* p, const floats<V>& x) {
  if constexpr (V == 4)
    __stcs(reinterpret_cast<float4*>(p), make_float4(x.v[0], x.v[1], x.v[2], x.v[3]));
  else
    __stcs(p, x.v[0]);
}

/// V floats to p, kept in the cache (sums read again soon).
template <unsigned V>
__device__ inline void store(float* p, const floats<V>& x) {
  if constexpr (V == 4)
    *reinterpret_cast<float4*>(p) = make_float4(x.v[0], x.v[1], x.v[2], x.v[3]);
  else
    *p = x.v[0];
}

/// M at element `at` and the V after it: g + e, rounded as on the CPU, or g when e is null.
template <unsigned V>
__device__ inline floats<V> load_matrix(const float* g, const float* e, std::size_t at) {
  floats<V> x = load_streaming<V>(g + at);
  if (e != nullptr) {
    const floats<V> y = load_streaming<V>(e + at);
#pragma unroll
    for (unsigned l = 0; l < V; ++l) x.v[l] = __fadd_rn(x.v[l], y.v[l]);
  }
  return x;
}

/// p = M q for K columns (p and q point at the first of them): see the file's comment. `tx`
/// threads per row group; a block holds skinny_threads / tx groups of rows_per_group rows.
template <unsigned K, unsigned V>
__global__ void __launch_bounds__(skinny_threads, 2)
    project_rows_kernel(const float* __restrict__ g, const float* __restrict__ e, std::size_t n, std::size_t m,
                        const float* __restrict__ q, float* __restrict__ p, unsigned tx) {
  constexpr unsigned R = rows_per_group;
  constexpr unsigned warps = skinny_threads / 32;
  __shared__ float warp_sums[warps][R * K];
  const unsigned lane = threadIdx.x % tx, group = threadIdx.x / tx;
  const std::size_t row0 = (blockIdx.x * std::size_t{skinny_threads / tx} + group) * R;
  float acc[R][K] = {};
  for (std::size_t c = lane; c < m / V; c += tx) {
    const std::size_t j = c * V;
    floats<V> qk[K];
#pragma unroll
    for (unsigned k = 0; k < K; ++k) qk[k] = load_factor<V>(q + k * m + j);
#pragma unroll
    for (unsigned r = 0; r < R; ++r) {
      // Rows past the end read the last row again (no branch between the loads); not written.
      const floats<V> x = load_matrix<V>(g, e, min(row0 + r, n - 1) * m + j);
#pragma unroll
      for (unsigned k = 0; k < K; ++k)
#pragma unroll
        for (unsigned l = 0; l < V; ++l) acc[r][k] = __fmaf_rn(x.v[l], qk[k].v[l], acc[r][k]);
    }
  }
  // Each warp's sum by a butterfly, then the group's warps in order.
  const unsigned warp = threadIdx.x / 32;
#pragma unroll
  for (unsigned r = 0; r < R; ++r)
#pragma unroll
    for (unsigned k = 0; k < K; ++k) {
      const float s = warp_sum(acc[r][k]);
      if (threadIdx.x % 32 == 0) warp_sums[warp][r * K + k] = s;
    }
  __syncthreads();
  if (lane < R * K) {
    const unsigned r = lane / K, k = lane % K, first = group * (tx / 32);
    float s = warp_sums[first][lane];
    for (unsigned w = 1; w < tx / 32; ++w) s += warp_sums[first + w][lane];
    if (row0 + r < n) p[k * n + row0 + r] = s;
  }
}

/// The column sums of one tile of M against K columns of p: block b covers the column strip
/// b % col_tiles (tx vectors) and the rows [t * tile_rows, ...) of tile t = b / col_tiles; its
/// sums go to out + t * tile_stride, column k at out[k * m + j]. Row lane y of the block
/// (threadIdx.x / tx) sums rows y, y + ty, ... of the tile; the lanes are added in order.
template <unsigned K, unsigned V>
__global__ void __launch_bounds__(skinny_threads)
    project_cols_kernel(const float* __restrict__ g, const float* __restrict__ e, std::size_t n, std::size_t m,
                        const float* __restrict__ p, float* __restrict__ out, std::size_t tile_stride, unsigned tx,
                        std::size_t col_tiles) {
  __shared__ float lane_sums[K * V][skinny_threads];
  const unsigned lane = threadIdx.x % tx, y = threadIdx.x / tx, ty = skinny_threads / tx;
  const std::size_t strip = blockIdx.x % col_tiles, tile = blockIdx.x / col_tiles;
  const std::size_t c = strip * tx + lane, j = c * V;
  const bool live = c < m / V;
  const std::size_t lo = tile * tile_rows, hi = min(n, lo + tile_rows);
  float acc[K][V] = {};
  if (live) {
#pragma unroll 4
    for (std::size_t i = lo + y; i < hi; i += ty) {
      const floats<V> x = load_matrix<V>(g, e, i * m + j);
#pragma unroll
      for (unsigned k = 0; k < K; ++k) {
        const float pk = __ldg(p + k * n + i);
#pragma unroll
        for (unsigned l = 0; l < V; ++l) acc[k][l] = __fmaf_rn(x.v[l], pk, acc[k][l]);
      }
    }
  }
  if (ty > 1) {  // the same for the whole block
#pragma unroll
    for (unsigned k = 0; k < K; ++k)
#pragma unroll
      for (unsigned l = 0; l < V; ++l) lane_sums[k * V + l][threadIdx.x] = acc[k][l];
    __syncthreads();
    if (y == 0) {
#pragma unroll
      for (unsigned k = 0; k < K; ++k)
#pragma unroll
        for (unsigned l = 0; l < V; ++l)
          for (unsigned t = 1; t < ty; ++t) acc[k][l] += lane_sums[k * V + l][t * tx + lane];
    }
  }
  if (y == 0 && live) {
    float* o = out + tile * tile_stride + j;
#pragma unroll
    for (unsigned k = 0; k < K; ++k) {
      floats<V> f;
#pragma unroll
      for (unsigned l = 0; l < V; ++l) f.v[l] = acc[k][l];
      store<V>(o + k * m, f);
    }
  }
}

/// q[x] = the sum over t = 0 .. tiles - 1 of sums[t * count + x], in that order.
__global__ void sum_tiles_kernel(const float* __restrict__ sums, std::size_t tiles, std::size_t count,
                                 float* __restrict__ q) {
  for (std::size_t x = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; x < count;
       x += std::size_t{gridDim.x} * blockDim.x) {
    float s = sums[x];
#pragma unroll 8
    for (std::size_t t = 1; t < tiles; ++t) s += sums[t * count + x];
    q[x] = s;
  }
}

/// out = p q^T, e = (g + e) - out (when e is not null), g = out, as cpu::detail::reconstruct_row
/// rounds them. K = rank (1 to 4) keeps the row's q vectors in registers; K = 0 takes any rank
/// and reads them from the cache for every row. Block b covers the column strip b % col_tiles
/// (tx vectors) and rows [(b / col_tiles) * ty * reconstruct_rows, ...), row lane y taking
/// every ty-th row.
template <unsigned K, unsigned V>
__global__ void __launch_bounds__(skinny_threads)
    reconstruct_kernel(float* __restrict__ g, float* __restrict__ e, std::size_t n, std::size_t m,
                       const float* __restrict__ p, const float* __restrict__ q, std::size_t rank, unsigned tx,
                       std::size_t col_tiles, const float* skip) {
  if (skip != nullptr && *skip != 0.0f) return;
  const unsigned lane = threadIdx.x % tx, y = threadIdx.x / tx, ty = skinny_threads / tx;
  const std::size_t c = (blockIdx.x % col_tiles) * tx + lane;
  if (c >= m / V) return;
  const std::size_t j = c * V;
  floats<V> qk[K > 0 ? K : 1];
  if constexpr (K > 0) {
#pragma unroll
    for (unsigned k = 0; k < K; ++k) qk[k] = load_factor<V>(q + k * m + j);
  }
  const auto q_of = [&](std::size_t k) {
    if constexpr (K > 0)
      return qk[k];
    else
      return load_factor<V>(q + k * m + j);
  };
  const std::size_t lo = (blockIdx.x / col_tiles) * ty * reconstruct_rows;
  const std::size_t hi = min(n, lo + ty * reconstruct_rows);
  const std::size_t r = K > 0 ? K : rank;
#pragma unroll(K > 0 ? 4 : 1)
  for (std::size_t i = lo + y; i < hi; i += ty) {
    floats<V> o = q_of(0);
    const float p0 = __ldg(p + i);
#pragma unroll
    for (unsigned l = 0; l < V; ++l) o.v[l] = __fmul_rn(p0, o.v[l]);
#pragma unroll
    for (std::size_t k = 1; k < r; ++k) {
      const floats<V> qv = q_of(k);
      const float pk = __ldg(p + k * n + i);
#pragma unroll
      for (unsigned l = 0; l < V; ++l) o.v[l] = __fadd_rn(o.v[l], __fmul_rn(pk, qv.v[l]));
    }
    const std::size_t at = i * m + j;
    if (e != nullptr) {
      floats<V> d = load_matrix<V>(g, e, at);
#pragma unroll
      for (unsigned l = 0; l < V; ++l) d.v[l] = __fsub_rn(d.v[l], o.v[l]);
      store_streaming<V>(e + at, d);
    }
    store_streaming<V>(g + at, o);
  }
}

/// 4 when m is a multiple of four and every pointer (null ones aside) is 16-byte aligned, so
/// that every row and factor column starts on a 16-byte boundary; otherwise 1.
[[nodiscard]] inline unsigned vector_width(std::size_t m, std::initializer_list<const float*> pointers) noexcept {
  if (m % 4 != 0) return 1;
  for (const float* x : pointers)
    if (reinterpret_cast<std::uintptr_t>(x) % 16 != 0) return 1;
  return 4;
}

/// Threads along a row: a power of two from 32 to skinny_threads, the fewest that cover
/// `vectors` in one sweep when that many are enough.
[[nodiscard]] inline unsigned threads_along(std::size_t vectors) noexcept {
  unsigned t = 32;
  while (t < skinny_threads && t < vectors) t *= 2;
  return t;
}

/// A grid of `blocks` blocks, which must fit CUDA's limit.
[[nodiscard]] inline unsigned grid_of(const char* who, std::size_t blocks) {
  BELLOWS_EXPECTS(blocks <= 0x7FFFFFFFu, who, ": ", blocks, " blocks exceed CUDA's grid");
  return static_cast<unsigned>(blocks);
}

/// Calls launch(integral_constant<K>, integral_constant<V>) for k in 1 .. 4 and v in {1, 4}.
template <class Launch>
void with_rank_and_width(std::size_t k, unsigned v, const Launch& launch) {
  const auto widths = [&](auto kc) {
    if (v == 4)
      launch(kc, std::integral_constant<unsigned, 4>{});
    else
      launch(kc, std::integral_constant<unsigned, 1>{});
  };
  switch (k) {
    case 1: widths(std::integral_constant<unsigned, 1>{}); break;
    case 2: widths(std::integral_constant<unsigned, 2>{}); break;
    case 3: widths(std::integral_constant<unsigned, 3>{}); break;
    default: widths(std::integral_constant<unsigned, 4>{}); break;
  }
}

/// The tile sums of project_cols, carved from `a` (nothing when there is one row tile).
[[nodiscard]] inline float* carve_tile_sums(arena& a, std::size_t rows, std::size_t cols, std::size_t rank) {
  const std::size_t tiles = (rows + tile_rows - 1) / tile_rows;
  return tiles > 1 ? a.take<float>(tiles * rank * cols) : nullptr;
}

[[nodiscard]] inline const float* memory_of(const compensated_matrix& M) noexcept {
  return M.has_memory() ? M.e.data() : nullptr;
}

}  // namespace detail

/// Device bytes project_cols carves from the executor's workspace for a rows x cols matrix
/// and `rank` columns: rank * cols floats per tile of 128 rows, none for 128 rows or fewer.
[[nodiscard]] inline std::size_t project_cols_workspace_bytes(std::size_t rows, std::size_t cols, std::size_t rank) {
  arena sizing;
  (void)detail::carve_tile_sums(sizing, rows, cols, rank);
  return sizing.used();
}

/// Makes the executor's workspace hold what project_cols needs for a rows x cols matrix at
/// `rank` (cpu::reserve_projections needs nothing): at registration, never on the hot path.
inline void reserve_projections(executor& exec, std::size_t rows, std::size_t cols, std::size_t rank) {
  exec.reserve(project_cols_workspace_bytes(rows, cols, rank));
}

/// cpu::project_rows on the device: p = M q, p n x r and q m x r column-major, r = q.size() / m.
/// Reads M once when r <= 4.
inline void project_rows(executor& exec, const compensated_matrix& M, std::span<const float> q, std::span<float> p) {
  const std::size_t rank = bellows::detail::checked_rank("cuda::project_rows", M, p.size(), q.size(), false);
  if (rank == 0) return;
  const std::size_t n = M.rows, m = M.cols;
  const float* e = detail::memory_of(M);
  const unsigned v = detail::vector_width(m, {M.g.data(), e, q.data()});
  const unsigned tx = detail::threads_along(m / v);
  const std::size_t rows_per_block = std::size_t{detail::skinny_threads / tx} * detail::rows_per_group;
  const unsigned blocks = detail::grid_of("cuda::project_rows", (n + rows_per_block - 1) / rows_per_block);
  for (std::size_t k0 = 0; k0 < rank; k0 += detail::skinny_rank_block) {
    detail::with_rank_and_width(std::min<std::size_t>(detail::skinny_rank_block, rank - k0), v, [&](auto K, auto V) {
      detail::launch(&detail::project_rows_kernel<decltype(K)::value, decltype(V)::value>, blocks,
                     detail::skinny_threads, exec.stream(), M.g.data(), e, n, m, q.data() + k0 * m, p.data() + k0 * n,
                     tx);
    });
  }
}

/// cpu::project_cols on the device: q = M^T p, q m x r and p n x r column-major, r = p.size() / n.
/// Reads M once when r <= 4. Needs project_cols_workspace_bytes(n, m, r) of the executor's
/// workspace.
inline void project_cols(executor& exec, const compensated_matrix& M, std::span<const float> p, std::span<float> q) {
  const std::size_t rank = bellows::detail::checked_rank("cuda::project_cols", M, p.size(), q.size(), true);
  if (rank == 0) return;
  const std::size_t n = M.rows, m = M.cols;
  const std::size_t need = project_cols_workspace_bytes(n, m, rank);
  BELLOWS_EXPECTS(need <= exec.workspace_bytes(), "cuda::project_cols: the workspace holds ", exec.workspace_bytes(),
                  " bytes, a ", n, " x ", m, " matrix at rank ", rank, " needs ", need,
                  " (reserve project_cols_workspace_bytes(rows, cols, rank))");
  arena workspace = exec.workspace();
  float* sums = detail::carve_tile_sums(workspace, n, m, rank);  // not null when row_tiles > 1
  const float* e = detail::memory_of(M);
  const unsigned v = detail::vector_width(m, {M.g.data(), e, q.data()});
  const unsigned tx = detail::threads_along(m / v);
  const std::size_t col_tiles = (m / v + tx - 1) / tx, row_tiles = (n + detail::tile_rows - 1) / detail::tile_rows;
  const unsigned blocks = detail::grid_of("cuda::project_cols", col_tiles * row_tiles);
  float* out = row_tiles > 1 ? sums : q.data();
  for (std::size_t k0 = 0; k0 < rank; k0 += detail::skinny_rank_block) {
    detail::with_rank_and_width(std::min<std::size_t>(detail::skinny_rank_block, rank - k0), v, [&](auto K, auto V) {
      detail::launch(&detail::project_cols_kernel<decltype(K)::value, decltype(V)::value>, blocks,
                     detail::skinny_threads, exec.stream(), M.g.data(), e, n, m, p.data() + k0 * n, out + k0 * m,
                     rank * m, tx, col_tiles);
    });
  }
  if (row_tiles > 1)
    detail::launch(&detail::sum_tiles_kernel, detail::stride_blocks(rank * m), detail::elementwise_threads,
                   exec.stream(), sums, row_tiles, rank * m, q.data());
}

/// cpu::reconstruct_update on the device, in one pass over g and e: out = p q^T (r >= 1
/// columns each), then e = (g + e) - out when e is not empty, and g = out; nothing when `skip`
/// points to a float (device memory) that is not 0, read by the kernel.
inline void reconstruct_update(executor& exec, std::span<float> g, std::span<float> e, std::size_t rows,
                               std::size_t cols, std::span<const float> p, std::span<const float> q,
                               const float* skip = nullptr) {
  const compensated_matrix M{g, e, rows, cols};
  const std::size_t rank = bellows::detail::checked_rank("cuda::reconstruct_update", M, p.size(), q.size(), false);
  if (rows == 0 || cols == 0) return;
  BELLOWS_EXPECTS(rank >= 1, "cuda::reconstruct_update: rank must be >= 1");
  float* e_data = e.empty() ? nullptr : e.data();
  const unsigned v = detail::vector_width(cols, {g.data(), e_data, q.data()});
  const unsigned tx = detail::threads_along(cols / v);
  const std::size_t col_tiles = (cols / v + tx - 1) / tx;
  const std::size_t rows_per_block = std::size_t{detail::skinny_threads / tx} * detail::reconstruct_rows;
  const unsigned blocks =
      detail::grid_of("cuda::reconstruct_update", col_tiles * ((rows + rows_per_block - 1) / rows_per_block));
  const auto run = [&](auto K, auto V) {
    detail::launch(&detail::reconstruct_kernel<decltype(K)::value, decltype(V)::value>, blocks, detail::skinny_threads,
                   exec.stream(), g.data(), e_data, rows, cols, p.data(), q.data(), rank, tx, col_tiles, skip);
  };
  if (rank <= detail::skinny_rank_block)
    detail::with_rank_and_width(rank, v, run);
  else if (v == 4)
    run(std::integral_constant<unsigned, 0>{}, std::integral_constant<unsigned, 4>{});
  else
    run(std::integral_constant<unsigned, 0>{}, std::integral_constant<unsigned, 1>{});
}

}  // namespace bellows::cuda
