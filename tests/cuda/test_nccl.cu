// SPDX-License-Identifier: Apache-2.0
// The NCCL collective on one rank per visible device (threads of this process; three on the CUDA
// emulation): sums, variable-size gathers and alltoalls from host and device memory against what
// each rank sent.
#include <bellows/collectives/nccl.cuh>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../support/alltoall_blocks.hpp"
#include "device_test.cuh"
#include "nccl_ranks.cuh"

namespace {

struct rank_result {
  bool reduced_device = false, reduced_host = false, gathered = false, slots = false, alltoall = false;
};

}  // namespace

TEST_CASE("nccl collective: allreduce_sum, allgather and alltoall, from host and device memory" *
          doctest::skip(bellows::test::no_device())) {
  const std::size_t w = static_cast<std::size_t>(bellows::cuda::device_count());
  std::vector<rank_result> results(w);
  bellows::test::on_every_device([&](std::size_t r, bellows::collectives::nccl& coll) {
    CHECK(coll.rank() == r);
    CHECK(coll.size() == w);
    rank_result& out = results[r];
    const std::size_t n = 1000 + 3;
    std::vector<float> mine(n), want(n, 0.0f);
    for (std::size_t i = 0; i < n; ++i) {
      mine[i] = static_cast<float>(r + 1) * static_cast<float>(i % 7);
      for (std::size_t q = 0; q < w; ++q) want[i] += static_cast<float>(q + 1) * static_cast<float>(i % 7);
    }
    bellows::test::device_array<float> d(mine);
    coll.allreduce_sum(d.span());
    out.reduced_device = d.host() == want;
    std::vector<float> h = mine;
    coll.allreduce_sum(h);
    out.reduced_host = h == want;

    // Rank q sends q + 1 bytes of value q + 5; from device memory on odd ranks.
    const std::vector<std::byte> block(r + 1, static_cast<std::byte>(r + 5));
    bellows::test::device_array<std::byte> d_block(block);
    bellows::gather_buffer got;
    coll.allgather(r % 2 == 1 ? std::span<const std::byte>(d_block.span()) : std::span<const std::byte>(block), got);
    bool same = got.blocks() == w;
    for (std::size_t q = 0; same && q < w; ++q)
      same = got.block(q).size() == q + 1 &&
             std::ranges::all_of(got.block(q), [&](std::byte b) { return b == static_cast<std::byte>(q + 5); });
    out.gathered = same;

    const std::size_t slot = w + 8;
    bellows::test::device_array<std::byte> slots(w * slot);
    coll.allgather_slots(d_block.span(), slots.span(), slot);
    const std::vector<std::byte> all = slots.host();
    same = true;
    for (std::size_t q = 0; q < w; ++q)
      for (std::size_t i = 0; i <= q; ++i) same = same && all[q * slot + i] == static_cast<std::byte>(q + 5);
    out.slots = same;

    // Two alltoalls (blocks of 0 to 6 bytes, tests/support/alltoall_blocks.hpp), from host memory
    // and then from device memory, into the same buffer.
    same = true;
    for (std::size_t round = 0; round < 2; ++round) {
      const bellows::testing::alltoall_send send(r, w, round);
      bellows::test::device_array<std::byte> d_send(send.blocks);
      coll.alltoall(round == 0 ? std::span<const std::byte>(send.blocks) : std::span<const std::byte>(d_send.span()),
                    send.sizes, got);
      same = same && bellows::testing::alltoall_received(got, r, w, round);
    }
    out.alltoall = same;
  });
  for (const rank_result& r : results) {
    CHECK(r.reduced_device);
    CHECK(r.reduced_host);
    CHECK(r.gathered);
    CHECK(r.slots);
    CHECK(r.alltoall);
  }
}
