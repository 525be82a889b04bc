// SPDX-License-Identifier: Apache-2.0
// An owning array in device memory, for the state the CUDA backend keeps between calls (a
// layer's error memory, its payload slots). Sized at registration or grown by fit(); never on a
// steady hot path.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <utility>

#include "bellows/cuda/check.cuh"

namespace bellows::cuda {

template <class T>
class device_buffer {
public:
  device_buffer() = default;
  /// `count` elements of unspecified value.
  explicit device_buffer(std::size_t count) { allocate(count); }
  device_buffer(device_buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(size_, o.size_);
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { (void)cudaFree(p_); }  // a destructor cannot throw

  [[nodiscard]] T* data() const noexcept { return p_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::span<T> span() const noexcept { return {p_, size_}; }

  /// Makes the buffer hold at least `count` elements and returns it. Only to grow does it
  /// reallocate, after the work already enqueued on `stream` (which may use the old memory);
  /// the contents are then unspecified.
  T* fit(std::size_t count, cudaStream_t stream) {
    if (count > size_) {
      if (p_ != nullptr) BELLOWS_CUDA_CHECK(cudaStreamSynchronize(stream));
      BELLOWS_CUDA_CHECK(cudaFree(std::exchange(p_, nullptr)));
      size_ = 0;
      allocate(count);
    }
    return p_;
  }

private:
  void allocate(std::size_t count) {
    if (count == 0) return;
    BELLOWS_CUDA_CHECK(cudaMalloc(&p_, count * sizeof(T)));
    size_ = count;
  }

  T* p_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace bellows::cuda
