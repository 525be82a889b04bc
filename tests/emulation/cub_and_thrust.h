// SPDX-License-Identifier: Apache-2.0
// The pieces of CUB and Thrust that bellows' kernels use, for the CPU emulation of CUDA
// (cuda_runtime.h here): block-wide scans and sums through the emulated block barrier, and the
// device-wide select and scan as plain loops. Their results are CUB's; their cost is not.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace thrust {

template <class T>
struct counting_iterator {
  T first;
  explicit counting_iterator(T f) : first(f) {}
  T operator[](std::size_t i) const { return static_cast<T>(first + i); }
};

}  // namespace thrust

namespace cub {

namespace detail {

/// The calling thread's `v` for the whole block: each thread writes its slot, then all meet.
template <class T>
void publish(T v) {
  static_assert(sizeof(T) <= sizeof(std::uint64_t));
  std::memcpy(&bellows_emulation::m.exchange[threadIdx.x], &v, sizeof(T));
  __syncthreads();
}
/// Thread t's published value; every thread of the block must take part, as in CUB.
template <class T>
T slot(unsigned t) {
  if (bellows_emulation::m.threads[t].state == bellows_emulation::wait::done)
    bellows_emulation::stuck("a block-wide scan or sum without a thread that has left");
  T v;
  std::memcpy(&v, &bellows_emulation::m.exchange[t], sizeof(T));
  return v;
}

}  // namespace detail

template <class T, int Threads>
class BlockScan {
public:
  struct TempStorage {};
  explicit BlockScan(TempStorage&) {}

  void InclusiveSum(T in, T& out) {
    T total;
    InclusiveSum(in, out, total);
  }
  /// Thread 0 sums the published values in order, in place, once for the block (a loop per
  /// thread over every slot costs the square of the block's size, which dominated the emulated
  /// top-k tests); the sums are those of that loop, bit for bit.
  void InclusiveSum(T in, T& out, T& total) {
    detail::publish(in);
    if (threadIdx.x == 0) {
      T sum{};
      for (unsigned t = 0; t < blockDim.x; ++t) {
        sum += detail::slot<T>(t);
        std::memcpy(&bellows_emulation::m.exchange[t], &sum, sizeof(T));
      }
    } else if (bellows_emulation::m.threads[0].state == bellows_emulation::wait::done) {
      bellows_emulation::stuck("a block-wide scan without a thread that has left");
    }
    __syncthreads();
    std::memcpy(&out, &bellows_emulation::m.exchange[threadIdx.x], sizeof(T));
    std::memcpy(&total, &bellows_emulation::m.exchange[blockDim.x - 1], sizeof(T));
    __syncthreads();  // every thread has read before a slot is written again
  }
};

template <class T, int Threads>
class BlockReduce {
public:
  struct TempStorage {};
  explicit BlockReduce(TempStorage&) {}

  /// The block's sum, in thread 0 (the others get a value of no meaning, as in CUB).
  T Sum(T in) {
    detail::publish(in);
    T total{};
    if (threadIdx.x == 0)
      for (unsigned t = 0; t < blockDim.x; ++t) total += detail::slot<T>(t);
    __syncthreads();
    return total;
  }
};

struct DeviceSelect {
  /// Keeps in[i] where select(in[i]), in order; with no scratch, only asks for some.
  template <class In, class Out, class Count, class Select>
  static cudaError_t If(void* scratch, std::size_t& bytes, In in, Out out, Count selected, int n, Select select,
                        cudaStream_t = nullptr) {
    if (scratch == nullptr) {
      bytes = 1;
      return cudaSuccess;
    }
    int kept = 0;
    for (int i = 0; i < n; ++i)
      if (select(in[i])) out[kept++] = in[i];
    *selected = static_cast<std::remove_reference_t<decltype(*selected)>>(kept);
    return cudaSuccess;
  }
};

struct DeviceScan {
  template <class In, class Out>
  static cudaError_t ExclusiveSum(void* scratch, std::size_t& bytes, In in, Out out, int n, cudaStream_t = nullptr) {
    if (scratch == nullptr) {
      bytes = 1;
      return cudaSuccess;
    }
    std::remove_cvref_t<decltype(in[0])> sum{};
    for (int i = 0; i < n; ++i) {
      const auto v = in[i];  // in and out may be the same array
      out[i] = sum;
      sum += v;
    }
    return cudaSuccess;
  }
};

}  // namespace cub
