// SPDX-License-Identifier: Apache-2.0
#include <bellows/collectives/counting.hpp>
#include <bellows/collectives/local.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "../support/alltoall_blocks.hpp"

using bellows::collectives::alpha_beta;
using bellows::collectives::counting;
using bellows::collectives::local;
using bellows::collectives::local_group;

static_assert(bellows::AlltoallCollective<counting<local>>, "counting<local> must be an AlltoallCollective");
static_assert(!bellows::AlltoallCollective<counting<bellows::archetypes::collective>>,
              "counting offers alltoall only where its inner collective has it");

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
    // the ring's reduce-scatter and allgather each deliver (W-1)/W of the 4000 bytes: 6000 a call
    ok = ok && c.allreduce().bytes_received == 2 * 6000;
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

TEST_CASE("counting: an alltoall is forwarded, counts the other ranks' blocks and models a pairwise exchange and "
          "Bruck's") {
  const alpha_beta link{1e-5, 1e9};
  for (std::size_t w : {1u, 3u, 5u}) {
    CAPTURE(w);
    local_group group(w);
    std::atomic<int> right{0};
    group.run([&](local& inner) {
      counting<local> c(inner, link);
      bellows::gather_buffer out;
      const bellows::testing::alltoall_send send(c.rank(), w, 0);
      c.alltoall(send.blocks, send.sizes, out);
      std::size_t sent = 0, received = 0;  // brute force: the other ranks' blocks, both ways
      for (std::size_t r = 0; r < w; ++r)
        if (r != c.rank()) {
          sent += bellows::testing::alltoall_size(c.rank(), r, 0);
          received += bellows::testing::alltoall_size(r, c.rank(), 0);
        }
      const double modeled = w == 1 ? 0.0 : (w - 1) * 1e-5 + std::max(sent, received) / 1e9;
      const bool ok =
          bellows::testing::alltoall_received(out, c.rank(), w, 0) && c.alltoall().calls == 1 &&
          c.alltoall().bytes_sent == sent && c.alltoall().bytes_received == received &&
          std::abs(c.alltoall().modeled_s - modeled) < 1e-15 &&
          c.alltoall().modeled_cheapest_s ==
              bellows::collectives::model_alltoall(static_cast<double>(sent), static_cast<double>(received), w, link)
                  .cheapest_s &&
          c.total().calls == 1 && c.total().bytes_received == received;
      if (ok) ++right;
    });
    CHECK(right == static_cast<int>(w));
  }
}

TEST_CASE("counting: Bruck's alltoall, against its steps counted one by one, is the cheaper where blocks are small") {
  const alpha_beta link{3e-5, 1.25e9};  // 10 GbE
  for (std::size_t w : {2u, 3u, 4u, 5u, 7u, 8u, 64u, 100u, 1024u}) {
    CAPTURE(w);
    const double bytes = 1000.0 * static_cast<double>(w - 1);  // 1000 bytes to each other rank
    // Brute force: step j (2^j < w) forwards, from every rank, the blocks whose distance has bit j
    // set; a rank sends and receives as many blocks in each step.
    double steps = 0, forwarded = 0;
    for (std::size_t bit = 1; bit < w; bit <<= 1, ++steps)
      for (std::size_t d = 1; d < w; ++d)
        if ((d & bit) != 0) forwarded += 1000.0;
    const double bruck = steps * link.latency_s + forwarded / link.bandwidth_bytes_per_s;
    const double pairwise = static_cast<double>(w - 1) * link.latency_s + bytes / link.bandwidth_bytes_per_s;
    const auto t = bellows::collectives::model_alltoall(bytes, bytes, w, link);
    CHECK(t.ring_s == doctest::Approx(pairwise).epsilon(1e-12));
    CHECK(t.cheapest_s == doctest::Approx(std::min(pairwise, bruck)).epsilon(1e-12));
    // Blocks of 1000 bytes cost less than a latency: from 4 ranks on, Bruck's saves more latencies
    // than its extra steps cost (at 2 and 3 the two are one algorithm); blocks of 1 MB, pairwise.
    if (w >= 4) CHECK(t.cheapest_s < t.ring_s);
    const double big = 1e6 * static_cast<double>(w - 1);
    const auto large = bellows::collectives::model_alltoall(big, big, w, link);
    CHECK(large.cheapest_s == doctest::Approx(large.ring_s).epsilon(1e-12));
  }
  // The larger of sent and received sets the bytes' term.
  const auto skew = bellows::collectives::model_alltoall(100.0, 7e6, 4, link);
  CHECK(skew.ring_s == doctest::Approx(3 * 3e-5 + 7e6 / 1.25e9).epsilon(1e-12));
}

