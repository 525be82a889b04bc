// SPDX-License-Identifier: Apache-2.0
// One PowerSGD step's kernels on the device, error feedback on, for an 8192 x 8192 layer (2^26
// floats) at ranks 1, 2 and 4: orthogonalize Q, P = M Q, orthogonalize P, Q = M^T P,
// reconstruct_update (no collective: one worker). x_floor counts device reads of the 2^26
// floats of g.
//
// `streams` is the fewest passes over n m floats this sequence can make: project_rows reads g
// and e (2), project_cols reads them again (2; P must be whole and orthogonalised, and in
// training allreduced, before Q = M^T P can start, so M cannot be kept from the first product),
// and reconstruct_update reads g and e and writes both (4): 8, of which 2 are writes. Not
// counted: the factors ((n + m) r floats, read from the caches), project_cols' tile sums
// (64 tiles x r x m floats, written and read once: 1/32 of a stream at rank 4) and the two
// orthogonalisations (one block each, over 2^15 floats at rank 4). x_streams = x_floor /
// streams: 1 would be the step at the speed of plain reads.
//
// The step leaves M = g + e unchanged (g becomes P Q^T, e the rest), so every iteration
// computes on the same matrix, with Q warm-started from the iteration before.
//
// cuda_powersgd_compressor_step times the same step as powersgd<cuda::executor> takes it on one
// rank (bench/cuda/one_rank.cuh): the kernels above plus the query's copy, the finiteness checks
// of P and Q and the two waits for their verdicts. Same streams.
#include <bellows/cuda/gram_schmidt.cuh>
#include <bellows/compressors/powersgd.cuh>
#include <bellows/cuda/skinny_gemm.cuh>

#include "cuda/device_floor.cuh"
#include "cuda/one_rank.cuh"

namespace {

/// The step's 8 streams beside x_floor (see above).
void count_streams(benchmark::State& state) {
  constexpr double streams = 8;
  state.counters["streams"] = streams;
  state.counters["x_streams"] = state.counters["x_floor"].value / streams;
}

void cuda_powersgd_step(benchmark::State& state) {
  if (!bellows::bench::have_device(state)) return;
  const auto n = static_cast<std::size_t>(state.range(0)), r = static_cast<std::size_t>(state.range(1));
  float* g = bellows::bench::device_normals(n * n, 1);
  float* e = bellows::bench::device_normals(n * n, 2);
  float* q = bellows::bench::device_normals(n * r, 3);
  float* p = nullptr;
  BELLOWS_CUDA_CHECK(cudaMalloc(&p, n * r * sizeof(float)));
  bellows::cuda::executor exec;
  exec.reserve(bellows::cuda::project_cols_workspace_bytes(n, n, r));
  const bellows::compensated_matrix M{{g, n * n}, {e, n * n}, n, n};
  bellows::bench::run_timed(state, g, n * n, [&] {
    bellows::cuda::orthogonalize(exec, {q, n * r}, n, 0.0f);
    bellows::cuda::project_rows(exec, M, {q, n * r}, {p, n * r});
    bellows::cuda::orthogonalize(exec, {p, n * r}, n, 0.0f);
    bellows::cuda::project_cols(exec, M, {p, n * r}, {q, n * r});
    bellows::cuda::reconstruct_update(exec, {g, n * n}, {e, n * n}, n, n, {p, n * r}, {q, n * r});
  });
  count_streams(state);
  for (float* x : {g, e, q, p}) (void)cudaFree(x);
}

void cuda_powersgd_compressor_step(benchmark::State& state) {
  if (!bellows::bench::have_device(state)) return;
  const auto n = static_cast<std::size_t>(state.range(0));
  float* g = bellows::bench::device_normals(n * n, 1);
  bellows::cuda::executor exec;
  bellows::powersgd<bellows::cuda::executor> c({.rank = static_cast<std::size_t>(state.range(1))}, exec);
  auto st = c.make_state({0, "bench", bellows::shape{n, n}});
  bellows::bench::one_rank coll;
  bellows::bench::run_timed(state, g, n * n, [&] { (void)c.reduce(st, {g, n * n}, coll); });
  count_streams(state);
  (void)cudaFree(g);
}

}  // namespace

BENCHMARK(cuda_powersgd_step)
    ->ArgNames({"n", "rank"})
    ->Args({8192, 1})
    ->Args({8192, 2})
    ->Args({8192, 4})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(cuda_powersgd_compressor_step)
    ->ArgNames({"n", "rank"})
    ->Args({8192, 1})
    ->Args({8192, 4})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
