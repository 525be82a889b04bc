// SPDX-License-Identifier: Apache-2.0
#include <bellows/collectives/local.hpp>
#include <bellows/compressors/identity.hpp>
#include <bellows/core/gather_buffer.hpp>
#include <bellows/cpu/elementwise.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <vector>

#include "../support/random.hpp"

TEST_CASE("identity: the exact average, divided by W, with its traffic") {
  for (std::size_t w : {1u, 2u, 3u, 8u}) {
    CAPTURE(w);
    const std::size_t n = 777;
    // Reference: rank-order float sum, then division by W.
    std::vector<float> expected = bellows::testing::normal_floats(n, 0);
    for (std::size_t r = 1; r < w; ++r) {
      const auto x = bellows::testing::normal_floats(n, r);
      for (std::size_t i = 0; i < n; ++i) expected[i] += x[i];
    }
    for (float& e : expected) e /= static_cast<float>(w);
    bellows::collectives::local_group group(w);
    std::atomic<int> right{0};
    group.run([&](bellows::collectives::local& comm) {
      bellows::identity<> c;
      auto st = c.make_state({0, "fc", bellows::shape{7, 111}});
      CHECK(c.rounds(st, w) == bellows::exchange_rounds{{bellows::collective_op::allreduce_sum, 4},
                                                        {bellows::collective_op::allreduce_sum, 4 * n}});
      auto x = bellows::testing::normal_floats(n, comm.rank());
      const auto r = c.reduce(st, x, comm);
      const bool ok = x == expected && r.status == bellows::step_status::ok && st.step == 1 &&
                      r.sent == bellows::traffic{4 + 4 * n, 1 + n, n};
      if (ok) ++right;
    });
    CHECK(right == static_cast<int>(w));
  }
}

TEST_CASE("identity: encode and decode_add round-trip exactly") {
  bellows::identity<> c;
  const auto st = c.make_state({2, "emb", bellows::shape{3, 5}});
  const auto x = bellows::testing::normal_floats(15, 3);
  std::vector<std::uint64_t> storage((c.max_payload_bytes(st) + 7) / 8);
  const auto payload = c.encode(st, x, std::as_writable_bytes(std::span(storage)));
  CHECK(payload.size() == c.max_payload_bytes(st));
  std::vector<float> acc(15, 1.0f);
  CHECK(c.decode_add(st, payload, acc) == bellows::step_status::ok);
  for (std::size_t i = 0; i < 15; ++i) CHECK(acc[i] == 1.0f + x[i]);
  std::vector<float> wrong(14);
  CHECK_THROWS_AS((void)c.decode_add(st, payload, wrong), bellows::error);
}

TEST_CASE("identity: averaging the allgathered payloads equals the allreduce average") {
  const std::size_t w = 3, n = 100;
  bellows::collectives::local_group group(w);
  std::atomic<int> right{0};
  group.run([&](bellows::collectives::local& comm) {
    bellows::cpu::executor exec(1);
    bellows::identity<> c(exec);
    auto st = c.make_state({0, "fc", bellows::shape{n}});
    auto x = bellows::testing::normal_floats(n, comm.rank());
    auto y = x;
    std::vector<std::uint64_t> storage((c.max_payload_bytes(st) + 7) / 8);
    const auto mine = c.encode(st, x, std::as_writable_bytes(std::span(storage)));
    bellows::gather_buffer gathered;
    comm.allgather(mine, gathered);
    bool all_ok = gathered.blocks() == w;
    for (std::size_t r = 0; r < gathered.blocks(); ++r)
      all_ok &= c.validate(st, gathered.block(r)) == bellows::step_status::ok;
    bellows::cpu::fill(exec, x, 0.0f);
    for (std::size_t r = 0; r < gathered.blocks(); ++r)
      all_ok &= c.decode_add(st, gathered.block(r), x) == bellows::step_status::ok;
    bellows::cpu::divide(exec, x, static_cast<float>(w));
    (void)c.reduce(st, y, comm);
    // 0 + x0 + x1 + x2 equals x0 + x1 + x2 exactly, so both paths give the same bits.
    if (all_ok && x == y) ++right;
  });
  CHECK(right == static_cast<int>(w));
}
