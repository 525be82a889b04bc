// SPDX-License-Identifier: Apache-2.0
// The CPU emulation of CUDA (cuda_runtime.h, cub_and_thrust.h) against what CUDA documents:
// barriers order shared-memory writes before reads, shuffles pick CUDA's source lanes (widths,
// out-of-range lanes), votes and reductions, CUB's block and device pieces, launch errors.
// The emulated CUDA tests rest on these.
#include <cuda_runtime.h>

#include <bellows/cuda/launch.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <doctest/doctest.h>
#include <thrust/iterator/counting_iterator.h>

#include <cstdint>
#include <numeric>
#include <vector>

namespace {

using bellows::cuda::detail::launch;

/// Each thread writes its index to shared memory, and after the barrier reads its neighbour's.
__global__ void rotate(unsigned* out) {
  __shared__ unsigned seen[256];
  seen[threadIdx.x] = threadIdx.x + 1000 * blockIdx.x;
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = seen[(threadIdx.x + 1) % blockDim.x];
}

/// out[4 t + k]: the four shuffles of thread t.
__global__ void shuffles(int* out) {
  const int lane = static_cast<int>(threadIdx.x % 32), t = static_cast<int>(threadIdx.x);
  out[4 * t + 0] = __shfl_xor_sync(0xFFFFFFFFu, t, 1);
  out[4 * t + 1] = __shfl_xor_sync(0xFFFFFFFFu, t, 4, 8);    // within groups of 8
  out[4 * t + 2] = __shfl_xor_sync(0xFFFFFFFFu, t, 8, 8);    // a later group: the caller's own
  out[4 * t + 3] = __shfl_sync(0xFFFFFFFFu, t, lane + 3, 16);  // source lane modulo 16
}

/// Warps 1 and 3 leave at once; the others still meet at the block barrier and vote (thread 70
/// stays, thread 40 has left).
__global__ void votes(unsigned* out) {
  const unsigned warp = threadIdx.x / 32;
  if (warp == 1 || warp == 3) return;
  const int any = __syncthreads_or(threadIdx.x == 70);
  const int none = __syncthreads_or(threadIdx.x == 40);
  const unsigned warp_sum = __reduce_add_sync(0xFFFFFFFFu, threadIdx.x);
  __syncwarp();
  out[threadIdx.x] = static_cast<unsigned>(any) | static_cast<unsigned>(none) << 1 | warp_sum << 2;
}

template <class T>
__global__ void block_sums(const T* in, T* inclusive, T* total, T* reduced) {
  using scan = cub::BlockScan<T, 128>;
  using reduce = cub::BlockReduce<T, 128>;
  __shared__ typename scan::TempStorage scan_temp;
  __shared__ typename reduce::TempStorage reduce_temp;
  const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
  T through{}, all{};
  scan(scan_temp).InclusiveSum(in[t], through, all);
  inclusive[t] = through;
  total[t] = all;
  __syncthreads();
  const T sum = reduce(reduce_temp).Sum(in[t]);
  if (threadIdx.x == 0) reduced[blockIdx.x] = sum;
}

struct odd {
  bool operator()(std::uint32_t i) const { return i % 2 == 1; }
};

/// Copies `data` to a device array, runs kernel(array) on blocks x threads, and returns what the
/// array holds after.
template <class T>
std::vector<T> run_on(void (*kernel)(T*), unsigned blocks, unsigned threads, std::vector<T> data) {
  T* d = nullptr;
  REQUIRE(cudaMalloc(&d, data.size() * sizeof(T)) == cudaSuccess);
  REQUIRE(cudaMemcpy(d, data.data(), data.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  launch(kernel, blocks, threads, nullptr, d);
  REQUIRE(cudaMemcpy(data.data(), d, data.size() * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  (void)cudaFree(d);
  return data;
}

}  // namespace

TEST_CASE("emulation: a block barrier orders shared writes before reads, in every block") {
  const std::vector<unsigned> out = run_on(&rotate, 3u, 256u, std::vector<unsigned>(3 * 256));
  std::size_t wrong = 0;
  for (unsigned b = 0; b < 3; ++b)
    for (unsigned t = 0; t < 256; ++t) wrong += out[b * 256 + t] != (t + 1) % 256 + 1000 * b;
  CHECK(wrong == 0);
}

TEST_CASE("emulation: shuffles take CUDA's source lanes") {
  const std::vector<int> out = run_on(&shuffles, 1u, 64u, std::vector<int>(4 * 64));
  for (int t = 0; t < 64; ++t) {
    CAPTURE(t);
    const int lane = t % 32, warp = t / 32 * 32;
    CHECK(out[4 * t + 0] == warp + (lane ^ 1));
    CHECK(out[4 * t + 1] == warp + (lane ^ 4));
    CHECK(out[4 * t + 2] == ((lane ^ 8) / 8 > lane / 8 ? t : warp + (lane ^ 8)));
    CHECK(out[4 * t + 3] == warp + lane / 16 * 16 + (lane + 3) % 16);
  }
}

TEST_CASE("emulation: votes and warp sums count the threads still running, not those that left") {
  const std::vector<unsigned> out = run_on(&votes, 1u, 128u, std::vector<unsigned>(128, 7u));
  for (unsigned t = 0; t < 128; ++t) {
    CAPTURE(t);
    const unsigned warp = t / 32;
    if (warp == 1 || warp == 3) {
      CHECK(out[t] == 7u);  // never written
      continue;
    }
    const unsigned warp_sum = 32 * (32 * warp) + 31 * 32 / 2;
    CHECK(out[t] == (1u | warp_sum << 2));
  }
}

TEST_CASE("emulation: CUB's block scan and sum, device select and scan") {
  constexpr unsigned blocks = 3, threads = 128, n = blocks * threads;
  std::vector<std::uint32_t> in(n);
  for (unsigned i = 0; i < n; ++i) in[i] = (i * 2654435761u) % 1000;
  std::uint32_t *d_in = nullptr, *d_inclusive = nullptr, *d_total = nullptr, *d_reduced = nullptr;
  REQUIRE(cudaMalloc(&d_in, n * 4) == cudaSuccess);
  REQUIRE(cudaMalloc(&d_inclusive, n * 4) == cudaSuccess);
  REQUIRE(cudaMalloc(&d_total, n * 4) == cudaSuccess);
  REQUIRE(cudaMalloc(&d_reduced, blocks * 4) == cudaSuccess);
  REQUIRE(cudaMemcpy(d_in, in.data(), n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
  launch(&block_sums<std::uint32_t>, blocks, threads, nullptr, d_in, d_inclusive, d_total, d_reduced);
  std::vector<std::uint32_t> inclusive(n), total(n), reduced(blocks);
  REQUIRE(cudaMemcpy(inclusive.data(), d_inclusive, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(cudaMemcpy(total.data(), d_total, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(cudaMemcpy(reduced.data(), d_reduced, blocks * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  for (unsigned b = 0; b < blocks; ++b) {
    std::uint32_t sum = 0;
    const std::uint32_t whole = std::accumulate(in.begin() + b * threads, in.begin() + (b + 1) * threads, 0u);
    for (unsigned t = 0; t < threads; ++t) {
      sum += in[b * threads + t];
      CHECK(inclusive[b * threads + t] == sum);
      CHECK(total[b * threads + t] == whole);
    }
    CHECK(reduced[b] == whole);
  }

  // DeviceScan::ExclusiveSum in place, and DeviceSelect::If over a counting iterator
  std::size_t bytes = 0;
  REQUIRE(cub::DeviceScan::ExclusiveSum(nullptr, bytes, d_in, d_in, static_cast<int>(n)) == cudaSuccess);
  void* scratch = nullptr;
  REQUIRE(cudaMalloc(&scratch, bytes) == cudaSuccess);
  REQUIRE(cub::DeviceScan::ExclusiveSum(scratch, bytes, d_in, d_in, static_cast<int>(n)) == cudaSuccess);
  std::vector<std::uint32_t> scanned(n);
  REQUIRE(cudaMemcpy(scanned.data(), d_in, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  std::vector<std::uint32_t> want(n);
  std::exclusive_scan(in.begin(), in.end(), want.begin(), 0u);
  CHECK(scanned == want);
  REQUIRE(cub::DeviceSelect::If(scratch, bytes, thrust::counting_iterator<std::uint32_t>(5), d_in, d_total,
                                static_cast<int>(n), odd{}) == cudaSuccess);
  std::vector<std::uint32_t> picked(n / 2 + 1);
  std::uint32_t count = 0;
  REQUIRE(cudaMemcpy(picked.data(), d_in, picked.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(cudaMemcpy(&count, d_total, 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(count == n / 2);
  for (std::uint32_t j = 0; j < count; ++j) CHECK(picked[j] == 5 + 2 * j);
  for (void* p : {static_cast<void*>(d_in), static_cast<void*>(d_inclusive), static_cast<void*>(d_total),
                  static_cast<void*>(d_reduced), scratch})
    (void)cudaFree(p);
}

TEST_CASE("emulation: a bad launch configuration fails as CUDA's does, and allocation fails past 1 TiB") {
  unsigned* d = nullptr;
  CHECK_THROWS_WITH_AS(launch(&rotate, 1u, 2048u, nullptr, d), doctest::Contains("cudaErrorInvalidConfiguration"),
                       bellows::cuda_error);
  CHECK_THROWS_AS(launch(&rotate, 0u, 32u, nullptr, d), bellows::cuda_error);
  CHECK(cudaGetLastError() == cudaSuccess);  // the check read and cleared it
  CHECK(cudaMalloc(&d, std::size_t{1} << 41) == cudaErrorMemoryAllocation);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  CHECK(__fns(0b101100u, 0, 1) == 2u);
  CHECK(__fns(0b101100u, 0, 3) == 5u);
  CHECK(__fns(0b101100u, 3, 1) == 3u);
  CHECK(__fns(0b101100u, 0, 4) == 0xFFFFFFFFu);
}
