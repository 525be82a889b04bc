// SPDX-License-Identifier: Apache-2.0
// The CPU emulation of CUDA (cuda_runtime.h, cub_and_thrust.h) against what CUDA documents:
// barriers order shared-memory writes before reads, shuffles pick CUDA's source lanes (widths,
// out-of-range lanes), votes and reductions, CUB's block and device pieces, launch errors,
// devices and pointer attributes, kernels launched from several host threads at once; and the
// emulated NCCL (nccl.h) against what NCCL promises its ranks. The emulated CUDA tests rest on
// these.
#include <cuda_runtime.h>
#include <nccl.h>

#include <bellows/cuda/launch.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <doctest/doctest.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string_view>
#include <thread>
#include <utility>
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
  out[4 * t + 1] = __shfl_xor_sync(0xFFFFFFFFu, t, 4, 8);      // within groups of 8
  out[4 * t + 2] = __shfl_xor_sync(0xFFFFFFFFu, t, 8, 8);      // a later group: the caller's own
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

/// Each thread passes its value to the next one, around the block, 16 times over shared memory.
__global__ void relay(unsigned* out, unsigned seed) {
  __shared__ unsigned ring[128];
  unsigned v = seed + threadIdx.x + 1000 * blockIdx.x;
  for (int round = 0; round < 16; ++round) {
    ring[threadIdx.x] = v;
    __syncthreads();
    v = ring[(threadIdx.x + 1) % blockDim.x] * 3u + 1u;
    __syncthreads();
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

/// What relay computes, on the host.
std::vector<unsigned> relayed(unsigned blocks, unsigned threads, unsigned seed) {
  std::vector<unsigned> v(blocks * threads), next(threads);
  for (unsigned i = 0; i < v.size(); ++i) v[i] = seed + i % threads + 1000 * (i / threads);
  for (unsigned b = 0; b < blocks; ++b)
    for (int round = 0; round < 16; ++round) {
      for (unsigned t = 0; t < threads; ++t) next[t] = v[b * threads + (t + 1) % threads] * 3u + 1u;
      std::copy(next.begin(), next.end(), v.begin() + b * threads);
    }
  return v;
}

/// Runs body(rank, comm) on three threads, the ranks of one ncclCommInitAll group.
template <class Body>
void on_three_ranks(Body body) {
  std::array<ncclComm_t, 3> comms{};
  const std::array<int, 3> devices{0, 1, 2};
  REQUIRE(ncclCommInitAll(comms.data(), 3, devices.data()) == ncclSuccess);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) ranks.emplace_back([&, r] { body(r, comms[static_cast<std::size_t>(r)]); });
  for (std::thread& t : ranks) t.join();
  for (ncclComm_t c : comms) CHECK(ncclCommDestroy(c) == ncclSuccess);
}

/// A device copy of `host`.
template <class T>
T* to_device(const std::vector<T>& host) {
  T* d = nullptr;
  if (cudaMalloc(&d, host.size() * sizeof(T)) == cudaSuccess)
    (void)cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

/// The n elements at device address d, on the host.
template <class T>
std::vector<T> from_device(const T* d, std::size_t n) {
  std::vector<T> host(n);
  (void)cudaMemcpy(host.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return host;
}

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

TEST_CASE("emulation: three devices and the last error, both per host thread") {
  int count = 0, device = -1;
  CHECK(cudaGetDeviceCount(&count) == cudaSuccess);
  CHECK(count == 3);
  CHECK(cudaSetDevice(-1) == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  CHECK(cudaGetDevice(&device) == cudaSuccess);
  CHECK(device == 0);  // unchanged by the refusal
  CHECK(cudaSetDevice(2) == cudaSuccess);
  CHECK(cudaGetDevice(&device) == cudaSuccess);
  CHECK(device == 2);
  CHECK(cudaSetDevice(3) == cudaErrorInvalidDevice);  // this thread's error, left unread
  int other_device = -1;
  cudaError_t other_before = cudaErrorInvalidValue, other_after = cudaSuccess;
  std::thread([&] {
    other_before = cudaGetLastError();
    (void)cudaGetDevice(&other_device);
    (void)cudaPointerGetAttributes(nullptr, nullptr);
    other_after = cudaGetLastError();
  }).join();
  CHECK(other_device == 0);            // a new host thread starts on device 0 ...
  CHECK(other_before == cudaSuccess);  // ... with no error
  CHECK(other_after == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);  // still this thread's own
  CHECK(cudaSetDevice(0) == cudaSuccess);
}

TEST_CASE("emulation: pointer attributes tell device memory (live cudaMalloc blocks) from host memory") {
  const auto type_of = [](const void* p) {
    cudaPointerAttributes a{};
    a.type = cudaMemoryTypeManaged;  // overwritten
    return cudaPointerGetAttributes(&a, p) == cudaSuccess ? a.type : cudaMemoryTypeHost;
  };
  char* d = nullptr;
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  REQUIRE(cudaMalloc(&d, 100) == cudaSuccess);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  cudaPointerAttributes a{};
  CHECK(cudaPointerGetAttributes(&a, d + 99) == cudaSuccess);
  CHECK(a.type == cudaMemoryTypeDevice);
  CHECK(a.device == 1);  // where it was allocated, not the current device
  CHECK(a.devicePointer == d + 99);
  CHECK(type_of(d) == cudaMemoryTypeDevice);
  CHECK(type_of(d + 100) == cudaMemoryTypeUnregistered);  // one past the end
  CHECK(type_of(d - 1) == cudaMemoryTypeUnregistered);
  int on_stack = 0;
  std::vector<float> on_heap(10);
  CHECK(type_of(&on_stack) == cudaMemoryTypeUnregistered);
  CHECK(type_of(on_heap.data()) == cudaMemoryTypeUnregistered);
  CHECK(type_of(nullptr) == cudaMemoryTypeUnregistered);
  CHECK(cudaPointerGetAttributes(nullptr, d) == cudaErrorInvalidValue);
  CHECK(cudaFree(d + 1) == cudaErrorInvalidValue);  // not where a block starts
  CHECK(type_of(d) == cudaMemoryTypeDevice);        // and left alone
  CHECK(cudaFree(d) == cudaSuccess);
  CHECK(type_of(d) == cudaMemoryTypeUnregistered);  // freed
  CHECK(cudaFree(d) == cudaErrorInvalidValue);      // twice
  CHECK(cudaFree(nullptr) == cudaSuccess);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
}

TEST_CASE("emulation: kernels launched from three host threads at once each compute their own grid") {
  constexpr unsigned blocks = 3, threads = 128;
  std::array<std::size_t, 3> wrong{};
  std::vector<std::thread> hosts;
  for (unsigned h = 0; h < 3; ++h)
    hosts.emplace_back([&, h] {
      for (unsigned launch_index = 0; launch_index < 20; ++launch_index) {
        const unsigned seed = 7919 * h + 13 * launch_index;
        unsigned* d = nullptr;
        if (cudaMalloc(&d, blocks * threads * sizeof(unsigned)) != cudaSuccess) {
          ++wrong[h];
          continue;
        }
        launch(&relay, blocks, threads, nullptr, d, seed);
        wrong[h] += from_device(d, blocks * threads) != relayed(blocks, threads, seed);
        (void)cudaFree(d);
      }
    });
  for (std::thread& t : hosts) t.join();
  CHECK(wrong == std::array<std::size_t, 3>{});
}

TEST_CASE("emulated NCCL: every rank gets the same bits, the sum in rank order") {
  // values of every magnitude and sign, so that the sum's rounding depends on its order
  constexpr std::size_t n = 1000;
  std::array<std::vector<float>, 3> sent;
  std::uint32_t x = 12345;
  for (auto& v : sent)
    for (std::size_t i = 0; i < n; ++i) {
      x = x * 1664525u + 1013904223u;
      v.push_back(std::ldexp(static_cast<float>(x >> 8) - 8388608.0f, static_cast<int>(x % 40) - 20));
    }
  std::vector<float> want(n);
  std::size_t order_matters = 0;
  for (std::size_t i = 0; i < n; ++i) {
    want[i] = sent[0][i] + sent[1][i] + sent[2][i];
    order_matters += want[i] != sent[2][i] + sent[1][i] + sent[0][i];
  }
  REQUIRE(order_matters > 10);
  std::array<std::vector<float>, 3> got;
  std::array<ncclResult_t, 3> results{};
  on_three_ranks([&](int r, ncclComm_t comm) {
    float* d = to_device(sent[static_cast<std::size_t>(r)]);
    results[static_cast<std::size_t>(r)] = ncclAllReduce(d, d, n, ncclFloat, ncclSum, comm, nullptr);
    got[static_cast<std::size_t>(r)] = from_device(d, n);
    (void)cudaFree(d);
  });
  for (std::size_t r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(results[r] == ncclSuccess);
    CHECK(std::memcmp(got[r].data(), want.data(), n * sizeof(float)) == 0);
  }
}

TEST_CASE("emulated NCCL: no rank changes a buffer another still reads, call after call") {
  // each rank overwrites its buffer right after each sum: a rank let go too early would change
  // what a slower one is still adding
  std::array<std::size_t, 3> wrong{};
  on_three_ranks([&](int r, ncclComm_t comm) {
    constexpr std::size_t n = 64;
    std::uint64_t* d = to_device(std::vector<std::uint64_t>(n));
    for (std::uint64_t call = 0; call < 300; ++call) {
      const std::vector<std::uint64_t> mine(n, 3 * call + static_cast<std::uint64_t>(r));
      (void)cudaMemcpy(d, mine.data(), n * 8, cudaMemcpyHostToDevice);
      wrong[static_cast<std::size_t>(r)] += ncclAllReduce(d, d, n, ncclUint64, ncclSum, comm, nullptr) != ncclSuccess;
      wrong[static_cast<std::size_t>(r)] += from_device(d, n) != std::vector<std::uint64_t>(n, 9 * call + 3);
    }
    (void)cudaFree(d);
  });
  CHECK(wrong == std::array<std::size_t, 3>{});
}

TEST_CASE("emulated NCCL: allgather of bytes in place and of 64-bit words out of place") {
  constexpr std::size_t k = 37;
  std::array<std::vector<std::uint8_t>, 3> bytes;
  std::array<std::vector<std::uint64_t>, 3> words;
  std::array<int, 3> ranks{}, sizes{};
  on_three_ranks([&](int r, ncclComm_t comm) {
    const auto q = static_cast<std::size_t>(r);
    (void)ncclCommUserRank(comm, &ranks[q]);
    (void)ncclCommCount(comm, &sizes[q]);
    std::vector<std::uint8_t> all(3 * k, 0xEE);
    for (std::size_t i = 0; i < k; ++i) all[q * k + i] = static_cast<std::uint8_t>(50 * q + i);
    std::uint8_t* d_all = to_device(all);
    if (ncclAllGather(d_all + q * k, d_all, k, ncclUint8, comm, nullptr) == ncclSuccess)
      bytes[q] = from_device(d_all, 3 * k);
    std::vector<std::uint64_t> mine(k);
    for (std::size_t i = 0; i < k; ++i) mine[i] = std::uint64_t{q + 1} << 40 | i;
    std::uint64_t* d_mine = to_device(mine);
    std::uint64_t* d_words = to_device(std::vector<std::uint64_t>(3 * k));
    if (ncclAllGather(d_mine, d_words, k, ncclUint64, comm, nullptr) == ncclSuccess)
      words[q] = from_device(d_words, 3 * k);
    for (void* p : {static_cast<void*>(d_all), static_cast<void*>(d_mine), static_cast<void*>(d_words)})
      (void)cudaFree(p);
  });
  std::vector<std::uint8_t> want_bytes;
  std::vector<std::uint64_t> want_words;
  for (std::size_t q = 0; q < 3; ++q)
    for (std::size_t i = 0; i < k; ++i) {
      want_bytes.push_back(static_cast<std::uint8_t>(50 * q + i));
      want_words.push_back(std::uint64_t{q + 1} << 40 | i);
    }
  CHECK(ranks == std::array<int, 3>{0, 1, 2});
  CHECK(sizes == std::array<int, 3>{3, 3, 3});
  for (std::size_t r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(bytes[r] == want_bytes);
    CHECK(words[r] == want_words);
  }
}

TEST_CASE("emulated NCCL: argument errors, and ranks that disagree, are reported") {
  float* d = nullptr;
  REQUIRE(cudaMalloc(&d, 3 * 16 * sizeof(float)) == cudaSuccess);
  std::vector<float> host(3 * 16);
  std::array<std::array<ncclResult_t, 4>, 3> results{};
  on_three_ranks([&](int r, ncclComm_t comm) {
    const auto q = static_cast<std::size_t>(r);
    float* mine = d + 16 * q;
    results[q][0] = ncclAllReduce(mine, mine, 16, ncclFloat, ncclSum, nullptr, nullptr);
    results[q][1] = ncclAllReduce(host.data(), host.data(), 16, ncclFloat, ncclSum, comm, nullptr);
    results[q][2] = ncclAllGather(mine, host.data(), 16, ncclFloat, comm, nullptr);
    // the counts differ: every rank is told, none waits forever
    results[q][3] = ncclAllReduce(mine, mine, 4 + q, ncclFloat, ncclSum, comm, nullptr);
  });
  for (std::size_t r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(results[r] ==
          std::array<ncclResult_t, 4>{ncclInvalidArgument, ncclInvalidArgument, ncclInvalidArgument, ncclInvalidUsage});
  }
  int rank = 0;
  CHECK(ncclCommUserRank(nullptr, &rank) == ncclInvalidArgument);
  std::array<ncclComm_t, 2> comms{};
  const std::array<int, 2> bad{0, 3};
  CHECK(ncclCommInitAll(comms.data(), 2, bad.data()) == ncclInvalidArgument);
  CHECK(ncclCommInitAll(comms.data(), 0, nullptr) == ncclInvalidArgument);
  CHECK(std::string_view(ncclGetErrorString(ncclInvalidUsage)) == "invalid usage");
  (void)cudaFree(d);
}

TEST_CASE("emulated NCCL: grouped sends and receives, in order per pair, to any rank and to itself") {
  // Rank a sends rank b two messages, of (a + b) % 3 and 5 bytes (some empty), in one group with
  // its receives; each message's bytes are a value of (from, to, message, byte).
  const auto size = [](std::size_t a, std::size_t b, std::size_t m) { return m == 0 ? (a + b) % 3 : std::size_t{5}; };
  const auto byte = [](std::size_t a, std::size_t b, std::size_t m, std::size_t k) {
    return static_cast<std::uint8_t>(a * 40 + b * 11 + m * 7 + k);
  };
  std::array<std::size_t, 3> wrong{};
  std::array<ncclResult_t, 3> ended{};
  on_three_ranks([&](int r, ncclComm_t comm) {
    const auto me = static_cast<std::size_t>(r);
    std::vector<std::uint8_t*> buffers;
    std::vector<std::pair<std::uint8_t*, std::vector<std::uint8_t>>> expected;
    std::size_t failed = ncclGroupStart() != ncclSuccess;
    for (std::size_t m = 0; m < 2; ++m)
      for (std::size_t peer = 0; peer < 3; ++peer) {
        std::vector<std::uint8_t> out(size(me, peer, m)), in(size(peer, me, m)), want(in.size());
        for (std::size_t k = 0; k < out.size(); ++k) out[k] = byte(me, peer, m, k);
        for (std::size_t k = 0; k < in.size(); ++k) want[k] = byte(peer, me, m, k);
        std::uint8_t* d_out = to_device(out);
        std::uint8_t* d_in = to_device(std::vector<std::uint8_t>(in.size() + 1, 0xEE));
        buffers.insert(buffers.end(), {d_out, d_in});
        failed += ncclSend(d_out, out.size(), ncclUint8, static_cast<int>(peer), comm, nullptr) != ncclSuccess;
        failed += ncclRecv(d_in, in.size(), ncclUint8, static_cast<int>(peer), comm, nullptr) != ncclSuccess;
        want.push_back(0xEE);  // nothing past the message is written
        expected.emplace_back(d_in, want);
      }
    ended[me] = ncclGroupEnd();
    for (const auto& [d, want] : expected) failed += from_device(d, want.size()) != want;
    for (std::uint8_t* d : buffers) (void)cudaFree(d);
    wrong[me] = failed;
  });
  CHECK(ended == std::array<ncclResult_t, 3>{});
  CHECK(wrong == std::array<std::size_t, 3>{});
}

TEST_CASE("emulated NCCL: sends and receives that do not pair up, or outside a group, are refused") {
  std::array<std::array<ncclResult_t, 5>, 3> results{};
  on_three_ranks([&](int r, ncclComm_t comm) {
    const auto q = static_cast<std::size_t>(r);
    std::uint8_t* d = to_device(std::vector<std::uint8_t>(8));
    results[q][0] = ncclSend(d, 8, ncclUint8, (r + 1) % 3, comm, nullptr);  // no group
    // every rank sends 8 bytes to the next, but rank 0 expects 4 from rank 2: all are told
    (void)ncclGroupStart();
    (void)ncclSend(d, 8, ncclUint8, (r + 1) % 3, comm, nullptr);
    (void)ncclRecv(d, r == 0 ? 4 : 8, ncclUint8, (r + 2) % 3, comm, nullptr);
    results[q][1] = ncclGroupEnd();
    (void)ncclGroupStart();
    results[q][2] = ncclSend(d, 8, ncclUint8, 3, comm, nullptr);                // no rank 3
    results[q][3] = ncclAllReduce(d, d, 2, ncclFloat, ncclSum, comm, nullptr);  // a collective in a group
    results[q][4] = ncclGroupEnd();                                             // nothing queued: returns at once
    (void)cudaFree(d);
  });
  for (std::size_t r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(results[r] == std::array<ncclResult_t, 5>{ncclInvalidUsage, ncclInvalidUsage, ncclInvalidArgument,
                                                    ncclInvalidUsage, ncclSuccess});
  }
  CHECK(ncclGroupEnd() == ncclInvalidUsage);  // no group open
}
