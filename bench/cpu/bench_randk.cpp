// SPDX-License-Identifier: Apache-2.0
// Rand-k on one thread, against a streaming read of the same bytes (x_floor). Names:
//   randk/<case>/<data>/<ratio>/n=<size>, case one of
//   plain     the draw of k indices and the gather of their values (PayloadCodec::encode)
//   residual  the same from m = g + e with the error-memory update (stage + commit; target
//             <= 3.5 x_floor at 1%: it reads g and e and writes e)
//   reduce    a whole step with residual feedback on one rank, shared mode (allreduce of k + 1)
// e.g. --benchmark_filter='randk/residual/.*/1%'
#include <bellows/compressors/randk.hpp>

#include <cstddef>
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

bellows::cpu::executor& one_thread() {
  static bellows::cpu::executor exec(1);
  return exec;
}

void randk_plain(benchmark::State& state, bench_case c) {
  const std::vector<float>& g = bellows::bench::gradient(c.n, c.data);
  const double floor_s = bellows::bench::stream_read_seconds(g);
  bellows::randk<> compressor({.ratio = c.ratio, .feedback = bellows::feedback::none}, one_thread());
  auto st = compressor.make_state({0, "bench", bellows::shape::vector(c.n)});
  std::vector<std::uint64_t> out((compressor.max_payload_bytes(st) + 7) / 8);
  const bellows::bench::stopwatch watch;
  for (auto _ : state) {
    auto payload = compressor.encode(st, g, std::as_writable_bytes(std::span(out)));
    benchmark::DoNotOptimize(payload.data());
    ++st.step;
  }
  bellows::bench::report_x_floor(state, floor_s, watch.seconds());
}

void randk_residual(benchmark::State& state, bench_case c) {
  const std::vector<float>& g = bellows::bench::gradient(c.n, c.data);
  const double floor_s = bellows::bench::stream_read_seconds(g);
  bellows::randk<> compressor({.ratio = c.ratio}, one_thread());
  auto st = compressor.make_state({0, "bench", bellows::shape::vector(c.n)});
  compressor.stage(st, g);
  compressor.commit(st);
  const bellows::bench::stopwatch watch;
  for (auto _ : state) {
    auto payload = compressor.stage(st, g);
    benchmark::DoNotOptimize(payload.data());
    compressor.commit(st);
  }
  bellows::bench::report_x_floor(state, floor_s, watch.seconds());
}

void randk_reduce(benchmark::State& state, bench_case c) {
  const std::vector<float>& g = bellows::bench::gradient(c.n, c.data);
  const double floor_s = bellows::bench::stream_read_seconds(g);
  bellows::randk<> compressor({.ratio = c.ratio}, one_thread());
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

const bool registered = [] {
  for (std::size_t n : {std::size_t{1} << 20, std::size_t{1} << 24, std::size_t{1} << 26})
    for (distribution d : {distribution::normal, distribution::heavy_tailed})
      for (double ratio : {0.01, 0.001}) {
        const bench_case c{n, d, ratio};
        const std::string tail = std::string("/") + bellows::bench::to_string(d) + "/" +
                                 (ratio >= 0.01 ? "1%" : "0.1%") + "/n=" + bellows::bench::power_of_two(n);
        auto add = [&](const std::string& name, auto fn) {
          benchmark::RegisterBenchmark(("randk/" + name + tail).c_str(), fn)
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        };
        add("plain", [c](benchmark::State& s) { randk_plain(s, c); });
        add("residual", [c](benchmark::State& s) { randk_residual(s, c); });
        add("reduce", [c](benchmark::State& s) { randk_reduce(s, c); });
      }
  return true;
}();

}  // namespace
