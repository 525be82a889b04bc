// SPDX-License-Identifier: Apache-2.0
// The yardstick of every CPU benchmark: a streaming read of the same bytes, timed in the same run.
// A benchmark measures the floor once for its input, times its loop with a stopwatch, then reports
//   x_floor  = (its time per iteration) / (time of one streaming read of the input)
//   floor_ms = that read's time
// beside Google Benchmark's own absolute time. Ratios survive a noisy, shared machine; absolute
// times do not.
#pragma once

#include <benchmark/benchmark.h>

#include "stream_floor.hpp"

namespace bellows::bench {

/// Adds the x_floor and floor_ms counters after a benchmark loop that took `loop_seconds` of
/// wall time (from a stopwatch started right before it).
inline void report_x_floor(benchmark::State& state, double floor_seconds, double loop_seconds) {
  const double per_iteration = loop_seconds / static_cast<double>(state.iterations());
  state.counters["x_floor"] = per_iteration / floor_seconds;
  state.counters["floor_ms"] = floor_seconds * 1e3;
}

}  // namespace bellows::bench
