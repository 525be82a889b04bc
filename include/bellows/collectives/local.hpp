// SPDX-License-Identifier: Apache-2.0
// The embedded collective: W workers as threads of one process.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <exception>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bellows/concepts.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/gather_buffer.hpp"

namespace bellows::collectives {

class local;

/// A group of W workers that exchange through shared memory. Each worker holds a `local`
/// (from `member(rank)`, or handed to it by `run`). Sums are taken in rank order, so every rank
/// gets the same bits, run after run. When a worker fails, `abort` makes every operation of every
/// other worker, waiting or future, throw bellows::collective_error instead of hanging.
class local_group {
public:
  explicit local_group(std::size_t workers) : workers_(workers), posts_(workers) {
    BELLOWS_EXPECTS(workers >= 1, "local_group: at least one worker, got ", workers);
  }
  local_group(const local_group&) = delete;
  local_group& operator=(const local_group&) = delete;

  [[nodiscard]] std::size_t size() const noexcept { return workers_; }

  /// The handle of worker `rank`, for callers that start the threads themselves.
  [[nodiscard]] local member(std::size_t rank);

  /// Runs fn(local&) on `size()` new threads, one per rank, and waits for all. If any worker
  /// throws, the group is aborted (the others' operations throw) and the first exception is
  /// rethrown here once every thread has ended. The group is reset before the run.
  template <class Fn>
  void run(Fn&& fn);

  /// Marks the group failed: every pending and later operation throws collective_error.
  void abort(const std::string& why) {
    {
      std::lock_guard lock(mutex_);
      if (aborted_) return;
      aborted_ = true;
      why_ = why;
    }
    cv_.notify_all();
  }

private:
  friend class local;
  enum class op : unsigned char { allreduce, allgather, broadcast };
  struct post {
    op kind{};
    void* data = nullptr;
    std::size_t bytes = 0;
    std::size_t root = 0;
  };

  void reset() {
    std::lock_guard lock(mutex_);
    aborted_ = false;
    why_.clear();
    arrived_ = 0;
  }

  [[noreturn]] void throw_aborted() const {
    fail<collective_error>("local collective: the group was aborted (", why_, ")");
  }

  void wait_all() {
    std::unique_lock lock(mutex_);
    if (aborted_) throw_aborted();
    const std::size_t gen = generation_;
    if (++arrived_ == workers_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    if (generation_ == gen) throw_aborted();
  }

  /// After the first barrier: every rank checks that all posted the same operation and length.
  void check_posts(op kind, bool same_bytes, const char* name) {
    for (std::size_t r = 0; r < workers_; ++r) {
      if (posts_[r].kind != kind || (same_bytes && posts_[r].bytes != posts_[0].bytes) ||
          posts_[r].root != posts_[0].root) {
        const std::string why = detail::concat(name, ": rank ", r, " called a different operation or length (",
                                               posts_[r].bytes, " bytes) than rank 0 (", posts_[0].bytes, " bytes)");
        abort(why);
        fail<collective_error>("local collective: ", why);
      }
    }
  }

  std::size_t workers_;
  std::vector<post> posts_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::size_t arrived_ = 0;
  std::size_t generation_ = 0;
  bool aborted_ = false;
  std::string why_;
};

/// One worker's view of a local_group; a Collective.
class local {
public:
  [[nodiscard]] std::size_t rank() const noexcept { return rank_; }
  [[nodiscard]] std::size_t size() const noexcept { return group_->workers_; }

  void allreduce_sum(std::span<float> v) {
    local_group& g = *group_;
    g.posts_[rank_] = {local_group::op::allreduce, v.data(), v.size_bytes(), 0};
    g.wait_all();
    g.check_posts(local_group::op::allreduce, true, "allreduce_sum");
    // Rank r owns a slice of the elements: it sums them in rank order into rank 0's buffer,
    // then copies the sums to the others. Nobody else touches that slice in between.
    const std::size_t n = v.size(), w = g.workers_;
    const std::size_t lo = n * rank_ / w, hi = n * (rank_ + 1) / w;
    auto* acc = static_cast<float*>(g.posts_[0].data);
    for (std::size_t r = 1; r < w; ++r) {
      const auto* x = static_cast<const float*>(g.posts_[r].data);
      for (std::size_t i = lo; i < hi; ++i) acc[i] += x[i];
    }
    for (std::size_t r = 1; r < w; ++r) std::copy(acc + lo, acc + hi, static_cast<float*>(g.posts_[r].data) + lo);
    g.wait_all();
  }

  void allgather(std::span<const std::byte> mine, gather_buffer& out) {
    local_group& g = *group_;
    g.posts_[rank_] = {local_group::op::allgather, const_cast<std::byte*>(mine.data()), mine.size(), 0};
    g.wait_all();
    g.check_posts(local_group::op::allgather, false, "allgather");
    sizes_.resize(g.workers_);
    for (std::size_t r = 0; r < g.workers_; ++r) sizes_[r] = g.posts_[r].bytes;
    out.resize(sizes_);
    for (std::size_t r = 0; r < g.workers_; ++r) {
      if (sizes_[r] != 0) std::memcpy(out.block(r).data(), g.posts_[r].data, sizes_[r]);
    }
    g.wait_all();
  }

  /// Every rank's `data` becomes rank `root`'s; all ranks pass the same length.
  void broadcast(std::span<std::byte> data, std::size_t root) {
    local_group& g = *group_;
    BELLOWS_EXPECTS(root < g.workers_, "broadcast: root ", root, " of ", g.workers_, " ranks");
    g.posts_[rank_] = {local_group::op::broadcast, data.data(), data.size(), root};
    g.wait_all();
    g.check_posts(local_group::op::broadcast, true, "broadcast");
    if (rank_ != root && !data.empty()) std::memcpy(data.data(), g.posts_[root].data, data.size());
    g.wait_all();
  }

private:
  friend class local_group;
  local(local_group& g, std::size_t rank) : group_(&g), rank_(rank) {}

  local_group* group_;
  std::size_t rank_;
  std::vector<std::size_t> sizes_;
};

static_assert(Collective<local>, "the local collective must model Collective");

inline local local_group::member(std::size_t rank) {
  BELLOWS_EXPECTS(rank < workers_, "local_group: rank ", rank, " of ", workers_, " workers");
  return local(*this, rank);
}

template <class Fn>
void local_group::run(Fn&& fn) {
  reset();
  std::vector<std::exception_ptr> errors(workers_);
  std::vector<std::thread> threads;
  threads.reserve(workers_);
  for (std::size_t r = 0; r < workers_; ++r) {
    threads.emplace_back([this, r, &fn, &errors] {
      try {
        local self = member(r);
        fn(self);
      } catch (const std::exception& e) {
        errors[r] = std::current_exception();
        abort(detail::concat("worker ", r, " threw: ", e.what()));
      } catch (...) {
        errors[r] = std::current_exception();
        abort(detail::concat("worker ", r, " threw"));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // The root cause is the error that is not a consequence of the abort, if there is one.
  std::exception_ptr first;
  for (const std::exception_ptr& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const collective_error&) {
      if (!first) first = e;
    } catch (...) {
      std::rethrow_exception(e);
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace bellows::collectives
