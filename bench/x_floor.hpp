// SPDX-License-Identifier: Apache-2.0
// The yardstick of every CPU benchmark: a streaming read of the same bytes, timed in the same run.
// A benchmark measures the floor once for its input, times its loop with a stopwatch, then reports
//   x_floor  = (its time per iteration) / (time of one streaming read of the input)
//   floor_ms = that read's time
// beside Google Benchmark's own absolute time. Ratios survive a noisy, shared machine; absolute
// times do not.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <span>
#include <vector>

namespace bellows::bench {

/// Sums `data` with eight independent accumulators (enough to keep the loads streaming); the
/// result goes through DoNotOptimize so the read cannot be elided.
inline void stream_read(std::span<const float> data) {
  float acc[8] = {};
  const std::size_t n = data.size() / 8 * 8;
  for (std::size_t i = 0; i < n; i += 8)
    for (std::size_t j = 0; j < 8; ++j) acc[j] += data[i + j];
  for (std::size_t i = n; i < data.size(); ++i) acc[0] += data[i];
  benchmark::DoNotOptimize(acc);
}

/// Median seconds of `repeats` streaming reads of `data` on one thread (after one warm-up read).
inline double stream_read_seconds(std::span<const float> data, int repeats = 7) {
  std::vector<double> t(static_cast<std::size_t>(repeats));
  stream_read(data);
  for (double& s : t) {
    const auto start = std::chrono::steady_clock::now();
    stream_read(data);
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::nth_element(t.begin(), t.begin() + repeats / 2, t.end());
  return t[static_cast<std::size_t>(repeats / 2)];
}

/// Wall time since construction; start one right before the benchmark loop.
class stopwatch {
public:
  [[nodiscard]] double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

/// Adds the x_floor and floor_ms counters after a benchmark loop that took `loop_seconds` of
/// wall time (from a stopwatch started right before it).
inline void report_x_floor(benchmark::State& state, double floor_seconds, double loop_seconds) {
  const double per_iteration = loop_seconds / static_cast<double>(state.iterations());
  state.counters["x_floor"] = per_iteration / floor_seconds;
  state.counters["floor_ms"] = floor_seconds * 1e3;
}

}  // namespace bellows::bench
