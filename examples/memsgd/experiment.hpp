// SPDX-License-Identifier: Apache-2.0
// The whole reproduction: both data sets, the optimum of each, every sequential run, the
// lock-free runs, and the four claims of the paper checked against the results.
//
// Runs per data set (k in {1, 10, 100}, gamma = 2 unless chosen otherwise):
//   schedule "shifted":  eta_t = gamma / (lambda (t + a)), a = shift_factor d / k (SGD counts as k = d:
//                        a = shift_factor): SGD; top-k and rand-k, each with and without memory.
//   schedule "decaying": eta_t = gamma / (1 + gamma lambda t): SGD; top-1 and top-10 with memory;
//                        QSGD at 2, 4 and 8 bits.
// All runs of a data set draw the same samples. The sequential runs share the machine's cores
// (one run per core at a time); the lock-free runs come after them, alone, since they are timed.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <bellows/core/error.hpp>
#include <bellows/cpu/executor.hpp>

#include "data.hpp"
#include "fmnist/idx.hpp"
#include "lock_free.hpp"
#include "logistic.hpp"
#include "training.hpp"

namespace memsgd {

struct experiment_options {
  bool quick = false;
  std::filesystem::path fmnist_dir;  ///< empty: fmnist::data_dir()
  std::uint64_t seed = 1;
  double gamma = 2;
  double shift_factor = 1;  ///< a = shift_factor d / k in the shifted schedule
  std::vector<std::size_t> ks{1, 10, 100};
  std::vector<std::size_t>
      threads;        ///< lock-free thread counts, the first the baseline; empty: 1, 2, 4, ... up to the hardware's
  unsigned jobs = 0;  ///< sequential runs at a time; 0: hardware threads
  std::function<void(const std::string&)> log;  ///< progress lines, from any thread (serialised here)
};

/// What the scale of a mode is, per data set.
struct scale {
  double epochs = 1;            ///< sequential runs
  double lock_free_epochs = 1;  ///< total steps of a lock-free run, over all threads
  std::size_t lock_free_k = 10;
};

struct problem {
  dataset data;
  double lambda = 0;
  optimum best;
  double optimum_seconds = 0;
  scale size;
  [[nodiscard]] std::uint64_t steps() const {
    return static_cast<std::uint64_t>(size.epochs * static_cast<double>(data.n()));
  }
};

struct lock_free_study {
  std::size_t k = 0;
  step_size eta;
  double target = 0;  ///< the first run's averaged suboptimality at its middle snapshot
  std::vector<lock_free_result> runs;
};

struct claim {
  std::string name;
  bool held = false;
  std::string evidence;
};

struct dataset_results {
  std::string name;
  std::size_t n = 0, d = 0;
  double density = 0, positive = 0, lambda = 0;
  double f_star = 0, gap_bound = 0, optimum_seconds = 0;
  int optimum_iterations = 0;
  std::uint64_t steps = 0;
  double epochs = 0;
  std::vector<run_result> runs;
  lock_free_study lock_free;

