// SPDX-License-Identifier: Apache-2.0
// The yardstick of the CUDA benchmarks, as bench/x_floor.hpp is on the CPU: a streaming read of
// the same bytes on the device, timed with CUDA events in the same run. Each benchmark times its
// iterations with events too (Google Benchmark's manual time) and reports
//   x_floor  = (its time per iteration) / (time of one device read of the input)
//   floor_ms = that read's time
// Inputs are device buffers of seeded normal floats, made once per benchmark.
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "bellows/cuda/check.cuh"
#include "device_read.cuh"
#include "stream_floor.hpp"

namespace bellows::bench {

/// False, with the benchmark marked skipped, when there is no CUDA device.
inline bool have_device(benchmark::State& state) {
  if (cuda::device_count() > 0) return true;
  state.SkipWithError("no CUDA device");
  return false;
}

/// Runs body() once per iteration between CUDA events (manual time), then adds x_floor (the
/// median iteration over the median device read of n floats at x, measured right after, as the
/// CPU benchmarks take median over median) and floor_ms.
template <class Body>
void run_timed(benchmark::State& state, const float* x, std::size_t n, Body&& body) {
  event_timer timer;
  std::vector<double> times;
  for (auto _ : state) {
    timer.start();
    body();
    times.push_back(timer.stop());
    state.SetIterationTime(times.back());
  }
  const double floor_s = device_read_seconds(x, n);
  state.counters["x_floor"] = median(times) / floor_s;
  state.counters["floor_ms"] = floor_s * 1e3;
}

}  // namespace bellows::bench
