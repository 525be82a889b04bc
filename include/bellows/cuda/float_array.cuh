// SPDX-License-Identifier: Apache-2.0
// The device's float array (plan/float_array.hpp): device memory, read on the host by a copy
// that waits for the stream; and the L2 norm in the CPU's order (cpu/float_array.hpp). With them
// the device backend is complete: cuda::executor is checked against the Executor concept here.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "bellows/concepts.hpp"
#include "bellows/core/error.hpp"
#include "bellows/cuda/buffer.cuh"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/launch.cuh"
#include "bellows/plan/float_array.hpp"

namespace bellows::cuda {

namespace detail {

/// *out = sqrt(sum of x_i^2 in double, index order) / divisor, as cpu::mean_norm: one thread,
/// since the order is sequential (a square of a float is exact in double, so the fused
/// multiply-add nvcc may form rounds as the CPU's product and sum).
__global__ void mean_norm_kernel(const float* x, std::size_t n, double divisor, float* out) {
  if (divisor == 0.0) {
    *out = 0.0f;
    return;
  }
  double squares = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double v = x[i];
    squares += v * v;
  }
  *out = static_cast<float>(sqrt(squares) / divisor);
}

}  // namespace detail

/// n floats in device memory, zero when made (the clearing enqueued on the executor's stream).
class float_array {
public:
  float_array() = default;
  float_array(executor& exec, std::size_t n) : values_(n) {
    if (n != 0) BELLOWS_CUDA_CHECK(cudaMemsetAsync(values_.data(), 0, n * sizeof(float), exec.stream()));
  }

  [[nodiscard]] std::span<float> span() noexcept { return values_.span(); }
  [[nodiscard]] std::span<const float> span() const noexcept { return values_.span(); }
  [[nodiscard]] std::size_t size() const noexcept { return values_.size(); }

  /// The values copied into `staging` (grown to size() if smaller: allocates only then) after
  /// the work enqueued before on the executor's stream: waits for the stream.
  std::span<const float> host(executor& exec, std::vector<float>& staging) const {
    if (staging.size() < size()) staging.resize(size());
    if (size() != 0)
      BELLOWS_CUDA_CHECK(cudaMemcpyAsync(staging.data(), values_.data(), size() * sizeof(float), cudaMemcpyDeviceToHost,
                                         exec.stream()));
    exec.synchronize();
    return {staging.data(), size()};
  }

  /// Enqueues the copy of the values into `to` (pinned host memory of size() values, a
  /// host_values<float>), complete once the executor's synchronize() returns: no wait here.
  template <class Host>
  void send(executor& exec, Host& to) const {
    if (size() != 0)
      BELLOWS_CUDA_CHECK(
          cudaMemcpyAsync(&to[0], values_.data(), size() * sizeof(float), cudaMemcpyDeviceToHost, exec.stream()));
  }

  /// Copies `from` (host memory, as many elements) in; complete on return.
  void assign(executor& exec, std::span<const float> from) {
    BELLOWS_EXPECTS(from.size() == size(), "float_array: ", from.size(), " values for ", size(), " elements");
    if (size() != 0)
      BELLOWS_CUDA_CHECK(
          cudaMemcpyAsync(values_.data(), from.data(), size() * sizeof(float), cudaMemcpyHostToDevice, exec.stream()));
    exec.synchronize();
  }

private:
  device_buffer<float> values_;
};

/// n values in pinned host memory that copy_word delivers into without a wait
/// (plan/float_array.hpp), value-initialised. Allocated once per layer state (cudaMallocHost is
/// slow: not for a step). T is trivially copyable.
template <class T>
class host_values {
public:
  host_values() = default;
  host_values(executor& /*exec*/, std::size_t n) : n_(n) {
    if (n == 0) return;
    BELLOWS_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&p_), n * sizeof(T)));
    std::fill(p_, p_ + n, T{});
  }
  host_values(host_values&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  host_values& operator=(host_values&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~host_values() { (void)cudaFreeHost(p_); }  // a destructor cannot throw

  [[nodiscard]] T& operator[](std::size_t i) noexcept { return p_[i]; }
  [[nodiscard]] const T& operator[](std::size_t i) const noexcept { return p_[i]; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }

private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/// *out (device memory) = cpu::mean_norm of x (device memory), enqueued: one thread walks x in
/// order, so it takes about n dependent double additions; meant for Accordion's checks and the
/// Synchronizer's optional norms, not for every step of a large layer.
inline void mean_norm(executor& exec, std::span<const float> x, double divisor, float* out) {
  detail::launch(&detail::mean_norm_kernel, 1u, 1u, exec.stream(), x.data(), x.size(), divisor, out);
}

/// Enqueues the copy of one word of device memory (a count or a flag a kernel wrote) into `to`,
/// complete once exec.synchronize() returns.
template <class T>
void copy_word(executor& exec, T& to, const T* from) {
  BELLOWS_CUDA_CHECK(cudaMemcpyAsync(&to, from, sizeof(T), cudaMemcpyDeviceToHost, exec.stream()));
}

}  // namespace bellows::cuda

namespace bellows {
template <>
struct float_array_of<cuda::executor> {
  using type = cuda::float_array;
};
template <class T>
struct host_values_of<cuda::executor, T> {
  using type = cuda::host_values<T>;
};
static_assert(Executor<cuda::executor>, "cuda::executor must model Executor");
}  // namespace bellows
