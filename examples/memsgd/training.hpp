// SPDX-License-Identifier: Apache-2.0
// One sequential training run of the Mem-SGD example: SGD with one sample per step on the
// logistic regression of logistic.hpp, each stochastic gradient passed through one of the
// library's compressors (identity for plain SGD, top-k, rand-k, QSGD) as a single worker would
// exchange it (bellows::archetypes::collective: W = 1), then applied with the step size.
//
// Mem-SGD (Stich, Cordonnier, Jaggi 2018, Algorithm 1) keeps its memory m in update units:
//   v_t = comp(m_t + eta_t g_t),  x_{t+1} = x_t - v_t,  m_{t+1} = m_t + eta_t g_t - v_t.
// Here the compressor keeps the memory itself, with `feedback::scaled`: it compresses
// g_t + e_t and keeps e_{t+1} = g_t + e_t - comp(g_t + e_t), and before each step the memory is
// told of the new step size (error_memory::rescale(eta_{t-1}, eta_t) multiplies it by
// eta_{t-1} / eta_t), so that eta_t e_t = m_t throughout. Top-k and rand-k commute with a positive
// scale, so this is Mem-SGD exactly, up to float rounding.
//
// Step sizes (the paper's): eta_t = gamma / (lambda (t + a)), with the iterates averaged with
// weights (t + a)^2. The second schedule of the paper, eta_t = gamma / (1 + gamma lambda t), is the
// same family: 1 / (lambda (t + 1 / (gamma lambda))), i.e. gamma' = 1 and a' = 1 / (gamma lambda),
// and it is averaged alike.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <bellows/compressors/identity.hpp>
#include <bellows/compressors/qsgd.hpp>
#include <bellows/compressors/randk.hpp>
#include <bellows/compressors/topk.hpp>
#include <bellows/concepts.hpp>
#include <bellows/core/error.hpp>
#include <bellows/core/philox.hpp>
#include <bellows/core/shape.hpp>
#include <bellows/cpu/executor.hpp>

#include "data.hpp"
#include "logistic.hpp"

namespace memsgd {

/// eta_t = gamma / (lambda (t + shift)).
struct step_size {
  double gamma = 1;
  double shift = 1;
  double lambda = 1;

  /// The paper's schedule with a shift a.
  [[nodiscard]] static step_size shifted(double gamma, double shift, double lambda) {
    BELLOWS_EXPECTS(gamma > 0 && shift > 0 && lambda > 0, "memsgd: step size needs gamma, a and lambda > 0, got ",
                    gamma, ", ", shift, " and ", lambda);
    return {gamma, shift, lambda};
  }
  /// eta_t = gamma / (1 + gamma lambda t), written as the shifted schedule.
  [[nodiscard]] static step_size decaying(double gamma, double lambda) {
    BELLOWS_EXPECTS(gamma > 0 && lambda > 0, "memsgd: step size needs gamma and lambda > 0, got ", gamma, " and ",
                    lambda);
    return {1.0, 1.0 / (gamma * lambda), lambda};
  }
  [[nodiscard]] double at(std::uint64_t t) const noexcept {
    return gamma / (lambda * (static_cast<double>(t) + shift));
  }
};

enum class method_kind : unsigned char { sgd, topk, randk, qsgd };

/// What a run sends: plain SGD, top-k or rand-k with or without memory, or QSGD.
struct method {
  method_kind kind = method_kind::sgd;
  std::size_t k = 0;    ///< top-k, rand-k: entries kept per step
  bool memory = false;  ///< top-k, rand-k: Mem-SGD's memory (without it rand-k is scaled by d / k, unbiased)
  unsigned bits = 0;    ///< QSGD: 2, 4 or 8

  [[nodiscard]] std::string label() const {
    switch (kind) {
      case method_kind::sgd: return "SGD";
      case method_kind::topk: return "top-" + std::to_string(k) + (memory ? " mem" : " no-mem");
      case method_kind::randk: return "rand-" + std::to_string(k) + (memory ? " mem" : " no-mem");
      case method_kind::qsgd: return "QSGD " + std::to_string(bits) + "-bit";
    }
    return "unknown";
  }
};

struct run_config {
  method how;
  std::string schedule;  ///< the name of the step-size schedule, carried into the result
  step_size eta;
  std::uint64_t steps = 0;
  std::uint64_t seed = 1;   ///< keys the samples (the same for every run of a data set) and the compressors' draws
  std::size_t points = 40;  ///< checkpoints, spaced evenly in log(step)
};

struct curve_point {
  std::uint64_t step = 0;
  double bits = 0;           ///< sent up to this step
  double suboptimality = 0;  ///< f(averaged iterate) - f*
};

struct run_result {
  std::string dataset;
  std::string schedule;
  method how;
  step_size eta;
  std::vector<curve_point> curve;
  std::vector<float> last_iterate;  ///< x after the last step (the curve follows the average)
  double seconds = 0;               ///< wall time of the run, evaluations included

