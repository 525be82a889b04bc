// SPDX-License-Identifier: Apache-2.0
// What bellows::synchronizer costs beyond the compressors it runs: the same compressors on the
// same layers (the Fashion-MNIST example's MLP, 784-256-128-10: three weights and three biases),
// once called directly and once through a synchronizer with the Accordion detector, on one thread
// and the archetype collective (W = 1, no transport), so the difference is the synchronizer's
// bookkeeping and the detector. Each iteration times one direct step and one synchronizer step
// on copies of the same gradients (alternating which goes first), so the machine's noise hits
// both alike; medians over the iterations. Names:
//   synchronizer/<method>/<epoch>
//     method  powersgd-r4 (rank 4) or topk-1% (ratio 0.01)
//     epoch   plain: an epoch without a check (the detector does nothing)
//             check: a check epoch (every rank's finiteness agreed, the gradient accumulated)
// Counters: compressors_us and synchronizer_us (median step times), overhead_pct =
// (synchronizer_us / compressors_us - 1) * 100 (target < 2), x_floor and floor_ms of the
// synchronizer step against one streaming read of all the gradients.
#include <bellows/compressors/powersgd.hpp>
#include <bellows/compressors/topk.hpp>
#include <bellows/regime/accordion.hpp>
#include <bellows/sync/synchronizer.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "cpu/sparse_cases.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

/// The MLP's tensors in the order the example registers them.
const std::array<bellows::shape, 6> mlp_shapes{bellows::shape{256, 784}, bellows::shape{256},
                                               bellows::shape{128, 256}, bellows::shape{128},
                                               bellows::shape{10, 128},  bellows::shape{10}};

[[nodiscard]] double median(std::vector<double>& v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

template <class C>
void compare(benchmark::State& state, const C& compressor, bool check_epoch) {
  bellows::archetypes::collective coll;
  bellows::cpu::executor& exec = bellows::bench::one_thread();
  // A check epoch: interval 1 and epoch 0 in progress. A plain one: epoch 1 of interval 10^6.
  bellows::accordion_params params;
  params.interval = check_epoch ? 1 : 1'000'000;
  bellows::synchronizer sync(compressor, compressor, bellows::accordion(params, exec), exec);
  C direct = compressor;
  std::vector<typename C::state> states;
  std::vector<std::vector<float>> source, mine, theirs;
  std::size_t offset = 0, total = 0;
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
    total += n;
  }
  mine = source;
  theirs = source;
  std::vector<std::span<float>> grads(theirs.begin(), theirs.end());
  if (!check_epoch) (void)sync.end_epoch(0.1f, coll);

  const auto restore = [&](std::vector<std::vector<float>>& to) {
    for (std::size_t id = 0; id < source.size(); ++id) std::ranges::copy(source[id], to[id].begin());
  };
  const auto time_direct = [&] {
    restore(mine);
    const auto start = clock_type::now();
    for (std::size_t id = 0; id < states.size(); ++id) (void)direct.reduce(states[id], mine[id], coll);
    return std::chrono::duration<double>(clock_type::now() - start).count();
  };
  const auto time_sync = [&] {
    restore(theirs);
    const auto start = clock_type::now();
    (void)sync.step(grads, coll);
    return std::chrono::duration<double>(clock_type::now() - start).count();
  };
  std::vector<double> direct_s, sync_s;
  direct_s.reserve(1 << 16);
  sync_s.reserve(1 << 16);
  bool direct_first = true;
  for (auto _ : state) {
    if (direct_first) {
      direct_s.push_back(time_direct());
      sync_s.push_back(time_sync());
    } else {
      sync_s.push_back(time_sync());
      direct_s.push_back(time_direct());
    }
    direct_first = !direct_first;
  }
  const double d = median(direct_s), s = median(sync_s);
  const double floor_s = bellows::bench::stream_read_seconds(std::span<const float>(data.data(), total));
  state.counters["compressors_us"] = d * 1e6;
  state.counters["synchronizer_us"] = s * 1e6;
  state.counters["overhead_pct"] = (s / d - 1) * 100;
  state.counters["x_floor"] = s / floor_s;
  state.counters["floor_ms"] = floor_s * 1e3;
}

const bool registered = [] {
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
