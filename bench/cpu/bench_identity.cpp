// SPDX-License-Identifier: Apache-2.0
// Identity (plain averaging) on one rank: the finiteness pass, the allreduce and the division.
// Two passes over the data plus a write: expect about 3 x_floor.
#include <bellows/bellows.hpp>

#include <random>
#include <vector>

#include "x_floor.hpp"

namespace {

void identity_reduce(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  std::vector<float> grad(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (float& g : grad) g = normal(rng);

  bellows::cpu::executor one_thread(1);
  bellows::identity<> averaging(one_thread);
  auto st = averaging.make_state({0, "bench", bellows::shape::vector(n)});
  bellows::archetypes::collective solo;
  bellows::bench::run_against_floor(state, grad, [&] {
    auto r = averaging.reduce(st, grad, solo);
    benchmark::DoNotOptimize(r);
  });
}
BENCHMARK(identity_reduce)->Arg(1 << 20)->Arg(1 << 24)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
