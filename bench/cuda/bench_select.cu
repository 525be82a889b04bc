// SPDX-License-Identifier: Apache-2.0
// Top-k on the device at 2^26 floats: the exact selection at k = 1% and 0.1% and the approximate
// one at 1% (k to 1.25 k kept), with and without error feedback (g + e read, the residual
// written), and the whole step of topk<cuda::executor>
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
  const std::size_t most =
      bellows::topk_most(state.range(3) != 0 ? bellows::topk_mode::approximate : bellows::topk_mode::exact, n, k);
  float* g = bellows::bench::device_normals(n, 1);
  float* e = feedback ? bellows::bench::device_normals(n, 2) : nullptr;
  float *staged = nullptr, *value = nullptr;
  std::uint32_t* index = nullptr;
  BELLOWS_CUDA_CHECK(cudaMalloc(&staged, feedback ? n * sizeof(float) : 1));
  BELLOWS_CUDA_CHECK(cudaMalloc(&value, most * sizeof(float)));
  BELLOWS_CUDA_CHECK(cudaMalloc(&index, most * sizeof(std::uint32_t)));
  const bellows::select_plan plan = bellows::plan_select(n, k, most);
  const bellows::philox::stream draw{1, 0, 0, 0};
  bellows::cuda::executor exec;
  exec.reserve(bellows::cuda::select_workspace::bytes(plan));
  bellows::cuda::select_workspace ws(plan, exec.workspace());
  const std::span<const float> ev = feedback ? std::span<const float>(e, n) : std::span<const float>();
  const std::span<float> sv = feedback ? std::span<float>(staged, n) : std::span<float>();
  bellows::bench::run_timed(state, g, n, [&] {
    bellows::cuda::select_top(exec, plan, draw, {g, n}, ev, sv, ws, {{index, most}, {value, most}});
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
    ->ArgNames({"n", "k", "feedback", "approximate"})
    ->Args({1 << 26, (1 << 26) / 100, 0, 0})
    ->Args({1 << 26, (1 << 26) / 100, 1, 0})
    ->Args({1 << 26, (1 << 26) / 1000, 0, 0})
    ->Args({1 << 26, (1 << 26) / 100, 0, 1})
    ->Args({1 << 26, (1 << 26) / 100, 1, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
