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

  bellows::cpu::executor one_thread(1);
  bellows::powersgd<> psgd({.rank = rank}, one_thread);
  auto st = psgd.make_state({0, "bench", bellows::shape{n, m}});
  bellows::archetypes::collective solo;
  (void)psgd.reduce(st, grad, solo);  // first step: the memory's pages are touched
  bellows::bench::run_against_floor(state, grad, [&] {
    auto r = psgd.reduce(st, grad, solo);
    benchmark::DoNotOptimize(r);
  });
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
