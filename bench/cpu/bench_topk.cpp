// SPDX-License-Identifier: Apache-2.0
// Top-k on one thread, against a streaming read of the same bytes (x_floor), with the
// std::nth_element and std::sort baselines in the same run. Names:
//   topk/<case>/<data>/<ratio>/n=<size>, case one of
//   exact     selection and encoding of g (PayloadCodec::encode; target <= 3.0 x_floor)
//   residual  the same from m = g + e with the error-memory update (stage + commit; <= 4.5)
//   reduce    a whole step with residual feedback on one rank (selection, payload, output)
//   nth_element, sort   baselines: |x| copied, then the k-th largest found
// e.g. --benchmark_filter='topk/(exact|nth_element)/normal/1%/n=2\^24'
#include <bellows/compressors/topk.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "cpu/gradient_data.hpp"
#include "x_floor.hpp"

namespace {

using bellows::bench::distribution;

struct bench_case {
  std::size_t n;
  distribution data;
  double ratio;
};

std::string ratio_name(double ratio) { return ratio >= 0.01 ? "1%" : "0.1%"; }

bellows::cpu::executor& one_thread() {
  static bellows::cpu::executor exec(1);
  return exec;
}

void topk_exact(benchmark::State& state, bench_case c) {
  const std::vector<float>& g = bellows::bench::gradient(c.n, c.data);
  const double floor_s = bellows::bench::stream_read_seconds(g);
  bellows::topk<> compressor({.ratio = c.ratio, .feedback = bellows::feedback::none}, one_thread());
  auto st = compressor.make_state({0, "bench", bellows::shape::vector(c.n)});
  std::vector<std::uint64_t> out((compressor.max_payload_bytes(st) + 7) / 8);
  const bellows::bench::stopwatch watch;
  for (auto _ : state) {
    auto payload = compressor.encode(st, g, std::as_writable_bytes(std::span(out)));
    benchmark::DoNotOptimize(payload.data());
  }
  bellows::bench::report_x_floor(state, floor_s, watch.seconds());
}

void topk_residual(benchmark::State& state, bench_case c) {
  const std::vector<float>& g = bellows::bench::gradient(c.n, c.data);
  const double floor_s = bellows::bench::stream_read_seconds(g);
  bellows::topk<> compressor({.ratio = c.ratio}, one_thread());
  auto st = compressor.make_state({0, "bench", bellows::shape::vector(c.n)});
  compressor.stage(st, g);  // a memory that is not all zeros
  compressor.commit(st);
  const bellows::bench::stopwatch watch;
  for (auto _ : state) {
    auto payload = compressor.stage(st, g);
    benchmark::DoNotOptimize(payload.data());
    compressor.commit(st);
  }
  bellows::bench::report_x_floor(state, floor_s, watch.seconds());
}

void topk_reduce(benchmark::State& state, bench_case c) {
  const std::vector<float>& g = bellows::bench::gradient(c.n, c.data);
  const double floor_s = bellows::bench::stream_read_seconds(g);
  bellows::topk<> compressor({.ratio = c.ratio}, one_thread());
  auto st = compressor.make_state({0, "bench", bellows::shape::vector(c.n)});
  std::vector<float> x = g;
  bellows::archetypes::collective solo;
  double seconds = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::copy(g.begin(), g.end(), x.begin());
    state.ResumeTiming();
    const bellows::bench::stopwatch watch;
    auto r = compressor.reduce(st, x, solo);
    seconds += watch.seconds();
    benchmark::DoNotOptimize(r);
  }
  bellows::bench::report_x_floor(state, floor_s, seconds);
}

/// |x| into a scratch copy, then the k-th largest of it by `find`.
void baseline(benchmark::State& state, bench_case c, bool sort) {
  const std::vector<float>& g = bellows::bench::gradient(c.n, c.data);
  const double floor_s = bellows::bench::stream_read_seconds(g);
  const auto k = static_cast<std::ptrdiff_t>(std::ceil(c.ratio * static_cast<double>(c.n)));
  std::vector<float> magnitude(c.n);
  const bellows::bench::stopwatch watch;
  for (auto _ : state) {
    std::transform(g.begin(), g.end(), magnitude.begin(), [](float v) { return std::abs(v); });
    if (sort)
      std::sort(magnitude.begin(), magnitude.end(), std::greater<>());
    else
      std::nth_element(magnitude.begin(), magnitude.begin() + (k - 1), magnitude.end(), std::greater<>());
    benchmark::DoNotOptimize(magnitude[static_cast<std::size_t>(k - 1)]);
  }
  bellows::bench::report_x_floor(state, floor_s, watch.seconds());
}

const bool registered = [] {
  for (std::size_t n : {std::size_t{1} << 20, std::size_t{1} << 24, std::size_t{1} << 26})
    for (distribution d : {distribution::normal, distribution::heavy_tailed})
      for (double ratio : {0.01, 0.001}) {
        const bench_case c{n, d, ratio};
        const std::string tail = std::string("/") + bellows::bench::to_string(d) + "/" +
                                 ratio_name(ratio) + "/n=" + bellows::bench::power_of_two(n);
        auto add = [&](const std::string& name, auto fn) {
          benchmark::RegisterBenchmark(("topk/" + name + tail).c_str(), fn)
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        };
        add("exact", [c](benchmark::State& s) { topk_exact(s, c); });
        add("residual", [c](benchmark::State& s) { topk_residual(s, c); });
        add("reduce", [c](benchmark::State& s) { topk_reduce(s, c); });
        add("nth_element", [c](benchmark::State& s) { baseline(s, c, false); });
        add("sort", [c](benchmark::State& s) { baseline(s, c, true); });
      }
  return true;
}();

}  // namespace
