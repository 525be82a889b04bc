// SPDX-License-Identifier: Apache-2.0
// The CUDA executor: the stream every kernel of a call is enqueued on, and the device workspace
// the kernels carve their scratch from.
//
// As CUB's device algorithms do, each CUDA kernel group of bellows states its scratch first
// (a `*_workspace_bytes(...)` function, computed by the same carving code as the call itself
// with no memory behind it), and the caller makes sure the executor holds that much before the
// hot path: `reserve(bytes)` at registration. A call never allocates, never synchronises the
// stream, and raises bellows::error when the workspace is smaller than it needs.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "bellows/core/error.hpp"
#include "bellows/cuda/check.cuh"

namespace bellows::cuda {

/// Scratch taken from a workspace in order, each piece aligned to 256 bytes (what cudaMalloc
/// gives and CUB expects). With a null base nothing is written and only `used` counts, so the
/// same code that carves the workspace also tells its size.
class arena {
public:
  static constexpr std::size_t alignment = 256;

  arena() = default;
  arena(void* base, std::size_t bytes) noexcept : base_(static_cast<std::byte*>(base)), bytes_(bytes) {}

  /// The next `count` objects of type T (null while sizing). Raises bellows::error when they
  /// do not fit in what is left.
  template <class T>
  [[nodiscard]] T* take(std::size_t count) {
    const std::size_t at = used_;
    used_ += (count * sizeof(T) + alignment - 1) / alignment * alignment;
    if (base_ == nullptr) return nullptr;
    // the piece itself must fit (an empty one always does); the padding after it only places
    // the next one
    BELLOWS_EXPECTS(count == 0 || at + count * sizeof(T) <= bytes_, "cuda::arena: the workspace holds ", bytes_,
                    " bytes, the call needs at least ", at + count * sizeof(T),
                    " (reserve the size its *_workspace_bytes function gives)");
    return reinterpret_cast<T*>(base_ + at);
  }

  /// Bytes taken so far.
  [[nodiscard]] std::size_t used() const noexcept { return used_; }
  [[nodiscard]] bool sizing() const noexcept { return base_ == nullptr; }

private:
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t used_ = 0;
};

/// A stream and a workspace. The stream is the caller's (never destroyed here) or the legacy
/// default stream. The workspace is the caller's (fixed) or a device buffer this executor owns,
/// grown by reserve() only. One executor serves one caller thread at a time; give each thread
/// (or rank of a local collective) its own.
class executor {
public:
  /// Enqueues on `stream`; the workspace is pooled: empty until reserve().
  explicit executor(cudaStream_t stream = nullptr) noexcept : stream_(stream) {}

  /// Enqueues on `stream` and carves scratch from the caller's device buffer, which must outlive
  /// the executor; reserve() cannot grow it.
  executor(cudaStream_t stream, void* workspace, std::size_t bytes) noexcept
      : stream_(stream), base_(workspace), bytes_(bytes), owned_(false) {}

  executor(const executor&) = delete;
  executor& operator=(const executor&) = delete;
  ~executor() {
    if (owned_ && base_ != nullptr) (void)cudaFree(base_);  // a destructor cannot throw
  }

  /// One executor on the legacy default stream, for callers that do not bring their own.
  static executor& shared() {
    static executor instance;
    return instance;
  }

  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

  /// Makes the workspace hold at least `bytes`: allocates (and frees the old buffer, which
  /// waits for work already enqueued that may use it) when the pool is smaller. Meant for
  /// registration, never for the hot path. A caller-provided workspace cannot grow: raises
  /// bellows::error when it is too small.
  void reserve(std::size_t bytes) {
    if (bytes <= bytes_) return;
    BELLOWS_EXPECTS(owned_, "cuda::executor: the caller's workspace holds ", bytes_, " bytes, ", bytes, " are needed");
    void* grown = nullptr;
    BELLOWS_CUDA_CHECK(cudaMalloc(&grown, bytes));
    if (base_ != nullptr) {
      BELLOWS_CUDA_CHECK(cudaStreamSynchronize(stream_));
      BELLOWS_CUDA_CHECK(cudaFree(base_));
    }
    base_ = grown;
    bytes_ = bytes;
  }

  /// Bytes the workspace holds.
  [[nodiscard]] std::size_t workspace_bytes() const noexcept { return bytes_; }

  /// The whole workspace, for one call to carve from. Kernels of one call on this stream run in
  /// order, so consecutive calls may reuse it.
  [[nodiscard]] arena workspace() const noexcept { return arena(base_, bytes_); }

  /// Waits for everything enqueued on the stream (the caller's choice, never the kernels').
  void synchronize() const { BELLOWS_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

private:
  cudaStream_t stream_ = nullptr;
  void* base_ = nullptr;
  std::size_t bytes_ = 0;
  bool owned_ = true;
};

/// Blocks of `threads` threads covering `items` items (at least one block).
[[nodiscard]] inline unsigned blocks_for(std::size_t items, unsigned threads) noexcept {
  const std::size_t b = (items + threads - 1) / threads;
  return b == 0 ? 1u : static_cast<unsigned>(b);
}

}  // namespace bellows::cuda