  [[nodiscard]] double final_suboptimality() const { return curve.empty() ? 0.0 : curve.back().suboptimality; }
  [[nodiscard]] double bits() const { return curve.empty() ? 0.0 : curve.back().bits; }
  /// Bits sent up to the first checkpoint at or below `target`; negative when none reached it.
  [[nodiscard]] double bits_to(double target) const {
    for (const curve_point& p : curve)
      if (p.suboptimality <= target) return p.bits;
    return -1.0;
  }
};

/// Steps at which a run records its curve: `points` steps from 10 (from 1 for runs under 100
/// steps) to `steps`, evenly spaced in log(step), rounded and without repeats; the last is
/// always `steps`.
[[nodiscard]] inline std::vector<std::uint64_t> checkpoints(std::uint64_t steps, std::size_t points) {
  std::vector<std::uint64_t> at;
  const double first = steps >= 100 ? std::log(10.0) : 0.0;
  const double last = std::log(static_cast<double>(steps));
  for (std::size_t p = 0; p + 1 < points; ++p) {
    const double s = std::exp(first + (last - first) * static_cast<double>(p) / static_cast<double>(points - 1));
    const auto step = static_cast<std::uint64_t>(std::llround(s));
    if (step >= 1 && (at.empty() || step > at.back()) && step < steps) at.push_back(step);
  }
  at.push_back(steps);
  return at;
}

/// The sample of step t: uniform over the rows, from a Philox stream keyed by the seed.
[[nodiscard]] inline std::size_t sample_of(std::uint64_t seed, std::uint64_t t, std::size_t n) noexcept {
  const bellows::philox::stream samples{seed, static_cast<std::uint32_t>(t >> 32), 3, 0};
  return bellows::philox::to_below(samples.word(t & 0xFFFFFFFFu), static_cast<std::uint32_t>(n));
}

/// Runs `cfg.steps` steps with compressor `comp` and records the curve.
template <class Compressor>
run_result train_with(const dataset& data, double lambda, double f_star, const run_config& cfg, Compressor& comp) {
  BELLOWS_EXPECTS(cfg.steps >= 1 && cfg.points >= 2, "memsgd: a run needs steps >= 1 and points >= 2, got ", cfg.steps,
                  " and ", cfg.points);
  const auto start = std::chrono::steady_clock::now();
  const std::size_t d = data.d;
  bellows::archetypes::collective alone;
  auto st = comp.make_state({0, "weights", bellows::shape{d}});
  std::vector<float> x(d, 0.0f), g(d);
  std::vector<double> average(d, 0.0);
  double weight_sum = 0, bits = 0, previous_eta = 0;
  const auto x_at = [&](std::size_t j) { return x[j]; };
  run_result out;
  out.dataset = data.name;
  out.schedule = cfg.schedule;
  out.how = cfg.how;
  out.eta = cfg.eta;
  const std::vector<std::uint64_t> marks = checkpoints(cfg.steps, cfg.points);
  std::size_t next_mark = 0;
  for (std::uint64_t t = 0; t < cfg.steps; ++t) {
    const double eta = cfg.eta.at(t);
    sample_gradient(data, lambda, sample_of(cfg.seed, t, data.n()), x_at, g);
    if constexpr (requires { comp.rescale(st, 1.0f, 1.0f); })
      if (t > 0) comp.rescale(st, static_cast<float>(previous_eta), static_cast<float>(eta));
    const bellows::reduce_result r = comp.reduce(st, g, alone);
    BELLOWS_EXPECTS(r.status == bellows::step_status::ok, "memsgd: ", cfg.how.label(), " on ", data.name,
                    ": non-finite gradient at step ", t);
    bits += 8.0 * static_cast<double>(r.sent.bytes);
    // x_{t+1} = x_t - eta_t g, and x_{t+1} joins the average with weight (t + 1 + a)^2
    const auto step = static_cast<float>(eta);
    const double w = (static_cast<double>(t + 1) + cfg.eta.shift) * (static_cast<double>(t + 1) + cfg.eta.shift);
    weight_sum += w;
    const double share = w / weight_sum;
    for (std::size_t j = 0; j < d; ++j) {
      x[j] -= step * g[j];
      average[j] += share * (static_cast<double>(x[j]) - average[j]);
    }
    previous_eta = eta;
    if (t + 1 == marks[next_mark]) {
      out.curve.push_back({t + 1, bits, objective(data, lambda, std::span<const double>(average)) - f_star});
      ++next_mark;
    }
  }
  out.last_iterate = std::move(x);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

/// One run of `cfg.how`, its compressor on a single-threaded executor of its own.
[[nodiscard]] inline run_result train(const dataset& data, double lambda, double f_star, const run_config& cfg) {
  bellows::cpu::executor exec(1);
  const method& m = cfg.how;
  const bellows::feedback memory = m.memory ? bellows::feedback::scaled : bellows::feedback::none;
  switch (m.kind) {
    case method_kind::sgd: {
      bellows::identity<> comp(exec);
      return train_with(data, lambda, f_star, cfg, comp);
    }
    case method_kind::topk: {
      bellows::topk<> comp({.k = static_cast<std::int64_t>(m.k), .feedback = memory, .seed = cfg.seed}, exec);
      return train_with(data, lambda, f_star, cfg, comp);
    }
    case method_kind::randk: {
      bellows::randk<> comp(
          {.k = static_cast<std::int64_t>(m.k), .unbiased = !m.memory, .feedback = memory, .seed = cfg.seed}, exec);
      return train_with(data, lambda, f_star, cfg, comp);
    }
    case method_kind::qsgd: {
      bellows::qsgd<> comp({.bits = m.bits, .seed = cfg.seed}, exec);
      return train_with(data, lambda, f_star, cfg, comp);
    }
  }
  bellows::fail("memsgd: unknown method kind ", static_cast<int>(m.kind));
}

}  // namespace memsgd
