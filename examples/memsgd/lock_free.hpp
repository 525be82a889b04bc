// SPDX-License-Identifier: Apache-2.0
// The lock-free parallel Mem-SGD of the paper's multicore experiment: T threads share one weight
// vector x and no lock. Each thread repeatedly
//   takes the next global step number t (one relaxed fetch_add on a shared counter) and its sample,
//   reads x (every coordinate: the regulariser makes the gradient dense) to form g = grad f_i(x),
//   compresses it with its own top-k compressor and its own `scaled` error memory (its state,
//     rescaled by its previous over the new step size, exactly as in training.hpp),
//   and subtracts eta_t times the k kept values from the shared x.
//
// Memory model. Every access to the shared x goes through std::atomic_ref<float> with
// memory_order_relaxed: reads are relaxed loads, and each of the k writes is a relaxed
// fetch_sub, an atomic read-modify-write (a compare-and-swap loop on x86-64), so no update is
// ever lost and there is no data race in the C++ sense. What is not atomic is the whole step: a
// thread computes its gradient from a view of x in which other threads' writes may be partly
// visible (some coordinates already updated, others not), exactly the inconsistency Hogwild-style
// methods accept. A thread's error memory and compressor state are its own and never shared.
//
// Measurement. The threads start together; thread 0 copies x (relaxed loads) whenever the global
// step counter has passed the next of `snapshots` evenly spaced step counts, with the time. After
// the run, the loss of every copy is computed, and that of the running average of the copies,
// each weighted by (t + a)^2 times the steps since the previous copy (the sequential runs' average
// of the iterates, sampled at the copies). The last iterate is noisy; the time to a target is the
// time of the first copy whose average is at or below it. The processor time of the run is kept
// beside its wall time: on a shared machine their ratio says how many cores the threads got.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include <bellows/compressors/topk.hpp>
#include <bellows/core/error.hpp>
#include <bellows/core/shape.hpp>
#include <bellows/core/wire.hpp>
#include <bellows/cpu/executor.hpp>

#include "data.hpp"
#include "logistic.hpp"
#include "training.hpp"

namespace memsgd {

struct lock_free_config {
  std::size_t threads = 1;
  std::uint64_t steps = 0;  ///< in total, over all threads
  std::size_t k = 10;
  step_size eta;  ///< indexed by the global step number
  std::uint64_t seed = 1;
  std::size_t snapshots = 60;
};

struct lock_free_snapshot {
  double seconds = 0;
  std::uint64_t step = 0;    ///< the global step counter when the copy was taken
  double suboptimality = 0;  ///< f(x) - f* of the copy
  double averaged = 0;       ///< f - f* of the weighted average of the copies up to this one
};

struct lock_free_result {
  std::size_t threads = 0;
  std::uint64_t steps = 0;
  double seconds = 0;                         ///< from the common start until the last thread ended
  double cpu_seconds = 0;                     ///< processor time of the whole process over the same span (std::clock)
  std::vector<lock_free_snapshot> snapshots;  ///< the last one taken after every thread ended

