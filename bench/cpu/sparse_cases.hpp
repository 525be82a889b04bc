// SPDX-License-Identifier: Apache-2.0
// The cases of the sparsification benchmarks (bench_topk, bench_randk): seeded gradient-like
// data generated once per process, the timed steps every sparse compressor shares, and their
// registration under names like "topk/exact/normal/1%/n=2^24".
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <bellows/concepts.hpp>
#include <bellows/cpu/executor.hpp>

#include "x_floor.hpp"

namespace bellows::bench {

enum class distribution : int {
  normal,        ///< N(0, 1)
  heavy_tailed,  ///< Student's t with 2 degrees of freedom (infinite variance)
};

/// n floats of the distribution, the same on every call (cached: large n takes seconds).
inline const std::vector<float>& gradient(std::size_t n, distribution d) {
  static std::map<std::pair<std::size_t, int>, std::vector<float>> cache;
  std::vector<float>& v = cache[{n, static_cast<int>(d)}];
  if (v.size() != n) {
    v.resize(n);
    std::mt19937_64 rng(n * 2 + static_cast<std::uint64_t>(d));
    if (d == distribution::normal) {
      std::normal_distribution<float> normal;
      for (float& x : v) x = normal(rng);
    } else {
      std::student_t_distribution<float> student(2.0f);
      for (float& x : v) x = student(rng);
    }
  }
  return v;
}

/// One benchmark case: layer size, data, kept fraction.
struct sparse_case {
  std::size_t n;
  distribution data;
  double ratio;

  [[nodiscard]] const std::vector<float>& grad() const { return gradient(n, data); }
  [[nodiscard]] layer_info layer() const { return {0, "bench", shape::vector(n)}; }
};

/// The executor of the single-thread targets.
inline cpu::executor& one_thread() {
  static cpu::executor exec(1);
  return exec;
}

/// Times `step()` once per iteration against reads of the case's data (run_against_floor).
template <class Step>
void time_loop(benchmark::State& state, const sparse_case& c, Step&& step) {
  run_against_floor(state, c.grad(), step);
}

/// The PayloadCodec encode of the case's data (no memory); `advance` steps the state on.
template <class C>
void encode_step(benchmark::State& state, const sparse_case& c, C compressor, bool advance) {
  auto st = compressor.make_state(c.layer());
  std::vector<std::uint64_t> out((compressor.max_payload_bytes(st) + 7) / 8);
  time_loop(state, c, [&] {
    auto payload = compressor.encode(st, c.grad(), std::as_writable_bytes(std::span(out)));
    benchmark::DoNotOptimize(payload.data());
    st.step += advance;
  });
}

/// stage + commit from a memory that is not all zeros: read g and e, write e, the payload.
template <class C>
void feedback_step(benchmark::State& state, const sparse_case& c, C compressor) {
  auto st = compressor.make_state(c.layer());
  compressor.stage(st, c.grad());
  compressor.commit(st);
  time_loop(state, c, [&] {
    auto payload = compressor.stage(st, c.grad());
    benchmark::DoNotOptimize(payload.data());
    compressor.commit(st);
  });
}

/// A whole reduce on one rank; the copy that restores the input is not timed.
template <class C>
void reduce_step(benchmark::State& state, const sparse_case& c, C compressor) {
  const std::vector<float>& g = c.grad();
  auto st = compressor.make_state(c.layer());
  std::vector<float> x = g;
  archetypes::alltoall_collective solo;
  run_against_floor(
      state, g, [&] { benchmark::DoNotOptimize(compressor.reduce(st, x, solo)); },
      [&] { std::copy(g.begin(), g.end(), x.begin()); });
}

/// "2^24" for 16777216.
[[nodiscard]] inline std::string power_of_two(std::size_t n) {
  int p = 0;
  while ((std::size_t{1} << p) < n) ++p;
  return "2^" + std::to_string(p);
}

/// Registers `prefix/<method>/<data>/<ratio>/n=<size>` for every method, for n = 2^20, 2^24 and
/// 2^26, normal and heavy-tailed data, and ratios 1% and 0.1%.
inline void register_cases(
    const std::string& prefix,
    const std::vector<std::pair<std::string, std::function<void(benchmark::State&, const sparse_case&)>>>& methods) {
  for (std::size_t n : {std::size_t{1} << 20, std::size_t{1} << 24, std::size_t{1} << 26})
    for (distribution d : {distribution::normal, distribution::heavy_tailed})
      for (double ratio : {0.01, 0.001}) {
        const sparse_case c{n, d, ratio};
        const std::string tail = std::string(d == distribution::normal ? "/normal/" : "/heavy/") +
                                 (ratio >= 0.01 ? "1%" : "0.1%") + "/n=" + power_of_two(n);
        for (const auto& [name, run] : methods)
          benchmark::RegisterBenchmark((prefix + "/" + name + tail).c_str(),
                                       [c, run](benchmark::State& s) { run(s, c); })
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
      }
}

}  // namespace bellows::bench
