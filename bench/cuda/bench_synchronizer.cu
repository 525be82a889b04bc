// SPDX-License-Identifier: Apache-2.0
// What the device Synchronizer (sync/synchronizer.cuh) costs beyond the device compressors it
// runs, on one rank (bench/cuda/one_rank.cuh: no transport), for two models: the Fashion-MNIST
// example's MLP (784-256-128-10, three weights and three biases) and one 8192 x 8192 layer.
// Each iteration restores the gradients (not timed), then times between CUDA events either the
// Synchronizer's step (synchronizer<C, basic_accordion<cuda::executor>, cuda::executor>) or the
// same compressors called directly on their own states, alternating. Names:
//   cuda_synchronizer/<model>/<method>/<epoch>
//     model   mlp or 8192x8192
//     method  powersgd-4-1 (rank 4 <-> 1) or topk-10%-1% (ratio 0.10 <-> 0.01); the layers
//             start at the low level (Accordion's first epochs), so the step runs rank 4 or 10%
//     epoch   plain: no check this epoch (the detector does nothing); check: a check epoch
//             (the finiteness vote, one wait more, and the gradients added into the sums)
//   cuda_synchronizer_end_epoch/<model>: the end of a check epoch (the norms, one allreduce,
//             one wait), which walks each layer's sum in the CPU's sequential order
// Counters: sync_ms (the step), direct_ms (the compressors alone), overhead_pct =
// (sync_ms / direct_ms - 1) * 100, and x_floor and floor_ms of the step against one device read
// of all the gradients.
#include <bellows/compressors/powersgd.cuh>
#include <bellows/compressors/powersgd.hpp>
#include <bellows/compressors/topk.cuh>
#include <bellows/compressors/topk.hpp>
#include <bellows/cuda/executor.cuh>
#include <bellows/regime/accordion.cuh>
#include <bellows/sync/synchronizer.cuh>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "cuda/device_floor.cuh"
#include "cuda/one_rank.cuh"

namespace {

using detector = bellows::basic_accordion<bellows::cuda::executor>;

const std::vector<bellows::shape> mlp{bellows::shape{256, 784}, bellows::shape{256},     bellows::shape{128, 256},
                                      bellows::shape{128},      bellows::shape{10, 128}, bellows::shape{10}};
const std::vector<bellows::shape> square{bellows::shape{8192, 8192}};

/// The layers' gradients laid end to end in one device array, with a pristine copy.
struct gradients {
  std::size_t total = 0;
  float* source = nullptr;
  float* work = nullptr;
  std::vector<std::span<float>> spans;

