// SPDX-License-Identifier: Apache-2.0
// The embedded collective: W workers as threads of one process.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bellows/concepts.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/gather_buffer.hpp"

namespace bellows::collectives {

class local;

/// A group of W workers that exchange through shared memory. Each worker holds a `local`
/// (from `member(rank)`, or handed to it by `run`). Sums are taken in rank order, so every rank
/// gets the same bits, run after run. No worker waits forever in an operation:
///  - when a worker fails, `abort` makes every operation of every other worker, waiting or
///    future, throw bellows::collective_error;
///  - a worker leaves the group when its `local` is destroyed (in `run`: when its function
///    returns); an operation that waits for it, or begins after it left, throws
///    collective_error naming it. Once every worker has left, the group starts afresh;
///  - with a timeout, a worker that waits longer than that for the others to arrive in an
///    operation aborts the group, naming the workers that had not arrived.
class local_group {
public:
  explicit local_group(std::size_t workers) : workers_(workers), posts_(workers), arrived_in_(workers), gone_(workers) {
    BELLOWS_EXPECTS(workers >= 1, "local_group: at least one worker, got ", workers);
  }
  /// As above, and a worker that waits more than `timeout` for the others to arrive in an
  /// operation aborts the group.
  local_group(std::size_t workers, std::chrono::milliseconds timeout) : local_group(workers) {
    BELLOWS_EXPECTS(timeout.count() > 0, "local_group: the timeout must be positive, got ", timeout.count(), " ms");
    timeout_ = timeout;
  }
  local_group(const local_group&) = delete;
  local_group& operator=(const local_group&) = delete;

  [[nodiscard]] std::size_t size() const noexcept { return workers_; }

  /// The handle of worker `rank`, for callers that start the threads themselves. Destroying it
  /// leaves the group: keep it for as long as the worker takes part. A rank that left stays gone
  /// until every rank has left.
  [[nodiscard]] local member(std::size_t rank);

  /// Runs fn(local&) on `size()` new threads, one per rank, and waits for all. If any worker
  /// throws, the group is aborted (the others' operations throw) and the first exception is
  /// rethrown here once every thread has ended. A worker whose function returns leaves the
  /// group. The group is reset before the run.
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
  enum class op : unsigned char { allreduce, allgather, broadcast, alltoall };
  struct post {
    op kind{};
    void* data = nullptr;
    std::size_t bytes = 0;
    std::size_t root = 0;
    const std::size_t* sizes = nullptr;  // alltoall's block sizes
  };
  /// The two barriers of an operation: every rank has posted (arrival), every rank is done with
  /// the others' buffers (completion). Only the first may time out: past it, the others may be
  /// reading or writing this rank's buffers, which must live until they are done.
  enum class barrier : unsigned char { arrival, completion };

  void reset() {
    std::lock_guard lock(mutex_);
    reset_locked();
  }

  void reset_locked() {
    aborted_ = false;
    why_.clear();
    arrived_ = 0;
    ++generation_;  // no rank has arrived in the next barrier, whatever arrived_in_ holds
    left_ = 0;
    std::fill(gone_.begin(), gone_.end(), false);
  }

  /// Rank `rank` leaves (`how`: why, for the others' errors); the last to leave resets the group.
  void leave(std::size_t rank, const char* how) {
    {
      std::lock_guard lock(mutex_);
      if (gone_[rank]) return;
      if (++left_ == workers_) {
        reset_locked();
        return;
      }
      gone_[rank] = true;
      if (left_ == 1) {
        first_gone_ = rank;
        first_gone_how_ = how;
      }
    }
    cv_.notify_all();
  }

  /// Rank `rank` cannot go on in operation `name`: the group was aborted, or a rank left.
  [[noreturn]] void fail_waiting(std::size_t rank, const char* name) const {
    if (aborted_) fail<collective_error>("local collective: the group was aborted (", why_, ")");
    fail<collective_error>("local collective: rank ", first_gone_, " left the group (", first_gone_how_,
                           ") while rank ", rank, " waits in ", name);
  }

  /// Rank `rank` waited `timeout_` in generation `gen`'s arrival: aborts naming the absent ranks.
  [[noreturn]] void time_out(std::size_t rank, const char* name, std::size_t gen) {
    std::string absent;
    std::size_t count = 0;
    for (std::size_t r = 0; r < workers_; ++r) {
      if (arrived_in_[r] == gen) continue;
      absent += detail::concat(count++ == 0 ? "" : ", ", r);
    }
    aborted_ = true;
    why_ = detail::concat(name, " timed out after ", timeout_.count(), " ms: ", count == 1 ? "rank " : "ranks ", absent,
                          " had not arrived (rank ", rank, " waited)");
    cv_.notify_all();
    fail_waiting(rank, name);
  }

