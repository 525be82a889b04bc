// SPDX-License-Identifier: Apache-2.0
// What bellows::synchronizer costs beyond the compressors it runs, on the layers of the
// Fashion-MNIST example's MLP (784-256-128-10: three weights, three biases), one thread and the
// archetype collective (W = 1, no transport), so that what is left is the synchronizer's
// bookkeeping and the detector. The synchronizer runs the compressors through a wrapper that
// clocks every reduce call, so one step splits into the time inside the compressors and the rest,
// on the same memory in the same run; medians over the steps. Names:
//   synchronizer/<method>/<epoch>
//     method  powersgd-r4 (rank 4) or topk-1% (ratio 0.01)
//     epoch   plain: an epoch without a check (the detector does nothing)
//             check: a check epoch (every rank's finiteness agreed, the gradient accumulated)
// Counters: compressors_us (time inside reduce per step), synchronizer_us (the whole step),
// overhead_pct = (synchronizer_us / compressors_us - 1) * 100 (target < 2), direct_us (the same
// compressors called directly on their own states and buffers, alternating with the synchronizer
// step: a cross-check, off from compressors_us by memory placement alone), and x_floor and
// floor_ms of the synchronizer step against one streaming read of all the gradients.
//
//   synchronizer-resnet50/<method>/<exchange>/threads:<t>
//     the whole step of ResNet-50's 161 tensors (25.6 M parameters) at W = 1 (the archetype
//     collective), a static policy, t threads; exchange `buckets` (the own buckets of 25 MiB, on
//     the phases) or `layers` (a layer per bucket: each layer's reduce, the step before buckets).
//     Counters: step_ms (median over the steps), x_floor and floor_ms against one streaming read
//     of all the gradients.
#include <bellows/compressors/powersgd.hpp>
#include <bellows/compressors/topk.hpp>
#include <bellows/compressors/qsgd.hpp>
#include <bellows/compressors/signsgd.hpp>
#include <bellows/regime/accordion.hpp>
#include <bellows/regime/static_policy.hpp>
#include <bellows/sync/synchronizer.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "bellows-bench/models.hpp"
#include "cpu/sparse_cases.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

/// The MLP's tensors in the order the example registers them.
const std::array<bellows::shape, 6> mlp_shapes{bellows::shape{256, 784}, bellows::shape{256},
                                               bellows::shape{128, 256}, bellows::shape{128},
                                               bellows::shape{10, 128},  bellows::shape{10}};

[[nodiscard]] double since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

/// A compressor that forwards to C and adds the time of every reduce call to *inside.
template <class C>
struct clocked {
  using state = typename C::state;
  C inner;
  double* inside;

  [[nodiscard]] state make_state(const bellows::layer_info& layer) const { return inner.make_state(layer); }
  [[nodiscard]] bellows::exchange_rounds rounds(const state& st, std::size_t ranks) const {
    return inner.rounds(st, ranks);
  }
  // (clang-format-14 would join the requires clause to the declaration)
  // clang-format off
  [[nodiscard]] bool compresses(const state& st) const
    requires requires(const C& c) { c.compresses(st); }
  {
    return inner.compresses(st);
  }
  // clang-format on
  template <bellows::Collective Coll>
  bellows::reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    const auto start = clock_type::now();
    const bellows::reduce_result r = inner.reduce(st, inout, coll);
    *inside += since(start);
    return r;
  }
};

template <class C>
void compare(benchmark::State& state, const C& compressor, bool check_epoch) {
  bellows::archetypes::collective coll;
  bellows::cpu::executor& exec = bellows::bench::one_thread();
  // A check epoch: interval 1 and epoch 0 in progress. A plain one: epoch 1 of interval 10^6.
  bellows::accordion_params params;
  params.interval = check_epoch ? 1 : 1'000'000;
  double inside = 0;
  bellows::synchronizer sync(clocked<C>{compressor, &inside}, clocked<C>{compressor, &inside},
                             bellows::accordion(params, exec), exec);
  C direct = compressor;
  std::vector<typename C::state> states;
  std::vector<std::vector<float>> source, mine, theirs;
  std::size_t offset = 0;
  const std::vector<float>& data = bellows::bench::gradient(std::size_t{1} << 18, bellows::bench::distribution::normal);
  for (std::size_t id = 0; id < mlp_shapes.size(); ++id) {
    std::string name = "tensor";
    name += std::to_string(id);
    states.push_back(direct.make_state({static_cast<std::uint32_t>(id), name, mlp_shapes[id]}));
    (void)sync.add_layer(name, mlp_shapes[id]);
    const std::size_t n = mlp_shapes[id].size();
    source.emplace_back(data.begin() + static_cast<std::ptrdiff_t>(offset),
                        data.begin() + static_cast<std::ptrdiff_t>(offset + n));
    offset += n;
  }
  mine = source;
  theirs = source;
  const std::vector<std::span<float>> grads(theirs.begin(), theirs.end());
  if (!check_epoch) (void)sync.end_epoch(0.1f, coll);

  const auto restore = [&](std::vector<std::vector<float>>& to) {
    for (std::size_t id = 0; id < source.size(); ++id) std::ranges::copy(source[id], to[id].begin());
  };
  std::vector<double> direct_s, sync_s, inside_s;
  for (auto _ : state) {
    restore(theirs);
    inside = 0;
    const auto start = clock_type::now();
    (void)sync.step(grads, coll);
    sync_s.push_back(since(start));
    inside_s.push_back(inside);
    restore(mine);
    const auto direct_start = clock_type::now();
    for (std::size_t id = 0; id < states.size(); ++id) (void)direct.reduce(states[id], mine[id], coll);
    direct_s.push_back(since(direct_start));
  }
  const double s = bellows::bench::median(sync_s), in = bellows::bench::median(inside_s);
  const double floor_s = bellows::bench::stream_read_seconds(std::span<const float>(data.data(), offset));
  state.counters["compressors_us"] = in * 1e6;
  state.counters["synchronizer_us"] = s * 1e6;
  state.counters["overhead_pct"] = (s / in - 1) * 100;
  state.counters["direct_us"] = bellows::bench::median(direct_s) * 1e6;
  state.counters["x_floor"] = s / floor_s;
  state.counters["floor_ms"] = floor_s * 1e3;
}

