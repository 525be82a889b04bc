// SPDX-License-Identifier: Apache-2.0
// The CPU executor: a fixed pool of threads that runs the tasks of a kernel.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "bellows/core/error.hpp"

namespace bellows::cpu {

/// Runs `parallel_for` loops on a pool of `threads() - 1` workers plus the calling thread.
/// Kernels cut their work into tasks whose boundaries do not depend on the thread count (fixed
/// chunk sizes), so results are bit-identical whatever the thread count. Several threads may
/// call one executor at once (the ranks of a local collective, say): a call that finds the pool
/// busy runs its tasks on its own thread, with the same results. No allocation per call.
class executor {
public:
  /// `threads` = 0 means all hardware threads.
  explicit executor(unsigned threads = 0)
      : threads_(threads != 0 ? threads : std::max(1u, std::thread::hardware_concurrency())) {
    workers_.reserve(threads_ - 1);
    for (unsigned t = 1; t < threads_; ++t) workers_.emplace_back([this] { work(); });
  }
  executor(const executor&) = delete;
  executor& operator=(const executor&) = delete;
  ~executor() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& w : workers_) w.join();
  }

  /// One executor per process that uses all cores, for callers that do not bring their own.
  static executor& shared() {
    static executor instance;
    return instance;
  }

  [[nodiscard]] unsigned threads() const noexcept { return threads_; }

  /// Every kernel has finished when it returns, so there is nothing to wait for; here for the
  /// code written once over executors (cuda::executor::synchronize waits for its stream).
  void synchronize() const noexcept {}

  /// Calls body(task) for every task in [0, tasks). The first exception thrown by a task is
  /// rethrown here after all tasks have finished or been skipped.
  template <class Body>
  void parallel_for(std::size_t tasks, Body&& body) {
    if (tasks == 0) return;
    using B = std::remove_reference_t<Body>;
    std::unique_lock busy(submit_, std::try_to_lock);
    if (tasks == 1 || threads_ == 1 || !busy.owns_lock()) {
      for (std::size_t t = 0; t < tasks; ++t) body(t);
      return;
    }
    {
      std::lock_guard lock(mutex_);
      job_ = {[](void* b, std::size_t t) { (*static_cast<B*>(b))(t); }, &body, tasks};
      next_.store(0, std::memory_order_relaxed);
      done_ = 0;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    run_tasks();
    std::unique_lock lock(mutex_);
    finished_.wait(lock, [&] { return done_ == threads_; });
    job_ = {};
    if (error_) std::rethrow_exception(error_);
  }

  /// Cuts [0, n) into ranges of `chunk` elements (the last may be shorter) and calls
  /// body(begin, end) for each, as parallel_for tasks.
  template <class Body>
  void for_chunks(std::size_t n, std::size_t chunk, Body&& body) {
    parallel_for((n + chunk - 1) / chunk, [&](std::size_t t) {
      const std::size_t begin = t * chunk;
      body(begin, std::min(n, begin + chunk));
    });
  }

private:
  struct job {
    void (*call)(void*, std::size_t) = nullptr;
    void* body = nullptr;
    std::size_t tasks = 0;
  };

  void run_tasks() {
    for (;;) {
      const std::size_t t = next_.fetch_add(1, std::memory_order_relaxed);
      if (t >= job_.tasks) break;
      try {
        job_.call(job_.body, t);
      } catch (...) {
        std::lock_guard lock(mutex_);
        if (!error_) error_ = std::current_exception();
        next_.store(job_.tasks, std::memory_order_relaxed);
      }
    }
    std::lock_guard lock(mutex_);
    if (++done_ == threads_) finished_.notify_one();
  }

  void work() {
    std::size_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
      }
      run_tasks();
    }
  }

  unsigned threads_;
  std::vector<std::thread> workers_;
  std::mutex submit_;  // held by the one caller whose loop the pool runs
  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  job job_{};
  std::atomic<std::size_t> next_{0};
  unsigned done_ = 0;
  std::size_t generation_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace bellows::cpu
