// SPDX-License-Identifier: Apache-2.0
#include <bellows/collectives/local.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../support/alltoall_blocks.hpp"
#include "../support/random.hpp"

using bellows::collectives::local;
using bellows::collectives::local_group;

namespace {
std::vector<float> rank_data(std::size_t rank, std::size_t n) {
  return bellows::testing::normal_floats(n, 1000 + rank);
}

using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

/// Returns once all `w` threads have called it: a short timeout then measures the test's delays,
/// not how long the threads took to start.
void all_started(std::atomic<std::size_t>& started, std::size_t w) {
  ++started;
  while (started < w) std::this_thread::yield();
}

/// One run of the group in which every rank sums rank + 1: true if every rank got the sum.
bool sums_in_a_run(local_group& group) {
  const std::size_t w = group.size();
  std::atomic<std::size_t> right{0}, started{0};
  group.run([&](local& c) {
    all_started(started, w);
    std::vector<float> x(5, static_cast<float>(c.rank() + 1));
    c.allreduce_sum(x);
    if (x == std::vector<float>(5, static_cast<float>(w * (w + 1) / 2))) ++right;
  });
  return right == w;
}

/// The messages of the collective_errors the ranks caught, under a lock.
struct messages {
  std::mutex mutex;
  std::vector<std::string> all;
  void add(const bellows::collective_error& e) {
    std::lock_guard lock(mutex);
    all.emplace_back(e.what());
  }
};
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

TEST_CASE("local alltoall: every rank gets, in rank order, the block each rank sent it; sizes that do not fit are "
          "refused") {
  for (std::size_t w : {1u, 2u, 3u, 5u, 8u}) {
    CAPTURE(w);
    local_group group(w);
    std::atomic<int> right{0};
    group.run([&](local& c) {
      bellows::gather_buffer out;
      for (std::size_t round = 0; round < 3; ++round) {
        const bellows::testing::alltoall_send send(c.rank(), w, round);
        c.alltoall(send.blocks, send.sizes, out);
        if (bellows::testing::alltoall_received(out, c.rank(), w, round)) ++right;
      }
    });
    CHECK(right == static_cast<int>(3 * w));
  }
  // refused before anything is posted: the rank that raises leaves, the others then raise too
  local_group group(2);
  CHECK_THROWS_WITH_AS(group.run([&](local& c) {
    bellows::gather_buffer out;
    const std::vector<std::byte> blocks(5);
    const std::vector<std::size_t> sizes = c.rank() == 0 ? std::vector<std::size_t>{2, 2} : std::vector<std::size_t>{5};
    c.alltoall(blocks, sizes, out);
  }),
                       doctest::Contains("local alltoall:"), bellows::error);
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

TEST_CASE("local: a rank that returns while the others wait in an operation makes them raise, naming it") {
  for (std::size_t w : {2u, 3u, 8u}) {
    CAPTURE(w);
    const std::size_t leaver = w - 1;
    local_group group(w);
    messages caught;
    std::atomic<int> in_time{0};
    // The others catch and return, so run itself succeeds: only the departure can fail them.
    group.run([&](local& c) {
      std::vector<float> x(8, 1.0f);
      c.allreduce_sum(x);  // every rank, leaver included, completes one operation
      if (c.rank() == leaver) {
        std::this_thread::sleep_for(100ms);  // the others are waiting by now
        return;
      }
      const auto start = clock_type::now();
      try {
        c.allreduce_sum(x);
      } catch (const bellows::collective_error& e) {
        if (clock_type::now() - start < 1s) ++in_time;
        caught.add(e);
      }
    });
    REQUIRE(caught.all.size() == w - 1);
    CHECK(in_time == static_cast<int>(w - 1));
    for (const std::string& m : caught.all) {
      CAPTURE(m);
      CHECK(m.find("rank " + std::to_string(leaver) + " left the group (its function returned)") != std::string::npos);
      CHECK(m.find("waits in allreduce_sum") != std::string::npos);
    }
    CHECK(sums_in_a_run(group));
  }

  // The others rethrow: run raises their collective_error, which names the rank that left.
  local_group group(3);
  CHECK_THROWS_WITH_AS(group.run([](local& c) {
    if (c.rank() == 1) return;
    bellows::gather_buffer out;
    c.allgather({}, out);
  }),
                       doctest::Contains("rank 1 left the group (its function returned)"), bellows::collective_error);
  CHECK(sums_in_a_run(group));
}

TEST_CASE("local: a rank that returned before the others enter their next operation makes it raise") {
  local_group group(4);
  messages caught;
  std::atomic<int> summed{0};
  CHECK_THROWS_WITH_AS(group.run([&](local& c) {
    std::vector<float> x(4, 1.0f);
    c.allreduce_sum(x);  // the leaver's last operation: it must succeed everywhere
    if (x == std::vector<float>(4, 4.0f)) ++summed;
    if (c.rank() == 0) return;
    std::this_thread::sleep_for(100ms);  // rank 0 has left by now
    std::vector<std::byte> data(3);
    try {
      c.broadcast(data, 1);
    } catch (const bellows::collective_error& e) {
      caught.add(e);
      throw;
    }
  }),
                       doctest::Contains("rank 0 left the group"), bellows::collective_error);
  CHECK(summed == 4);
  REQUIRE(caught.all.size() == 3);
  for (const std::string& m : caught.all) CHECK(m.find("rank 0 left the group") != std::string::npos);
  CHECK(sums_in_a_run(group));
}

TEST_CASE("local: ranks that return right after their last operation, after different local work, succeed") {
  // The leavers pass the last barrier and leave while the others are still being released by it.
  for (std::size_t w : {2u, 4u, 8u}) {
    CAPTURE(w);
    local_group group(w);
    for (int round = 0; round < 50; ++round) {
      std::atomic<std::size_t> right{0};
      group.run([&](local& c) {
        std::vector<float> x(16, static_cast<float>(c.rank()));
        for (int op = 0; op < 3; ++op) {
          // Some ranks compute a while before the operation, the others arrive at once.
          if ((c.rank() + static_cast<std::size_t>(op + round)) % 3 == 0) {
            volatile float spin = 0;
            for (int i = 0; i < 20000; ++i) spin = spin + 1.0f;
          }
          c.allreduce_sum(x);
        }
        // (0 + 1 + ... + w-1) w^2 after three sums.
        const auto want = static_cast<float>(w * (w - 1) / 2 * w * w);
        if (x == std::vector<float>(16, want)) ++right;
        if (c.rank() % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(c.rank()));
      });
      CHECK(right == w);
    }
  }
}

TEST_CASE("local: threads started by the caller through member(); one that destroys its local leaves the group") {
  local_group group(2);
  CHECK_THROWS_AS((void)group.member(2), bellows::error);
  CHECK_THROWS_AS(local_group(0), bellows::error);
  std::vector<float> a(3, 1.0f), b(3, 2.0f);

  // Rank 1 leaves after one operation; rank 0 enters another after it has gone.
  std::thread t([&] {
    local c = group.member(1);
    c.allreduce_sum(b);
  });
  {
    local c0 = group.member(0);
    c0.allreduce_sum(a);
    t.join();
    CHECK(a == std::vector<float>(3, 3.0f));
    CHECK(b == a);
    CHECK_THROWS_WITH_AS(c0.allreduce_sum(a),
                         "local collective: rank 1 left the group (its local was destroyed) while rank 0 waits "
                         "in allreduce_sum",
                         bellows::collective_error);
  }

  // Every rank left: the group starts afresh. Rank 1 leaves while rank 0 waits; a moved-from
  // local leaves nothing.
  std::thread u([&] {
    std::optional<local> held;
    {
      local c = group.member(1);
      held.emplace(std::move(c));
    }
    held->allreduce_sum(b);
    std::this_thread::sleep_for(100ms);
  });
  {
    local c0 = group.member(0);
    c0.allreduce_sum(a);
    CHECK(a == std::vector<float>(3, 6.0f));  // 3 + 3
    const auto start = clock_type::now();
    CHECK_THROWS_WITH_AS(c0.allreduce_sum(a), doctest::Contains("rank 1 left the group (its local was destroyed)"),
                         bellows::collective_error);
    CHECK(clock_type::now() - start < 1s);
    u.join();
  }

  // And once more, both ranks to the end.
  std::thread v([&] {
    local c = group.member(1);
    c.allreduce_sum(b);
  });
  {
    local c0 = group.member(0);
    std::vector<float> x(3, 1.0f);
    c0.allreduce_sum(x);
    CHECK(x == std::vector<float>(3, 7.0f));  // 1 + 6
  }
  v.join();
}

TEST_CASE("local: a rank later than the timeout makes the others raise, naming it and the operation") {
  local_group group(4, 50ms);
  messages caught;
  std::atomic<long long> waited_ms[2] = {-1, -1};  // ranks 0 and 1, in the second allreduce
  std::atomic<std::size_t> started{0};
  CHECK_THROWS_WITH_AS(group.run([&](local& c) {
    all_started(started, 4);
    std::vector<float> x(4, 1.0f);
    c.allreduce_sum(x);
    if (c.rank() >= 2) std::this_thread::sleep_for(300ms);
    const auto start = clock_type::now();
    try {
      c.allreduce_sum(x);
    } catch (const bellows::collective_error& e) {
      if (c.rank() < 2)
        waited_ms[c.rank()] = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start).count();
      caught.add(e);
      throw;
    }
  }),
                       doctest::Contains("allreduce_sum timed out after 50 ms: ranks 2, 3 had not arrived"),
                       bellows::collective_error);
  // The first to time out waited the timeout; the other was woken then, both well within 1 s.
  CHECK(std::max(waited_ms[0].load(), waited_ms[1].load()) >= 50);
  CHECK(std::min(waited_ms[0].load(), waited_ms[1].load()) >= 0);
  CHECK(std::max(waited_ms[0].load(), waited_ms[1].load()) < 1000);
  REQUIRE(caught.all.size() == 4);  // the late ranks find the group aborted
  for (const std::string& m : caught.all)
    CHECK(m.find("allreduce_sum timed out after 50 ms: ranks 2, 3 had not arrived") != std::string::npos);
  CHECK(sums_in_a_run(group));

  // One late rank, in an allgather.
  started = 0;
  CHECK_THROWS_WITH_AS(group.run([&](local& c) {
    all_started(started, 4);
    if (c.rank() == 1) std::this_thread::sleep_for(200ms);
    bellows::gather_buffer out;
    c.allgather({}, out);
  }),
                       doctest::Contains("allgather timed out after 50 ms: rank 1 had not arrived"),
                       bellows::collective_error);
  CHECK(sums_in_a_run(group));
  CHECK_THROWS_AS(local_group(2, 0ms), bellows::error);
}

TEST_CASE("local: the timeout does not fire when every rank arrives in time") {
  local_group group(4, 1000ms);
  std::atomic<int> right{0};
  group.run([&](local& c) {
    std::vector<float> x(6, 1.0f);
    for (int op = 0; op < 3; ++op) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10 * c.rank()));  // up to 30 ms late
      c.allreduce_sum(x);
    }
    if (x == std::vector<float>(6, 64.0f)) ++right;
  });
  CHECK(right == 4);
}