  /// The run of `m` under `schedule`; raises bellows::error when there is none.
  [[nodiscard]] const run_result& find(const std::string& schedule, const method& m) const {
    for (const run_result& r : runs)
      if (r.schedule == schedule && r.how.label() == m.label()) return r;
    bellows::fail("memsgd: ", name, " has no run '", m.label(), "' under schedule ", schedule);
  }
};

struct experiment_results {
  experiment_options options;
  std::vector<dataset_results> datasets;
  std::vector<claim> claims;
  double seconds = 0;
  double load_before = 0, load_after = 0;  ///< 1-minute load average of the machine
  unsigned hardware_threads = 0;
};

inline constexpr const char* shifted_schedule = "shifted";
inline constexpr const char* decaying_schedule = "decaying";

/// The sequential runs of one data set, in the order of the file's header.
[[nodiscard]] inline std::vector<run_config> run_plan(const problem& p, const experiment_options& o) {
  std::vector<run_config> plan;
  const double d = static_cast<double>(p.data.d);
  const auto add = [&](method m, const char* schedule, step_size eta) {
    run_config c;
    c.how = m;
    c.schedule = schedule;
    c.eta = eta;
    c.steps = p.steps();
    c.seed = o.seed;
    plan.push_back(c);
  };
  add({method_kind::sgd}, shifted_schedule, step_size::shifted(o.gamma, o.shift_factor, p.lambda));  // k = d
  for (const std::size_t k : o.ks) {
    const step_size eta = step_size::shifted(o.gamma, o.shift_factor * d / static_cast<double>(k), p.lambda);
    for (const method_kind kind : {method_kind::topk, method_kind::randk})
      for (const bool memory : {true, false}) add({kind, k, memory}, shifted_schedule, eta);
  }
  const step_size decaying = step_size::decaying(o.gamma, p.lambda);
  add({method_kind::sgd}, decaying_schedule, decaying);
  for (const std::size_t k : {std::size_t{1}, std::size_t{10}})
    add({method_kind::topk, k, true}, decaying_schedule, decaying);
  for (const unsigned bits : {2u, 4u, 8u}) add({method_kind::qsgd, 0, false, bits}, decaying_schedule, decaying);
  return plan;
}

/// The four claims, each judged by a rule fixed in advance:
///  1. memory: at every k, top-k with memory ends within 2x of SGD's suboptimality (shifted
///     schedule) and top-k without memory ends at least 10x above it;
///  2. top-k: at every k, top-k with memory ends at or below rand-k with memory;
///  3. bits: to reach 2x the suboptimality SGD ended at (decaying schedule), the cheapest QSGD
///     sends at least 100x the bits of the cheapest Mem-SGD top-k (a QSGD that never gets there
///     counts as sending more);
///  4. scaling: the second thread count (two by default) reaches the suboptimality the first (one)
///     had half way at least 1.5x sooner than the first.
[[nodiscard]] inline std::vector<claim> check_claims(const std::vector<dataset_results>& sets,
                                                     const experiment_options& o) {
  const auto fmt = [](double v) { return bellows::detail::concat(std::scientific, std::setprecision(2), v); };
  const auto ratio = [](double a, double b) {
    return bellows::detail::concat(std::fixed, std::setprecision(2), a / b);
  };

  claim memory{"Mem-SGD converges at the rate of SGD; the same sparsification without memory does not", true, ""};
  claim topk{"top-k beats rand-k at equal k (both with memory)", true, ""};
  claim bits{"at similar accuracy Mem-SGD sends orders of magnitude (>= 100x) fewer bits than QSGD", true, ""};
  claim scaling{"lock-free parallel Mem-SGD scales with the number of threads", true, ""};
  for (const dataset_results& s : sets) {
    const double sgd = s.find(shifted_schedule, {method_kind::sgd}).final_suboptimality();
    memory.evidence += s.name + ": SGD " + fmt(sgd);
    topk.evidence += s.name + ":";
    for (const std::size_t k : o.ks) {
      const double with = s.find(shifted_schedule, {method_kind::topk, k, true}).final_suboptimality();
      const double without = s.find(shifted_schedule, {method_kind::topk, k, false}).final_suboptimality();
      const double rand_with = s.find(shifted_schedule, {method_kind::randk, k, true}).final_suboptimality();
      memory.held = memory.held && with <= 2 * sgd && without >= 10 * sgd;
      memory.evidence +=
          "; top-" + std::to_string(k) + " mem " + ratio(with, sgd) + "x SGD, no-mem " + ratio(without, sgd) + "x";
      topk.held = topk.held && with <= rand_with;
      topk.evidence += " k=" + std::to_string(k) + " top " + fmt(with) + " vs rand " + fmt(rand_with) + ";";
    }
    memory.evidence += ". ";
    topk.evidence += " ";

    const double target = 2 * s.find(decaying_schedule, {method_kind::sgd}).final_suboptimality();
    double best_topk = -1, best_qsgd = -1;
    bits.evidence += s.name + ": target " + fmt(target) + " (2x SGD's final);";
    for (const std::size_t k : {std::size_t{1}, std::size_t{10}}) {
      const double b = s.find(decaying_schedule, {method_kind::topk, k, true}).bits_to(target);
      if (b > 0 && (best_topk < 0 || b < best_topk)) best_topk = b;
      bits.evidence +=
          " top-" + std::to_string(k) + " mem " + (b > 0 ? fmt(b) + " bits" : std::string("not reached")) + ";";
    }
    for (const unsigned q : {2u, 4u, 8u}) {
      const double b = s.find(decaying_schedule, {method_kind::qsgd, 0, false, q}).bits_to(target);
      if (b > 0 && (best_qsgd < 0 || b < best_qsgd)) best_qsgd = b;
      bits.evidence +=
          " QSGD " + std::to_string(q) + "-bit " + (b > 0 ? fmt(b) + " bits" : std::string("not reached")) + ";";
    }
    const bool reached = best_topk > 0;
    bits.held = bits.held && reached && (best_qsgd < 0 || best_qsgd >= 100 * best_topk);
    if (reached && best_qsgd > 0) bits.evidence += " ratio " + ratio(best_qsgd, best_topk) + "x. ";

    const std::vector<lock_free_result>& lf = s.lock_free.runs;
    scaling.evidence += s.name + ":";
    if (lf.size() < 2) {
      scaling.held = false;
      scaling.evidence += " fewer than two thread counts run. ";
      continue;
    }
    const double one = lf.front().time_to(s.lock_free.target);
    for (const lock_free_result& r : lf) {
      const double t = r.time_to(s.lock_free.target);
      scaling.evidence +=
          " T=" + std::to_string(r.threads) + " " +
          (t >= 0 ? bellows::detail::concat(std::fixed, std::setprecision(2), t, " s") : std::string("not reached")) +
          (t > 0 && one > 0 ? " (x" + ratio(one, t) + ")" : std::string()) + " on " + ratio(r.cpu_seconds, r.seconds) +
          " cores;";
    }
    const double two = lf[1].time_to(s.lock_free.target);
    scaling.held = scaling.held && one > 0 && two > 0 && one / two >= 1.5;
    scaling.evidence += " ";
  }
  return {memory, topk, bits, scaling};
}

/// The data sets of a mode (their optimum is found later). Full: the 12,000 training images of
/// the two classes for 10 epochs, the synthetic set at its defaults (n = 20,000) for 4 epochs.
/// Quick: 4,000 images for 3 epochs, the synthetic set with n = 2,000 for 3 epochs.
[[nodiscard]] inline std::vector<problem> make_problems(const experiment_options& o) {
  std::vector<problem> out;
  const fmnist::dataset images = fmnist::load(fmnist::data_dir(o.fmnist_dir));
  out.push_back(
      {binary_fmnist(images.train, o.quick ? 4000 : 0), 0, {}, 0, o.quick ? scale{3, 2, 10} : scale{10, 5, 10}});
  sparse_recipe recipe;
  recipe.seed = o.seed;
  if (o.quick) recipe.n = 2000;
  out.push_back({synthetic_sparse(recipe), 0, {}, 0, o.quick ? scale{3, 2, 10} : scale{4, 3, 10}});
  return out;
}

[[nodiscard]] inline experiment_results run_experiment(const experiment_options& options) {
  BELLOWS_EXPECTS(!options.ks.empty(), "memsgd: the experiment needs at least one k");
  const auto start = std::chrono::steady_clock::now();
  experiment_results res;
  res.options = options;
  res.hardware_threads = std::max(1u, std::thread::hardware_concurrency());
  if (res.options.threads.empty())
    for (std::size_t t = 1; t <= std::max<std::size_t>(2, res.hardware_threads); t *= 2)
      res.options.threads.push_back(t);
  const experiment_options& o = res.options;
  std::mutex log_mutex;
  const auto say = [&](const std::string& line) {
    if (!o.log) return;
    const std::lock_guard lock(log_mutex);
    o.log(line);
  };
  double load[1] = {0};
  if (getloadavg(load, 1) == 1) res.load_before = load[0];

  std::vector<problem> problems = make_problems(o);
  bellows::cpu::executor pool(o.jobs);
  pool.parallel_for(problems.size(), [&](std::size_t i) {
    problem& p = problems[i];
    p.lambda = 1.0 / static_cast<double>(p.data.n());
    const auto t0 = std::chrono::steady_clock::now();
    p.best = solve_optimum(p.data, p.lambda);
    p.optimum_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    say(bellows::detail::concat(p.data.name, ": n = ", p.data.n(), ", d = ", p.data.d, ", f* = ", std::setprecision(10),
                                p.best.value, std::setprecision(3), " (certified within ", p.best.gap_bound, ", ",
                                p.best.iterations, " iterations, ", p.optimum_seconds, " s)"));
  });

  struct job {
    std::size_t problem;
    run_config config;
  };
  std::vector<job> jobs;
  for (std::size_t i = problems.size(); i-- > 0;)  // the costlier sparse set first
    for (const run_config& c : run_plan(problems[i], o)) jobs.push_back({i, c});
  std::vector<run_result> finished(jobs.size());
  std::size_t done = 0;
  pool.parallel_for(jobs.size(), [&](std::size_t j) {
    const problem& p = problems[jobs[j].problem];
    finished[j] = train(p.data, p.lambda, p.best.value, jobs[j].config);
    const std::lock_guard lock(log_mutex);
    ++done;
    if (o.log)
      o.log(bellows::detail::concat("[", done, "/", jobs.size(), "] ", p.data.name, " ", finished[j].how.label(), " (",
                                    finished[j].schedule, "): ", std::scientific, std::setprecision(2),
                                    finished[j].final_suboptimality(), " after ", jobs[j].config.steps, " steps, ",
                                    std::fixed, finished[j].seconds, " s"));
  });

  for (std::size_t i = 0; i < problems.size(); ++i) {
    const problem& p = problems[i];
    dataset_results s;
    s.name = p.data.name;
    s.n = p.data.n();
    s.d = p.data.d;
    s.density = p.data.density();
    s.positive =
        static_cast<double>(std::count(p.data.label.begin(), p.data.label.end(), 1.0f)) / static_cast<double>(s.n);
    s.lambda = p.lambda;
    s.f_star = p.best.value;
    s.gap_bound = p.best.gap_bound;
    s.optimum_iterations = p.best.iterations;
    s.optimum_seconds = p.optimum_seconds;
    s.steps = p.steps();
    s.epochs = p.size.epochs;
    for (std::size_t j = 0; j < jobs.size(); ++j)
      if (jobs[j].problem == i) s.runs.push_back(std::move(finished[j]));

    lock_free_study& lf = s.lock_free;
    lf.k = p.size.lock_free_k;
    lf.eta = step_size::decaying(o.gamma, p.lambda);
    for (const std::size_t t : o.threads) {
      lock_free_config c;
      c.threads = t;
      c.steps = static_cast<std::uint64_t>(p.size.lock_free_epochs * static_cast<double>(s.n));
      c.k = lf.k;
      c.eta = lf.eta;
      c.seed = o.seed;
      lf.runs.push_back(run_lock_free(p.data, p.lambda, p.best.value, c));
      const lock_free_result& r = lf.runs.back();
      say(bellows::detail::concat(s.name, " lock-free top-", lf.k, " T = ", t, ": ", std::fixed, std::setprecision(2),
                                  r.seconds, " s, ", std::scientific, r.snapshots.back().averaged));
    }
    const std::vector<lock_free_snapshot>& first = lf.runs.front().snapshots;
    lf.target = first[first.size() / 2].averaged;
    res.datasets.push_back(std::move(s));
  }
  res.claims = check_claims(res.datasets, o);
  if (getloadavg(load, 1) == 1) res.load_after = load[0];
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return res;
}

}  // namespace memsgd
