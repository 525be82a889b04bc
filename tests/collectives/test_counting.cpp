// SPDX-License-Identifier: Apache-2.0
#include <bellows/collectives/counting.hpp>
#include <bellows/collectives/local.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <vector>

using bellows::collectives::alpha_beta;
using bellows::collectives::counting;
using bellows::collectives::local;
using bellows::collectives::local_group;

static_assert(bellows::Collective<counting<local>>, "counting<local> must be a Collective");

TEST_CASE("counting: forwards every operation and counts bytes and modeled ring time") {
  const alpha_beta link{1e-5, 1e9};  // 10 us, 1 GB/s
  constexpr std::size_t w = 4;
  local_group group(w);
  std::atomic<int> right{0};
  group.run([&](local& inner) {
    counting<local> c(inner, link);
    CHECK(c.rank() == inner.rank());
    CHECK(c.size() == w);
    std::vector<float> x(1000, 1.0f);
    c.allreduce_sum(x);
    c.allreduce_sum(x);
    bool ok = x[0] == 16.0f;  // forwarded: 4 ranks, twice
    ok = ok && c.allreduce().calls == 2 && c.allreduce().bytes_sent == 8000;
    // 2 (W-1) alpha + 2 (W-1)/W B / beta per call
    const double one = 2 * 3 * 1e-5 + 2.0 * 3 / 4 * 4000 / 1e9;
    ok = ok && std::abs(c.allreduce().modeled_s - 2 * one) < 1e-15;

    bellows::gather_buffer out;
    std::vector<std::byte> mine(10 * (c.rank() + 1));
    c.allgather(mine, out);
    const std::size_t others = 10 + 20 + 30 + 40 - mine.size();
    ok = ok && c.allgather().calls == 1 && c.allgather().bytes_sent == mine.size() &&
         c.allgather().bytes_received == others;
    ok = ok && std::abs(c.allgather().modeled_s - (3 * 1e-5 + others / 1e9)) < 1e-15;

    std::vector<std::byte> b(100);
    c.broadcast(b, 0);
    ok = ok && c.broadcast().calls == 1 && c.broadcast().bytes_sent == (c.rank() == 0 ? 100u : 0u) &&
         c.broadcast().bytes_received == (c.rank() == 0 ? 0u : 100u);

    const auto t = c.total();
    ok = ok && t.calls == 4 &&
         t.bytes_sent == c.allreduce().bytes_sent + c.allgather().bytes_sent + c.broadcast().bytes_sent;
    c.reset();
    ok = ok && c.total().calls == 0 && c.total().modeled_s == 0.0;
    if (ok) ++right;
  });
  CHECK(right == static_cast<int>(w));
}

TEST_CASE("counting: one rank models no time, and a bad link is refused") {
  bellows::archetypes::collective solo;
  counting<bellows::archetypes::collective> c(solo, {1.0, 1.0});
  std::vector<float> x(10);
  c.allreduce_sum(x);
  CHECK(c.allreduce().modeled_s == 0.0);
  CHECK(c.allreduce().bytes_sent == 40);
  CHECK_THROWS_AS(counting<bellows::archetypes::collective>(solo, {-1.0, 1.0}), bellows::error);
  CHECK_THROWS_AS(counting<bellows::archetypes::collective>(solo, {0.0, 0.0}), bellows::error);
}
