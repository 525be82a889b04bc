// SPDX-License-Identifier: Apache-2.0
// One PowerSGD step with error feedback on one rank and one thread: M = g + e, P = M Q, two
// orthogonalisations, Q = M^T P, the reconstruction and the error update. The step reads g and e
// three times and writes e and the output once: eight streams of n m floats (x_floor counts
// streaming reads of the n m floats of the gradient).
#include <bellows/compressors/powersgd.hpp>

#include <algorithm>
#include <random>
#include <vector>

#include "x_floor.hpp"

namespace {

void powersgd_step(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto m = static_cast<std::size_t>(state.range(1));
  const auto rank = static_cast<std::size_t>(state.range(2));
  std::vector<float> grad(n * m);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (float& g : grad) g = normal(rng);
  const double floor_s = bellows::bench::stream_read_seconds(grad);

  bellows::cpu::executor one_thread(1);
  bellows::powersgd<> psgd({.rank = rank}, one_thread);
  auto st = psgd.make_state({0, "bench", bellows::shape{n, m}});
  bellows::archetypes::collective solo;
  (void)psgd.reduce(st, grad, solo);  // first step: the memory's pages are touched
  const bellows::bench::stopwatch watch;
  for (auto _ : state) {
    auto r = psgd.reduce(st, grad, solo);
    benchmark::DoNotOptimize(r);
  }
  const double loop_s = watch.seconds();
  // The floor again after the loop, and the smaller of the two: on a shared machine a streaming
  // read suffers most from the other tenants, and a floor measured in a busy moment would flatter.
  bellows::bench::report_x_floor(state, std::min(floor_s, bellows::bench::stream_read_seconds(grad)), loop_s);
}
BENCHMARK(powersgd_step)
    ->ArgNames({"n", "m", "rank"})
    ->ArgsProduct({{1024}, {1024}, {1, 2, 4, 8}})
    ->ArgsProduct({{4096}, {4096}, {1, 2, 4, 8}})
    ->ArgsProduct({{8192}, {8192}, {1, 2, 4, 8}})
    ->ArgsProduct({{4096}, {9 * 512}, {1, 2, 4, 8}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
