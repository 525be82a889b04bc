// SPDX-License-Identifier: Apache-2.0
// The floor every measurement is compared with: a streaming read of the same bytes, timed in the
// same run, and a stopwatch. No dependency on Google Benchmark, so tools can share it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <span>
#include <vector>

namespace bellows::bench {

/// Sums `data` with eight independent accumulators (enough to keep the loads streaming); the
/// result is stored to a volatile so the read cannot be elided.
inline void stream_read(std::span<const float> data) {
  float acc[8] = {};
  const std::size_t n = data.size() / 8 * 8;
  for (std::size_t i = 0; i < n; i += 8)
    for (std::size_t j = 0; j < 8; ++j) acc[j] += data[i + j];
  for (std::size_t i = n; i < data.size(); ++i) acc[0] += data[i];
  volatile float sink = acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
  (void)sink;
}

/// The median of `v` (reordered).
[[nodiscard]] inline double median(std::vector<double>& v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
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
  return median(t);
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

}  // namespace bellows::bench
