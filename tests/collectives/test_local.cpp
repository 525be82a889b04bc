// SPDX-License-Identifier: Apache-2.0
#include <bellows/collectives/local.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

#include "../support/random.hpp"

using bellows::collectives::local;
using bellows::collectives::local_group;

namespace {
std::vector<float> rank_data(std::size_t rank, std::size_t n) {
  return bellows::testing::normal_floats(n, 1000 + rank);
}
}  // namespace

TEST_CASE("local allreduce_sum: the rank-order sum, bit-identical on every rank and every run") {
  for (std::size_t w : {1u, 2u, 3u, 8u}) {
    CAPTURE(w);
    for (std::size_t n : {0u, 1u, 7u, 1000u, 65537u}) {
      CAPTURE(n);
      // Reference: ((x0 + x1) + x2) + ..., in float, in rank order.
      std::vector<float> expected = rank_data(0, n);
      for (std::size_t r = 1; r < w; ++r) {
        const auto x = rank_data(r, n);
        for (std::size_t i = 0; i < n; ++i) expected[i] += x[i];
      }
      for (int run = 0; run < 2; ++run) {
        std::vector<std::vector<float>> results(w);
        local_group group(w);
        group.run([&](local& c) {
          CHECK(c.size() == w);
          auto x = rank_data(c.rank(), n);
          c.allreduce_sum(x);
          c.allreduce_sum(std::span<float>());  // zero-length operations are legal
          results[c.rank()] = x;
        });
        for (std::size_t r = 0; r < w; ++r)
          CHECK((n == 0 || std::memcmp(results[r].data(), expected.data(), n * sizeof(float)) == 0));
      }
    }
  }
}

TEST_CASE("local allgather: variable-size blocks in rank order, on every rank") {
  for (std::size_t w : {1u, 2u, 3u, 8u}) {
    CAPTURE(w);
    local_group group(w);
    std::atomic<int> right{0};
    group.run([&](local& c) {
      bellows::gather_buffer out;
      for (int round = 0; round < 3; ++round) {
        // Rank r sends (r + round) % 4 * 5 bytes (some blocks empty), each byte r * 16 + round.
        const std::size_t len = (c.rank() + static_cast<std::size_t>(round)) % 4 * 5;
        std::vector<std::byte> mine(len, std::byte(c.rank() * 16 + static_cast<std::size_t>(round)));
        c.allgather(mine, out);
        bool ok = out.blocks() == w;
        for (std::size_t r = 0; r < w && ok; ++r) {
          const auto b = out.block(r);
          ok = b.size() == (r + static_cast<std::size_t>(round)) % 4 * 5 &&
               reinterpret_cast<std::uintptr_t>(b.data()) % bellows::gather_buffer::alignment == 0;
          for (std::byte x : b) ok = ok && x == std::byte(r * 16 + static_cast<std::size_t>(round));
        }
        if (ok) ++right;
      }
    });
    CHECK(right == static_cast<int>(3 * w));
  }
}

TEST_CASE("local broadcast: every rank gets the root's bytes") {
  local_group group(3);
  std::atomic<int> right{0};
  group.run([&](local& c) {
    std::vector<std::byte> data(9, std::byte(c.rank() + 1));
    c.broadcast(data, 2);
    bool ok = true;
    for (std::byte b : data) ok = ok && b == std::byte{3};
    if (ok) ++right;
  });
  CHECK(right == 3);
}

TEST_CASE("local: a worker that throws makes the others fail instead of hang") {
  for (std::size_t w : {2u, 3u, 8u}) {
    CAPTURE(w);
    local_group group(w);
    std::atomic<int> others_failed{0};
    CHECK_THROWS_WITH_AS(group.run([&](local& c) {
      std::vector<float> x(16, 1.0f);
      c.allreduce_sum(x);  // one successful round first
      if (c.rank() == w - 1) throw std::runtime_error("out of memory in the forward pass");
      try {
        c.allreduce_sum(x);
        c.allreduce_sum(x);
      } catch (const bellows::collective_error&) {
        ++others_failed;
        throw;
      }
    }),
                         "out of memory in the forward pass", std::runtime_error);
    CHECK(others_failed == static_cast<int>(w - 1));

    // The group is usable again for a new run.
    group.run([](local& c) {
      std::vector<float> x(4, 1.0f);
      c.allreduce_sum(x);
    });
  }
}

TEST_CASE("local: ranks that disagree on the operation or length all get collective_error") {
  local_group group(3);
  std::atomic<int> failed{0};
  CHECK_THROWS_AS(group.run([&](local& c) {
    try {
      std::vector<float> x(c.rank() == 1 ? 5 : 4, 1.0f);
      c.allreduce_sum(x);
    } catch (const bellows::collective_error&) {
      ++failed;
      throw;
    }
  }),
                  bellows::collective_error);
  CHECK(failed == 3);

  failed = 0;
  CHECK_THROWS_AS(group.run([&](local& c) {
    try {
      if (c.rank() == 0) {
        bellows::gather_buffer out;
        c.allgather({}, out);
      } else {
        std::vector<float> x(4, 1.0f);
        c.allreduce_sum(x);
      }
    } catch (const bellows::collective_error&) {
      ++failed;
      throw;
    }
  }),
                  bellows::collective_error);
  CHECK(failed == 3);
}

TEST_CASE("local: threads started by the caller through member()") {
  local_group group(2);
  std::vector<float> a(3, 1.0f), b(3, 2.0f);
  std::thread t([&] {
    local c = group.member(1);
    c.allreduce_sum(b);
  });
  local c0 = group.member(0);
  c0.allreduce_sum(a);
  t.join();
  CHECK(a == std::vector<float>(3, 3.0f));
  CHECK(b == a);
  CHECK_THROWS_AS((void)group.member(2), bellows::error);
  CHECK_THROWS_AS(local_group(0), bellows::error);
}