/// The executors of the ResNet-50 cases, by thread count.
bellows::cpu::executor& threads(std::size_t t) {
  static bellows::cpu::executor two(2);
  return t == 1 ? bellows::bench::one_thread() : two;
}

template <class C>
void resnet_step(benchmark::State& state, const C& compressor, bool bucketed, bellows::cpu::executor& exec) {
  bellows::archetypes::collective coll;
  bellows::synchronizer sync(compressor, compressor, bellows::static_policy(bellows::regime::critical), exec);
  if (!bucketed) sync.set_bucket_bytes(0);
  std::vector<std::vector<float>> source, grads;
  std::size_t total = 0;
  for (const bellows::layer_info& l : bellows::tool::resnet50()) {
    (void)sync.add_layer(l.name, l.shape);
    total += l.size();
  }
  const std::vector<float>& data = bellows::bench::gradient(total, bellows::bench::distribution::normal);
  std::size_t offset = 0;
  for (std::size_t id = 0; id < sync.layers(); ++id) {
    const std::size_t n = sync.layer(id).size();
    source.emplace_back(data.begin() + static_cast<std::ptrdiff_t>(offset),
                        data.begin() + static_cast<std::ptrdiff_t>(offset + n));
    offset += n;
  }
  grads = source;
  const std::vector<std::span<float>> views(grads.begin(), grads.end());
  std::vector<double> step_s;
  for (auto _ : state) {
    state.PauseTiming();
    for (std::size_t id = 0; id < source.size(); ++id) std::ranges::copy(source[id], grads[id].begin());
    state.ResumeTiming();
    const auto start = clock_type::now();
    (void)sync.step(views, coll);
    step_s.push_back(since(start));
  }
  const double s = bellows::bench::median(step_s);
  const double floor_s = bellows::bench::stream_read_seconds(std::span<const float>(data));
  state.counters["step_ms"] = s * 1e3;
  state.counters["x_floor"] = s / floor_s;
  state.counters["floor_ms"] = floor_s * 1e3;
}

template <class Make>
void register_resnet(const std::string& method, Make make) {
  for (const std::size_t t : {1u, 2u})
    for (const bool bucketed : {false, true})
      benchmark::RegisterBenchmark(
          ("synchronizer-resnet50/" + method + (bucketed ? "/buckets" : "/layers") + "/threads:" + std::to_string(t))
              .c_str(),
          [=](benchmark::State& s) { resnet_step(s, make(threads(t)), bucketed, threads(t)); })
          ->MinTime(2.0)
          ->UseRealTime();
}

const bool registered = [] {
  register_resnet("powersgd-r4", [](bellows::cpu::executor& e) { return bellows::powersgd<>({.rank = 4}, e); });
  register_resnet("topk-1%", [](bellows::cpu::executor& e) { return bellows::topk<>({.ratio = 0.01}, e); });
  register_resnet("qsgd-8", [](bellows::cpu::executor& e) { return bellows::qsgd<>({.bits = 8}, e); });
  register_resnet("signsgd", [](bellows::cpu::executor& e) { return bellows::signsgd<>({}, e); });
  for (const bool check : {false, true}) {
    const std::string epoch = check ? "check" : "plain";
    benchmark::RegisterBenchmark(("synchronizer/powersgd-r4/" + epoch).c_str(), [check](benchmark::State& s) {
      compare(s, bellows::powersgd<>({.rank = 4}, bellows::bench::one_thread()), check);
    })->MinTime(1.0);
    benchmark::RegisterBenchmark(("synchronizer/topk-1%/" + epoch).c_str(), [check](benchmark::State& s) {
      compare(s, bellows::topk<>({.ratio = 0.01}, bellows::bench::one_thread()), check);
    })->MinTime(1.0);
  }
  return true;
}();

}  // namespace
