// SPDX-License-Identifier: Apache-2.0
// collectives::staged<local>: the local collective's threads exchanging device memory through
// host buffers. Its sums, gathers and alltoalls are the local collective's bit for bit, host memory passes
// straight through, and misuse is refused. (The device Synchronizer over it runs as the CPU's:
// tests/cuda/test_synchronizer.cu.)
#include <bellows/collectives/local.hpp>
#include <bellows/collectives/staged.cuh>

#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "../support/alltoall_blocks.hpp"
#include "../support/random.hpp"
#include "device_test.cuh"

namespace {

constexpr std::size_t ranks = 3;

/// Runs body(rank, local) on `ranks` threads, each on a device of its own where there are
/// enough (the emulation has three), and counts the ranks on which it returned true.
template <class Body>
std::size_t on_threads(Body body) {
  std::atomic<std::size_t> right{0};
  bellows::collectives::local_group group(ranks);
  group.run([&](bellows::collectives::local& comm) {
    BELLOWS_CUDA_CHECK(cudaSetDevice(static_cast<int>(comm.rank() % bellows::cuda::device_count())));
    if (body(comm.rank(), comm)) ++right;
  });
  return right;
}

}  // namespace

TEST_CASE("cuda staged: the local collective's sums and gathers, for device and host memory" *
          doctest::skip(bellows::test::no_device())) {
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}}) {
    CAPTURE(n);
    std::vector<std::vector<float>> want(ranks);
    (void)on_threads([&](std::size_t rank, bellows::collectives::local& comm) {
      want[rank] = bellows::testing::normal_floats(n, rank + 7);
      comm.allreduce_sum(want[rank]);
      return true;
    });
    CHECK(on_threads([&](std::size_t rank, bellows::collectives::local& comm) {
            cudaStream_t stream = nullptr;
            BELLOWS_CUDA_CHECK(cudaStreamCreate(&stream));
            bool ok = true;
            {
              bellows::collectives::staged<bellows::collectives::local> coll(comm, stream);
              ok &= coll.rank() == rank && coll.size() == ranks && coll.stream() == stream;
              bellows::test::device_array<float> d(bellows::testing::normal_floats(n, rank + 7));
              coll.allreduce_sum(d.span());
              ok &= bellows::test::same_bytes(d.host(), want[rank]);
              std::vector<float> h = bellows::testing::normal_floats(n, rank + 7);  // host memory: as it is
              coll.allreduce_sum(h);
              ok &= bellows::test::same_bytes(h, want[rank]);
              // payloads of different lengths into slots of 8 + n bytes, and the host gather
              const std::size_t slot = 8 + n;
              std::vector<std::byte> mine(rank + n, static_cast<std::byte>(rank + 1));
              bellows::test::device_array<std::byte> payload(mine), slots(ranks * slot);
              coll.allgather_slots({payload.data(), mine.size()}, slots.span(), slot);
              const std::vector<std::byte> got = slots.host();
              for (std::size_t r = 0; r < ranks; ++r)
                for (std::size_t b = 0; b < r + n; ++b) ok &= got[r * slot + b] == static_cast<std::byte>(r + 1);
              bellows::gather_buffer out;
              coll.allgather(std::span<const std::byte>(payload.data(), mine.size()), out);
              for (std::size_t r = 0; r < ranks; ++r)
                ok &= out.block(r).size() == r + n &&
                      (r + n == 0 || out.block(r)[r + n - 1] == static_cast<std::byte>(r + 1));
              // alltoall blocks of 0 to 6 bytes from device memory, then from host memory
              for (std::size_t round = 0; round < 2; ++round) {
                const bellows::testing::alltoall_send send(rank, ranks, round + n);
                bellows::test::device_array<std::byte> d_send(send.blocks);
                coll.alltoall(round == 0 ? std::span<const std::byte>(d_send.span())
                                         : std::span<const std::byte>(send.blocks),
                              send.sizes, out);
                ok &= bellows::testing::alltoall_received(out, rank, ranks, round + n);
              }
              // a payload larger than its slot (here on every rank) is refused before anything moves
              if (n > 0) {
                try {
                  coll.allgather_slots({payload.data(), mine.size()}, slots.span(), 0);
                  ok = false;
                } catch (const bellows::error& e) {
                  ok &= std::string_view(e.what()).find("for slots of 0") != std::string_view::npos;
                }
              }
            }
            BELLOWS_CUDA_CHECK(cudaStreamDestroy(stream));
            return ok;
          }) == ranks);
  }
}
