// SPDX-License-Identifier: Apache-2.0
#include <bellows/cpu/executor.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

TEST_CASE("executor: every task runs exactly once, for any thread count") {
  for (unsigned threads : {1u, 2u, 3u, 8u}) {
    CAPTURE(threads);
    bellows::cpu::executor exec(threads);
    CHECK(exec.threads() == threads);
    for (std::size_t tasks : {0u, 1u, 5u, 1000u}) {
      std::vector<std::atomic<int>> hits(tasks);
      for (int round = 0; round < 3; ++round) exec.parallel_for(tasks, [&](std::size_t t) { ++hits[t]; });
      for (std::size_t t = 0; t < tasks; ++t) CHECK(hits[t] == 3);
    }
  }
  CHECK(bellows::cpu::executor(0).threads() >= 1);
  CHECK(&bellows::cpu::executor::shared() == &bellows::cpu::executor::shared());
}

TEST_CASE("executor: the first exception of a task reaches the caller, and the pool survives") {
  bellows::cpu::executor exec(3);
  CHECK_THROWS_WITH_AS(exec.parallel_for(100,
                                         [](std::size_t t) {
                                           if (t == 37) throw std::runtime_error("task 37 failed");
                                         }),
                       "task 37 failed", std::runtime_error);
  std::atomic<int> count{0};
  exec.parallel_for(100, [&](std::size_t) { ++count; });
  CHECK(count == 100);
}

TEST_CASE("executor: several threads may call one executor at once") {
  bellows::cpu::executor exec(2);
  std::vector<std::thread> callers;
  std::vector<long> sums(4, 0);
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      for (int round = 0; round < 50; ++round) {
        std::vector<long> part(64, 0);
        exec.parallel_for(64, [&](std::size_t t) { part[t] = static_cast<long>(t); });
        for (long p : part) sums[static_cast<std::size_t>(c)] += p;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (long s : sums) CHECK(s == 50L * (63 * 64 / 2));
}
