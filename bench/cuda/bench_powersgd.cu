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
#include <bellows/cuda/skinny_gemm.cuh>
#include <bellows/cuda/gram_schmidt.cuh>

#include "cuda/device_floor.cuh"

namespace {

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
  const bellows::cpu::compensated_matrix M{{g, n * n}, {e, n * n}, n, n};
  bellows::bench::run_timed(state, g, n * n, [&] {
    bellows::cuda::orthogonalize(exec, {q, n * r}, n, 0.0f);
    bellows::cuda::project_rows(exec, M, {q, n * r}, {p, n * r});
    bellows::cuda::orthogonalize(exec, {p, n * r}, n, 0.0f);
    bellows::cuda::project_cols(exec, M, {p, n * r}, {q, n * r});
    bellows::cuda::reconstruct_update(exec, {g, n * n}, {e, n * n}, n, n, {p, n * r}, {q, n * r});
  });
  constexpr double streams = 8;
  state.counters["streams"] = streams;
  state.counters["x_streams"] = state.counters["x_floor"].value / streams;
  for (float* x : {g, e, q, p}) (void)cudaFree(x);
}

}  // namespace

BENCHMARK(cuda_powersgd_step)->ArgNames({"n", "rank"})->Args({8192, 1})->Args({8192, 2})->Args({8192, 4})
    ->UseManualTime()->Unit(benchmark::kMillisecond);
