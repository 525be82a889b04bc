// SPDX-License-Identifier: Apache-2.0
// The yardstick of every CPU benchmark: a streaming read of the same bytes, timed in the same run.
// run_against_floor times each iteration of a benchmark loop and, after it (outside Google
// Benchmark's clock), one streaming read of the input, then reports
//   x_floor  = median iteration time / median read time
//   floor_ms = that median read time
// beside Google Benchmark's own absolute time. The reads interleave with the iterations, so a
// shared machine whose load changes during the run slows both alike; ratios survive that noise,
// absolute times do not.
#pragma once

#include <benchmark/benchmark.h>

#include <cstddef>
#include <span>
#include <vector>

#include "stream_floor.hpp"

namespace bellows::bench {

/// Runs the benchmark loop: per iteration step() (timed), then one read of `data` and prepare()
/// (both untimed: prepare restores what step consumed, e.g. an input it overwrites).
template <class Step, class Prepare = void (*)()>
void run_against_floor(
    benchmark::State& state, std::span<const float> data, Step&& step, Prepare&& prepare = [] {}) {
  std::vector<double> steps, reads;
  steps.reserve(4096);
  reads.reserve(4096);
  stream_read(data);
  prepare();
  for (auto _ : state) {
    const stopwatch step_watch;
    step();
    steps.push_back(step_watch.seconds());
    state.PauseTiming();
    const stopwatch read_watch;
    stream_read(data);
    reads.push_back(read_watch.seconds());
    prepare();
    state.ResumeTiming();
  }
  if (steps.empty()) return;
  const double floor_s = median(reads);
  state.counters["x_floor"] = median(steps) / floor_s;
  state.counters["floor_ms"] = floor_s * 1e3;
}

}  // namespace bellows::bench
