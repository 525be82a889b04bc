// SPDX-License-Identifier: Apache-2.0
// Exact top-k on the device at 2^26 floats: the selection at k = 1% and 0.1%, with and without
// error feedback (g + e read, the residual written), and the whole step of topk<cuda::executor>
// with error feedback on one rank (select, validate the payload, scatter the average, no
// transport). x_floor counts device reads of the 2^26 input floats.
#include <bellows/cuda/select.cuh>
#include <bellows/compressors/topk.cuh>

#include "cuda/device_floor.cuh"
#include "cuda/one_rank.cuh"

namespace {

void cuda_topk(benchmark::State& state) {
  if (!bellows::bench::have_device(state)) return;
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto k = static_cast<std::size_t>(state.range(1));
  const bool feedback = state.range(2) != 0;
  float* g = bellows::bench::device_normals(n, 1);
  float* e = feedback ? bellows::bench::device_normals(n, 2) : nullptr;
  float *staged = nullptr, *value = nullptr;
  std::uint32_t* index = nullptr;
  BELLOWS_CUDA_CHECK(cudaMalloc(&staged, feedback ? n * sizeof(float) : 1));
  BELLOWS_CUDA_CHECK(cudaMalloc(&value, k * sizeof(float)));
  BELLOWS_CUDA_CHECK(cudaMalloc(&index, k * sizeof(std::uint32_t)));
  const bellows::select_plan plan = bellows::plan_select(n, k, k);
  bellows::cuda::executor exec;
  exec.reserve(bellows::cuda::select_workspace::bytes(plan));
  bellows::cuda::select_workspace ws(plan, exec.workspace());
  const std::span<const float> ev = feedback ? std::span<const float>(e, n) : std::span<const float>();
  const std::span<float> sv = feedback ? std::span<float>(staged, n) : std::span<float>();
  bellows::bench::run_timed(state, g, n, [&] {
    bellows::cuda::select_top(exec, plan, {g, n}, ev, sv, ws, {{index, k}, {value, k}});
  });
  for (void* p : {static_cast<void*>(g), static_cast<void*>(e), static_cast<void*>(staged), static_cast<void*>(value),
                  static_cast<void*>(index)})
    BELLOWS_CUDA_CHECK(cudaFree(p));
}

void cuda_topk_step(benchmark::State& state) {
  if (!bellows::bench::have_device(state)) return;
  const auto n = static_cast<std::size_t>(state.range(0));
  float* g = bellows::bench::device_normals(n, 3);
  bellows::cuda::executor exec;
  bellows::topk<bellows::cuda::executor> c({.k = state.range(1)}, exec);
  auto st = c.make_state({0, "bench", bellows::shape{n}});
  bellows::bench::one_rank coll;
  bellows::bench::run_timed(state, g, n, [&] { (void)c.reduce(st, {g, n}, coll); });
  BELLOWS_CUDA_CHECK(cudaFree(g));
}

}  // namespace

BENCHMARK(cuda_topk_step)
    ->ArgNames({"n", "k"})
    ->Args({1 << 26, (1 << 26) / 100})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(cuda_topk)
    ->ArgNames({"n", "k", "feedback"})
    ->Args({1 << 26, (1 << 26) / 100, 0})
    ->Args({1 << 26, (1 << 26) / 100, 1})
    ->Args({1 << 26, (1 << 26) / 1000, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
