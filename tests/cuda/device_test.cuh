// SPDX-License-Identifier: Apache-2.0
// What the CUDA tests share: the skip when there is no device, device arrays filled from and
// read back into host vectors, and a state's error memory read back (synchronous copies: tests
// may wait, the library may not).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include "bellows/cpu/float_array.hpp"
#include "bellows/cuda/buffer.cuh"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/float_array.cuh"
#include "bellows/feedback/error_feedback.hpp"

namespace bellows::test {

/// True when no CUDA device is present: a test case that needs one is declared
/// `TEST_CASE("..." * doctest::skip(bellows::test::no_device()))`, so that doctest reports it
/// skipped, and ctest reports a test binary whose every case skipped as skipped
/// (tests/CMakeLists.txt), never as passed.
inline bool no_device() {
  static const bool none = bellows::cuda::device_count() == 0;
  return none;
}

/// True when a and b hold the same bytes (floats: the same bits, NaN included).
template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/// The device's draw of normals against the CPU's: the same bits where both use one libm (the
/// emulation), else within a float ulp or so (tests/cuda/test_philox.cu).
inline bool same_draw(const std::vector<float>& got, const std::vector<float>& want) {
#if defined(__CUDACC__)
  if (got.size() != want.size()) return false;
  for (std::size_t t = 0; t < got.size(); ++t)
    if (!(std::abs(got[t] - want[t]) <= 1e-6f * (1 + std::abs(want[t])))) return false;
  return true;
#else
  return bellows::test::same_bytes(got, want);
#endif
}

/// Floats in device memory, copied back after the device's work.
inline std::vector<float> device_values(std::span<const float> d) {
  std::vector<float> out(d.size());
  BELLOWS_CUDA_CHECK(cudaDeviceSynchronize());
  if (!out.empty())
    BELLOWS_CUDA_CHECK(cudaMemcpy(out.data(), d.data(), out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}

/// A device float_array (PowerSGD's memory or query), copied back.
inline std::vector<float> memory_of(const cuda::float_array& a) { return device_values(a.span()); }
/// A device error memory of a state written once over the executor, copied back.
inline std::vector<float> memory_of(const layer_memory<cuda::executor>& m) { return device_values(m.values()); }

/// A host float_array of a CPU state, as a vector.
inline std::vector<float> memory_of(const cpu::float_array& a) { return {a.span().begin(), a.span().end()}; }

/// A device array of T that owns its memory.
template <class T>
class device_array {
public:
  explicit device_array(std::size_t n) : n_(n) {
    if (n_ != 0) BELLOWS_CUDA_CHECK(cudaMalloc(&p_, n_ * sizeof(T)));
  }
  explicit device_array(const std::vector<T>& host) : device_array(host.size()) {
    if (n_ != 0) BELLOWS_CUDA_CHECK(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() { (void)cudaFree(p_); }

  [[nodiscard]] std::span<T> span() const noexcept { return {p_, n_}; }
  [[nodiscard]] T* data() const noexcept { return p_; }
  /// Waits for the device, then copies the array back.
  [[nodiscard]] std::vector<T> host() const {
    std::vector<T> out(n_);
    BELLOWS_CUDA_CHECK(cudaDeviceSynchronize());
    if (n_ != 0) BELLOWS_CUDA_CHECK(cudaMemcpy(out.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }

private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace bellows::test
