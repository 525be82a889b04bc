// SPDX-License-Identifier: Apache-2.0
// The device read that the CUDA benchmarks and bellows-bench --backend cuda measure against (a
// streaming read of the same bytes, timed with CUDA events), the events themselves, and seeded
// normal inputs in device memory. Free of Google Benchmark, so a tool can use it
// (bench/cuda/device_floor.cuh adds the benchmarks' side).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <random>
#include <vector>

#include "bellows/cuda/check.cuh"
#include "stream_floor.hpp"

namespace bellows::bench {

/// Sums x with 16-byte loads; the sum goes to *sink so the read cannot be elided.
template <class Float>
__global__ void device_read_kernel(const Float* x, std::size_t n, Float* sink) {
  Float acc = 0;
  const std::size_t quads = n / 4, stride = std::size_t{gridDim.x} * blockDim.x;
  for (std::size_t q = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; q < quads; q += stride) {
    const float4 v = reinterpret_cast<const float4*>(x)[q];
    acc += (v.x + v.y) + (v.z + v.w);
  }
  if (acc == 12345.678f) *sink = acc;  // practically never true; the compiler cannot know
}

/// A pair of CUDA events around work on a stream.
class event_timer {
public:
  event_timer() {
    BELLOWS_CUDA_CHECK(cudaEventCreate(&start_));
    BELLOWS_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  event_timer(const event_timer&) = delete;
  event_timer& operator=(const event_timer&) = delete;
  ~event_timer() {
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(stop_);
  }
  void start(cudaStream_t s = nullptr) { BELLOWS_CUDA_CHECK(cudaEventRecord(start_, s)); }
  /// Seconds since start(), after waiting for the stop event.
  double stop(cudaStream_t s = nullptr) {
    BELLOWS_CUDA_CHECK(cudaEventRecord(stop_, s));
    BELLOWS_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    BELLOWS_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1e-3;
  }

private:
  cudaEvent_t start_{}, stop_{};
};

/// Median seconds of `repeats` device reads of n floats at x (n a multiple of 4, x 16-byte aligned).
inline double device_read_seconds(const float* x, std::size_t n, int repeats = 9) {
  float* sink = nullptr;
  BELLOWS_CUDA_CHECK(cudaMalloc(&sink, sizeof(float)));
  int sms = 0;
  BELLOWS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  event_timer timer;
  std::vector<double> t(static_cast<std::size_t>(repeats) + 1);
  for (double& s : t) {  // the first is a warm-up
    timer.start();
    device_read_kernel<<<static_cast<unsigned>(sms) * 8, 256>>>(x, n, sink);
    s = timer.stop();
  }
  BELLOWS_CUDA_CHECK(cudaFree(sink));
  t.erase(t.begin());
  return median(t);
}

/// n seeded normal floats in device memory (freed by the caller with cudaFree).
inline float* device_normals(std::size_t n, unsigned seed) {
  std::vector<float> h(n);
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  for (float& x : h) x = d(gen);
  float* p = nullptr;
  BELLOWS_CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
  BELLOWS_CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  return p;
}

}  // namespace bellows::bench
