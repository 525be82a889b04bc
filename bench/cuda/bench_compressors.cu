// SPDX-License-Identifier: Apache-2.0
// The whole step of every device compressor of compressors/list.hpp, at each of its example
// configurations, on one rank at 2^24 floats (no transport: bench/cuda/one_rank.cuh). Named
// cuda_step/<method>/example:<i>; bench/device_check.sh reports every one of them. A
// configuration the device refuses is reported as skipped with the refusal.
#include <bellows/compressors/list.hpp>
#include <bellows/cuda/executor.cuh>

#include <cstddef>
#include <string>

#include "cuda/device_floor.cuh"
#include "cuda/one_rank.cuh"

namespace {

constexpr std::size_t step_floats = std::size_t{1} << 24;

template <class M, std::size_t I>
void cuda_step(benchmark::State& state) {
  if (!bellows::bench::have_device(state)) return;
  float* g = bellows::bench::device_normals(step_floats, 3);
  try {
    bellows::cuda::executor exec;
    auto c = M::make(M::examples[I], exec);
    auto st = c.make_state({0, "bench", bellows::shape{step_floats / 4096, 4096}});
    bellows::bench::one_rank coll;
    bellows::bench::run_timed(state, g, step_floats, [&] { (void)c.reduce(st, {g, step_floats}, coll); });
  } catch (const bellows::error& e) {
    state.SkipWithError(e.what());
  }
  (void)cudaFree(g);
}

template <class M, std::size_t... I>
void register_examples(std::index_sequence<I...>) {
  (benchmark::RegisterBenchmark(("cuda_step/" + std::string(M::name) + "/example:" + std::to_string(I)).c_str(),
                                &cuda_step<M, I>)
       ->UseManualTime()
       ->Unit(benchmark::kMillisecond),
   ...);
}

const bool registered = [] {
  bellows::for_each_method(bellows::compressor_methods{}, [](auto m) {
    using M = typename decltype(m)::type;
    if constexpr (M::on_device) register_examples<M>(std::make_index_sequence<std::size(M::examples)>{});
  });
  return true;
}();

}  // namespace