TEST_CASE("counting: one rank models no time, and a bad link is refused") {
  bellows::archetypes::collective solo;
  counting<bellows::archetypes::collective> c(solo, {1.0, 1.0});
  std::vector<float> x(10);
  c.allreduce_sum(x);
  CHECK(c.allreduce().modeled_s == 0.0);
  CHECK(c.allreduce().bytes_sent == 40);
  CHECK(c.allreduce().bytes_received == 0);
  CHECK_THROWS_AS(counting<bellows::archetypes::collective>(solo, {-1.0, 1.0}), bellows::error);
  CHECK_THROWS_AS(counting<bellows::archetypes::collective>(solo, {0.0, 0.0}), bellows::error);
}

TEST_CASE("counting: the cheapest algorithm by message size, beside the ring") {
  const alpha_beta link{30e-6, 1.25e9};  // 10 GbE
  const double a = link.latency_s;
  auto t = [&](double bytes) { return bytes / link.bandwidth_bytes_per_s; };
  auto near = [](double x, double y) { return std::abs(x - y) <= 1e-12 * std::max(1.0, std::abs(y)); };
  // 64 ranks: a small buffer by recursive doubling (6 steps), a large one by Rabenseifner's
  // (12 latencies, the ring's bandwidth term); the ring's figure beside it.
  auto small = bellows::collectives::model_allreduce(4, 64, link);
  CHECK(near(small.ring_s, 126 * a + 2 * 63.0 / 64 * t(4)));
  CHECK(near(small.cheapest_s, 6 * (a + t(4))));
  auto large = bellows::collectives::model_allreduce(100e6, 64, link);
  CHECK(near(large.cheapest_s, 12 * a + 2 * 63.0 / 64 * t(100e6)));
  CHECK(large.cheapest_s < large.ring_s);
  // 5 ranks, not a power of two: the 4-rank algorithms and two more transfers of the buffer
  auto five = bellows::collectives::model_allreduce(4, 5, link);
  CHECK(near(five.cheapest_s, 2 * (a + t(4)) + 2 * (a + t(4))));
  // 2 ranks: recursive doubling swaps the buffer once, in one latency; the ring takes two
  auto two = bellows::collectives::model_allreduce(1e9, 2, link);
  CHECK(near(two.ring_s, 2 * a + t(1e9)));
  CHECK(near(two.cheapest_s, a + t(1e9)));
  // allgather: Bruck's ceil(log2 W) latencies; broadcast: a binomial tree for small buffers
  CHECK(near(bellows::collectives::model_allgather(1000, 64, link).cheapest_s, 6 * a + t(1000)));
  CHECK(near(bellows::collectives::model_allgather(1000, 5, link).cheapest_s, 3 * a + t(1000)));
  CHECK(near(bellows::collectives::model_broadcast(8, 64, link).cheapest_s, 6 * (a + t(8))));
  CHECK(near(bellows::collectives::model_broadcast(1e9, 64, link).cheapest_s, 63 * a + t(1e9)));
  CHECK(bellows::collectives::model_allreduce(1e6, 1, link).cheapest_s == 0.0);

  // counting adds both up per call
  local_group group(4);
  std::atomic<int> right{0};
  group.run([&](local& inner) {
    counting<local> c(inner, link);
    std::vector<float> x(10);
    c.allreduce_sum(x);
    c.allreduce_sum(x);
    const auto one = bellows::collectives::model_allreduce(40, 4, link);
    if (near(c.allreduce().modeled_cheapest_s, 2 * one.cheapest_s) && near(c.allreduce().modeled_s, 2 * one.ring_s) &&
        near(c.total().modeled_cheapest_s, 2 * one.cheapest_s) && one.cheapest_s < one.ring_s)
      ++right;
  });
  CHECK(right == 4);
}
