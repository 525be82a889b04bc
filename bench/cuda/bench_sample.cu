// SPDX-License-Identifier: Apache-2.0
// Rand-k on the device at 2^26 floats, k = 1% and 50% (the complement draw): the index draw
// and the gather with error feedback (g + e read, the residual written); and at k = 1% the
// whole step of randk<cuda::executor> on one rank (draw, gather, scatter of the average, no
// transport). x_floor counts device reads of the 2^26 input floats.
#include <bellows/compressors/randk.cuh>
#include <bellows/cuda/sample.cuh>

#include "cuda/device_floor.cuh"
#include "cuda/one_rank.cuh"

namespace {

void cuda_randk(benchmark::State& state) {
  if (!bellows::bench::have_device(state)) return;
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto k = static_cast<std::size_t>(state.range(1));
  float* g = bellows::bench::device_normals(n, 1);
  float* e = bellows::bench::device_normals(n, 2);
  float *staged = nullptr, *value = nullptr;
  std::uint32_t* index = nullptr;
  BELLOWS_CUDA_CHECK(cudaMalloc(&staged, n * sizeof(float)));
  BELLOWS_CUDA_CHECK(cudaMalloc(&value, k * sizeof(float)));
  BELLOWS_CUDA_CHECK(cudaMalloc(&index, k * sizeof(std::uint32_t)));
  const bellows::sample_plan plan = bellows::plan_sample(n, k);
  bellows::cuda::executor exec;
  exec.reserve(bellows::cuda::sample_workspace::bytes(plan));
  bellows::cuda::sample_workspace ws(plan, exec.workspace());
  std::uint32_t step = 0;
  bellows::bench::run_timed(state, g, n, [&] {
    bellows::cuda::draw_sample(exec, plan, {7, step++, 0, bellows::philox::stream::shared}, ws);
    bellows::cuda::gather_sample(exec, plan, ws, {g, n}, {e, n}, {staged, n}, {{index, k}, {value, k}});
  });
  for (void* p : {static_cast<void*>(g), static_cast<void*>(e), static_cast<void*>(staged), static_cast<void*>(value),
                  static_cast<void*>(index)})
    BELLOWS_CUDA_CHECK(cudaFree(p));
}

void cuda_randk_step(benchmark::State& state) {
  if (!bellows::bench::have_device(state)) return;
  const auto n = static_cast<std::size_t>(state.range(0));
  float* g = bellows::bench::device_normals(n, 3);
  bellows::cuda::executor exec;
  bellows::randk<bellows::cuda::executor> c({.k = state.range(1)}, exec);
  auto st = c.make_state({0, "bench", bellows::shape{n}});
  bellows::bench::one_rank coll;
  bellows::bench::run_timed(state, g, n, [&] { (void)c.reduce(st, {g, n}, coll); });
  BELLOWS_CUDA_CHECK(cudaFree(g));
}

}  // namespace

BENCHMARK(cuda_randk_step)
    ->ArgNames({"n", "k"})
    ->Args({1 << 26, (1 << 26) / 100})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(cuda_randk)
    ->ArgNames({"n", "k"})
    ->Args({1 << 26, (1 << 26) / 100})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
// At k = n / 2 the draw drops about 0.13 n surplus indices by Floyd's algorithm, one after the
// other in one thread (as on the CPU): seconds, so two iterations.
BENCHMARK(cuda_randk)
    ->ArgNames({"n", "k"})
    ->Args({1 << 26, (1 << 26) / 2})
    ->Iterations(2)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