  [[nodiscard]] double steps_per_second() const { return seconds > 0 ? static_cast<double>(steps) / seconds : 0.0; }
  /// Seconds until the first snapshot whose average is at or below `target`; negative when none.
  [[nodiscard]] double time_to(double target) const {
    for (const lock_free_snapshot& s : snapshots)
      if (s.averaged <= target) return s.seconds;
    return -1.0;
  }
};

[[nodiscard]] inline lock_free_result run_lock_free(const dataset& data, double lambda, double f_star,
                                                    const lock_free_config& cfg) {
  BELLOWS_EXPECTS(cfg.threads >= 1 && cfg.steps >= cfg.threads && cfg.snapshots >= 1 && cfg.k >= 1,
                  "memsgd: lock-free run needs threads >= 1, steps >= threads, snapshots >= 1 and k >= 1, got ",
                  cfg.threads, ", ", cfg.steps, ", ", cfg.snapshots, " and ", cfg.k);
  BELLOWS_EXPECTS(data.d < (std::uint64_t{1} << 32),
                  "memsgd: lock-free run reads 32-bit payload indices, d = ", data.d);
  const std::size_t d = data.d;
  std::vector<float> x(d, 0.0f);
  std::atomic<std::uint64_t> next_step{0};
  std::atomic<std::size_t> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::vector<float>> copies(cfg.snapshots, std::vector<float>(d));
  std::vector<lock_free_snapshot> taken;
  taken.reserve(cfg.snapshots + 1);
  std::chrono::steady_clock::time_point start;
  std::exception_ptr failure;
  std::mutex failure_mutex;

  const auto read = [&x](std::size_t j) { return std::atomic_ref<float>(x[j]).load(std::memory_order_relaxed); };
  const auto worker = [&](std::size_t rank) {
    bool counted = false;
    try {
      bellows::cpu::executor exec(1);
      bellows::topk<> comp({.k = static_cast<std::int64_t>(cfg.k), .feedback = bellows::feedback::scaled}, exec);
      auto st = comp.make_state({0, "weights", bellows::shape{d}});
      std::vector<float> g(d);
      double previous_eta = 0;
      ready.fetch_add(1);
      counted = true;
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      for (;;) {
        const std::uint64_t t = next_step.fetch_add(1, std::memory_order_relaxed);
        if (t >= cfg.steps) break;
        const double eta = cfg.eta.at(t);
        sample_gradient(data, lambda, sample_of(cfg.seed, t, data.n()), read, g);
        if (previous_eta > 0) comp.rescale(st, static_cast<float>(previous_eta), static_cast<float>(eta));
        previous_eta = eta;
        const std::span<const std::byte> payload = comp.stage(st, g);
        BELLOWS_EXPECTS(comp.validate(st, payload) == bellows::step_status::ok, "memsgd: thread ", rank,
                        ": non-finite gradient at step ", t);
        bellows::wire::reader entries(payload, bellows::topk_method::codec);
        const std::uint64_t count = entries.head().count;
        const std::span<const std::uint32_t> index = entries.array<std::uint32_t>(count);
        const std::span<const float> value = entries.array<float>(count);
        const auto step = static_cast<float>(eta);
        for (std::size_t e = 0; e < index.size(); ++e)
          std::atomic_ref<float>(x[index[e]]).fetch_sub(step * value[e], std::memory_order_relaxed);
        comp.commit(st);
        if (rank == 0 && taken.size() < cfg.snapshots && t >= (taken.size() + 1) * cfg.steps / (cfg.snapshots + 1)) {
          std::vector<float>& copy = copies[taken.size()];
          for (std::size_t j = 0; j < d; ++j) copy[j] = read(j);
          taken.push_back({std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                           next_step.load(std::memory_order_relaxed), 0.0});
        }
      }
    } catch (...) {
      const std::lock_guard lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next_step.store(cfg.steps, std::memory_order_relaxed);  // the others stop at their next step
      if (!counted) ready.fetch_add(1);
    }
  };

  std::vector<std::thread> pool;
  pool.reserve(cfg.threads);
  for (std::size_t r = 0; r < cfg.threads; ++r) pool.emplace_back(worker, r);
  while (ready.load() < cfg.threads) std::this_thread::yield();
  const std::clock_t cpu_start = std::clock();
  start = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (std::thread& th : pool) th.join();
  if (failure) std::rethrow_exception(failure);

  lock_free_result out;
  out.threads = cfg.threads;
  out.steps = cfg.steps;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.cpu_seconds = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
  taken.push_back({out.seconds, cfg.steps, 0.0, 0.0});
  std::vector<double> average(d, 0.0);
  double weight_sum = 0;
  std::uint64_t previous_step = 0;
  for (std::size_t s = 0; s < taken.size(); ++s) {
    const std::span<const float> copy = s + 1 < taken.size() ? copies[s] : x;  // the last: x at the end
    const double at = static_cast<double>(taken[s].step) + cfg.eta.shift;
    const double w = at * at * static_cast<double>(taken[s].step - previous_step);
    previous_step = taken[s].step;
    weight_sum += w;
    if (weight_sum > 0)
      for (std::size_t j = 0; j < d; ++j) average[j] += w / weight_sum * (static_cast<double>(copy[j]) - average[j]);
    taken[s].suboptimality = objective(data, lambda, copy) - f_star;
    taken[s].averaged = objective(data, lambda, std::span<const double>(average)) - f_star;
  }
  out.snapshots = std::move(taken);
  return out;
}

}  // namespace memsgd