  void wait_all(std::size_t rank, const char* name, barrier which) {
    std::unique_lock lock(mutex_);
    if (aborted_ || left_ != 0) fail_waiting(rank, name);
    const std::size_t gen = generation_;
    if (++arrived_ == workers_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    arrived_in_[rank] = gen;
    // A rank that left after this barrier released everyone does not fail the others: the
    // generation is checked first.
    const auto released = [&] { return generation_ != gen || aborted_ || left_ != 0; };
    if (which == barrier::arrival && timeout_.count() > 0) {
      if (!cv_.wait_for(lock, timeout_, released)) time_out(rank, name, gen);
    } else {
      cv_.wait(lock, released);
    }
    if (generation_ == gen) fail_waiting(rank, name);
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
  std::chrono::milliseconds timeout_{0};  // zero: no limit
  std::vector<post> posts_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::size_t arrived_ = 0;
  std::size_t generation_ = 1;
  std::vector<std::size_t> arrived_in_;  // per rank: the generation it last arrived in (0: none)
  bool aborted_ = false;
  std::string why_;
  std::size_t left_ = 0;    // how many ranks have left
  std::vector<bool> gone_;  // per rank: has it left
  std::size_t first_gone_ = 0;
  const char* first_gone_how_ = "";
};

/// One worker's view of a local_group; a Collective. Move-only: destroying it leaves the group;
/// a moved-from one leaves nothing and may only be destroyed.
class local {
public:
  local(local&& other) noexcept
      : group_(std::exchange(other.group_, nullptr)), rank_(other.rank_), how_(other.how_),
        sizes_(std::move(other.sizes_)) {}
  local(const local&) = delete;
  local& operator=(const local&) = delete;
  local& operator=(local&&) = delete;
  ~local() {
    if (group_ != nullptr) group_->leave(rank_, how_);
  }

  [[nodiscard]] std::size_t rank() const noexcept { return rank_; }
  [[nodiscard]] std::size_t size() const noexcept { return group_->workers_; }

  void allreduce_sum(std::span<float> v) {
    local_group& g = *group_;
    g.posts_[rank_] = {local_group::op::allreduce, v.data(), v.size_bytes(), 0};
    g.wait_all(rank_, "allreduce_sum", local_group::barrier::arrival);
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
    g.wait_all(rank_, "allreduce_sum", local_group::barrier::completion);
  }

  void allgather(std::span<const std::byte> mine, gather_buffer& out) {
    local_group& g = *group_;
    g.posts_[rank_] = {local_group::op::allgather, const_cast<std::byte*>(mine.data()), mine.size(), 0};
    g.wait_all(rank_, "allgather", local_group::barrier::arrival);
    g.check_posts(local_group::op::allgather, false, "allgather");
    sizes_.resize(g.workers_);
    for (std::size_t r = 0; r < g.workers_; ++r) sizes_[r] = g.posts_[r].bytes;
    out.resize(sizes_);
    for (std::size_t r = 0; r < g.workers_; ++r) {
      if (sizes_[r] != 0) std::memcpy(out.block(r).data(), g.posts_[r].data, sizes_[r]);
    }
    g.wait_all(rank_, "allgather", local_group::barrier::completion);
  }

  /// Block j of `blocks` (sizes[j] bytes) goes to rank j; `out` gets, at block i, what rank i
  /// sent to this rank (concepts.hpp, AlltoallCollective).
  void alltoall(std::span<const std::byte> blocks, std::span<const std::size_t> sizes, gather_buffer& out) {
    local_group& g = *group_;
    check_alltoall_blocks("local alltoall", blocks, sizes, g.workers_);
    g.posts_[rank_] = {local_group::op::alltoall, const_cast<std::byte*>(blocks.data()), blocks.size(), 0,
                       sizes.data()};
    g.wait_all(rank_, "alltoall", local_group::barrier::arrival);
    g.check_posts(local_group::op::alltoall, false, "alltoall");
    sizes_.resize(g.workers_);
    for (std::size_t r = 0; r < g.workers_; ++r) sizes_[r] = g.posts_[r].sizes[rank_];
    out.resize(sizes_);
    for (std::size_t r = 0; r < g.workers_; ++r) {
      const std::size_t* theirs = g.posts_[r].sizes;
      const std::size_t at = std::accumulate(theirs, theirs + rank_, std::size_t{0});
      if (sizes_[r] != 0)
        std::memcpy(out.block(r).data(), static_cast<const std::byte*>(g.posts_[r].data) + at, sizes_[r]);
    }
    g.wait_all(rank_, "alltoall", local_group::barrier::completion);
  }

  /// Every rank's `data` becomes rank `root`'s; all ranks pass the same length.
  void broadcast(std::span<std::byte> data, std::size_t root) {
    local_group& g = *group_;
    BELLOWS_EXPECTS(root < g.workers_, "broadcast: root ", root, " of ", g.workers_, " ranks");
    g.posts_[rank_] = {local_group::op::broadcast, data.data(), data.size(), root};
    g.wait_all(rank_, "broadcast", local_group::barrier::arrival);
    g.check_posts(local_group::op::broadcast, true, "broadcast");
    if (rank_ != root && !data.empty()) std::memcpy(data.data(), g.posts_[root].data, data.size());
    g.wait_all(rank_, "broadcast", local_group::barrier::completion);
  }

private:
  friend class local_group;
  local(local_group& g, std::size_t rank, const char* how) : group_(&g), rank_(rank), how_(how) {}

  local_group* group_;
  std::size_t rank_;
  const char* how_;  // how it left, for the others' errors
  std::vector<std::size_t> sizes_;
};

static_assert(AlltoallCollective<local>, "the local collective must model AlltoallCollective");

inline local local_group::member(std::size_t rank) {
  BELLOWS_EXPECTS(rank < workers_, "local_group: rank ", rank, " of ", workers_, " workers");
  return local(*this, rank, "its local was destroyed");
}

template <class Fn>
void local_group::run(Fn&& fn) {
  reset();
  std::vector<std::exception_ptr> errors(workers_);
  std::vector<std::thread> threads;
  threads.reserve(workers_);
  for (std::size_t r = 0; r < workers_; ++r) {
    threads.emplace_back([this, r, &fn, &errors] {
      // Declared outside the try: a worker that throws aborts the group before it leaves.
      local self(*this, r, "its function returned");
      try {
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