  explicit gradients(const std::vector<bellows::shape>& shapes) {
    for (const bellows::shape& s : shapes) total += s.size();
    source = bellows::bench::device_normals(total, 5);
    BELLOWS_CUDA_CHECK(cudaMalloc(&work, total * sizeof(float)));
    std::size_t at = 0;
    for (const bellows::shape& s : shapes) {
      spans.emplace_back(work + at, s.size());
      at += s.size();
    }
  }
  gradients(const gradients&) = delete;
  gradients& operator=(const gradients&) = delete;
  ~gradients() {
    (void)cudaFree(source);
    (void)cudaFree(work);
  }
  void restore() const {
    BELLOWS_CUDA_CHECK(cudaMemcpy(work, source, total * sizeof(float), cudaMemcpyDeviceToDevice));
  }
};

template <class C, class Params>
void step(benchmark::State& state, const std::vector<bellows::shape>& shapes, const Params& low, const Params& high,
          bool check_epoch) {
  if (!bellows::bench::have_device(state)) return;
  bellows::cuda::executor exec;
  bellows::bench::one_rank coll;
  // A check epoch: interval 1 and epoch 0 in progress. A plain one: epoch 1 of interval 10^6.
  bellows::accordion_params params;
  params.interval = check_epoch ? 1 : 1'000'000;
  bellows::synchronizer<C, detector, bellows::cuda::executor> sync(C(low, exec), C(high, exec), detector(params, exec),
                                                                   exec);
  C direct(low, exec);
  std::vector<typename C::state> states;
  for (std::size_t id = 0; id < shapes.size(); ++id) {
    const std::string name = "tensor" + std::to_string(id);
    (void)sync.add_layer(name, shapes[id]);
    states.push_back(direct.make_state({static_cast<std::uint32_t>(id), name, shapes[id]}));
  }
  if (!check_epoch) (void)sync.end_epoch(0.1f, coll);
  const gradients g(shapes);
  g.restore();
  (void)sync.step(g.spans, coll);  // the first step sizes the buffers and checks the layers
  bellows::bench::event_timer timer;
  std::vector<double> sync_s, direct_s;
  for (auto _ : state) {
    g.restore();
    timer.start();
    (void)sync.step(g.spans, coll);
    sync_s.push_back(timer.stop());
    state.SetIterationTime(sync_s.back());
    g.restore();
    timer.start();
    for (std::size_t id = 0; id < states.size(); ++id) (void)direct.reduce(states[id], g.spans[id], coll);
    direct_s.push_back(timer.stop());
  }
  const double s = bellows::bench::median(sync_s), d = bellows::bench::median(direct_s);
  const double floor_s = bellows::bench::device_read_seconds(g.source, g.total / 4 * 4);
  state.counters["sync_ms"] = s * 1e3;
  state.counters["direct_ms"] = d * 1e3;
  state.counters["overhead_pct"] = (s / d - 1) * 100;
  state.counters["x_floor"] = s / floor_s;
  state.counters["floor_ms"] = floor_s * 1e3;
}

void end_epoch(benchmark::State& state, const std::vector<bellows::shape>& shapes) {
  if (!bellows::bench::have_device(state)) return;
  using C = bellows::topk<bellows::cuda::executor>;
  bellows::cuda::executor exec;
  bellows::bench::one_rank coll;
  bellows::accordion_params params;
  params.interval = 1;
  bellows::synchronizer<C, detector, bellows::cuda::executor> sync(C({.ratio = 0.1}, exec), C({.ratio = 0.01}, exec),
                                                                   detector(params, exec), exec);
  for (std::size_t id = 0; id < shapes.size(); ++id) (void)sync.add_layer("tensor" + std::to_string(id), shapes[id]);
  const gradients g(shapes);
  g.restore();
  (void)sync.step(g.spans, coll);
  bellows::bench::event_timer timer;
  for (auto _ : state) {
    timer.start();
    (void)sync.end_epoch(0.1f, coll);
    state.SetIterationTime(timer.stop());
  }
}

const bool registered = [] {
  for (const auto& [model, shapes] : {std::pair{"mlp", &mlp}, std::pair{"8192x8192", &square}}) {
    for (const bool check : {false, true}) {
      const std::string epoch = check ? "check" : "plain", at = std::string("cuda_synchronizer/") + model + "/";
      benchmark::RegisterBenchmark((at + "powersgd-4-1/" + epoch).c_str(),
                                   [shapes = shapes, check](benchmark::State& s) {
                                     step<bellows::powersgd<bellows::cuda::executor>>(
                                         s, *shapes, bellows::powersgd_params{.rank = 4},
                                         bellows::powersgd_params{.rank = 1}, check);
                                   })
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark((at + "topk-10%-1%/" + epoch).c_str(),
                                   [shapes = shapes, check](benchmark::State& s) {
                                     step<bellows::topk<bellows::cuda::executor>>(
                                         s, *shapes, bellows::topk_params{.ratio = 0.10},
                                         bellows::topk_params{.ratio = 0.01}, check);
                                   })
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
    benchmark::RegisterBenchmark((std::string("cuda_synchronizer_end_epoch/") + model).c_str(),
                                 [shapes = shapes](benchmark::State& s) { end_epoch(s, *shapes); })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3);
  }
  return true;
}();

}  // namespace
