// SPDX-License-Identifier: Apache-2.0
// L2-regularised logistic regression, the objective of the Mem-SGD paper's experiments:
//   f(x) = (1/n) sum_i log(1 + exp(-y_i a_i . x)) + (lambda/2) ||x||^2,
// its gradient on one sample, its full gradient, and its minimiser by a long accelerated
// full-gradient run (the reference every suboptimality f(x) - f* is measured against).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <vector>

#include <bellows/core/error.hpp>

#include "data.hpp"

namespace memsgd {

/// log(1 + exp(-z)), without overflow for any z.
[[nodiscard]] inline double logistic_loss(double z) noexcept {
  return z >= 0 ? std::log1p(std::exp(-z)) : -z + std::log1p(std::exp(z));
}

/// 1 / (1 + exp(z)): minus the derivative of logistic_loss at z.
[[nodiscard]] inline double logistic_slope(double z) noexcept {
  if (z >= 0) {
    const double e = std::exp(-z);
    return e / (1.0 + e);
  }
  return 1.0 / (1.0 + std::exp(z));
}

/// a_i . x, where x_at(j) reads coordinate j of the iterate (plain or atomic).
template <class Read>
[[nodiscard]] double margin(const dataset& data, std::size_t i, const Read& x_at) {
  const std::span<const std::uint32_t> idx = data.row_index(i);
  const std::span<const float> val = data.row_value(i);
  double dot = 0;
  for (std::size_t e = 0; e < idx.size(); ++e) dot += static_cast<double>(val[e]) * x_at(idx[e]);
  return dot;
}

/// g = grad f_i(x) = lambda x - y_i slope(y_i a_i . x) a_i: the regulariser makes it dense.
template <class Read>
void sample_gradient(const dataset& data, double lambda, std::size_t i, const Read& x_at, std::span<float> g) {
  const auto lam = static_cast<float>(lambda);
  for (std::size_t j = 0; j < g.size(); ++j) g[j] = lam * x_at(j);
  const double y = data.label[i];
  const auto c = static_cast<float>(-y * logistic_slope(y * margin(data, i, x_at)));
  const std::span<const std::uint32_t> idx = data.row_index(i);
  const std::span<const float> val = data.row_value(i);
  for (std::size_t e = 0; e < idx.size(); ++e) g[idx[e]] += c * val[e];
}

/// f(x), summed in double.
template <class T>
[[nodiscard]] double objective(const dataset& data, double lambda, std::span<const T> x) {
  BELLOWS_EXPECTS(x.size() == data.d, "memsgd: objective of ", data.name, " needs ", data.d, " coordinates, got ",
                  x.size());
  const auto at = [&](std::size_t j) { return static_cast<double>(x[j]); };
  double sum = 0, sq = 0;
  for (std::size_t i = 0; i < data.n(); ++i) sum += logistic_loss(data.label[i] * margin(data, i, at));
  for (const T v : x) sq += static_cast<double>(v) * static_cast<double>(v);
  return sum / static_cast<double>(data.n()) + 0.5 * lambda * sq;
}

/// Writes grad f(x) into `grad` and returns f(x), in one pass over the data.
[[nodiscard]] inline double objective_and_gradient(const dataset& data, double lambda, std::span<const double> x,
                                                   std::span<double> grad) {
  const auto at = [&](std::size_t j) { return x[j]; };
  const double inv_n = 1.0 / static_cast<double>(data.n());
  double sum = 0, sq = 0;
  for (std::size_t j = 0; j < x.size(); ++j) {
    grad[j] = lambda * x[j];
    sq += x[j] * x[j];
  }
  for (std::size_t i = 0; i < data.n(); ++i) {
    const double y = data.label[i], z = y * margin(data, i, at);
    sum += logistic_loss(z);
    const double c = -y * logistic_slope(z) * inv_n;
    const std::span<const std::uint32_t> idx = data.row_index(i);
    const std::span<const float> val = data.row_value(i);
    for (std::size_t e = 0; e < idx.size(); ++e) grad[idx[e]] += c * val[e];
  }
  return sum * inv_n + 0.5 * lambda * sq;
}

/// The largest eigenvalue of (1/n) A^T A, by power iteration from the all-ones vector.
[[nodiscard]] inline double data_curvature(const dataset& data, int iterations = 60) {
  std::vector<double> v(data.d, 1.0), w(data.d);
  double estimate = 0;
  for (int it = 0; it < iterations; ++it) {
    double norm = 0;
    for (double e : v) norm += e * e;
    norm = std::sqrt(norm);
    for (double& e : v) e /= norm;
    std::fill(w.begin(), w.end(), 0.0);
    for (std::size_t i = 0; i < data.n(); ++i) {
      const double dot = margin(data, i, [&](std::size_t j) { return v[j]; });
      const std::span<const std::uint32_t> idx = data.row_index(i);
      const std::span<const float> val = data.row_value(i);
      for (std::size_t e = 0; e < idx.size(); ++e) w[idx[e]] += dot * val[e];
    }
    estimate = 0;
    for (std::size_t j = 0; j < data.d; ++j) estimate += v[j] * w[j];
    estimate /= static_cast<double>(data.n());
    v.swap(w);
  }
  return estimate;
}

/// The minimiser found by the full-gradient run, with a certificate: f is strongly convex with
/// modulus lambda, so f* >= f(y) - ||grad f(y)||^2 / (2 lambda) at every point y visited.
struct optimum {
  std::vector<double> x;  ///< the visited point of least f
  double value = 0;       ///< f(x), an upper bound of f*
  double gap_bound = 0;   ///< value minus the best lower bound of f*
  int iterations = 0;
  double smoothness = 0;  ///< L = 1.1 curvature / 4 + lambda; the step is 1/L
};

/// Nesterov's accelerated gradient method for a strongly convex function (momentum
/// (sqrt(kappa) - 1) / (sqrt(kappa) + 1), kappa = L / lambda), its momentum dropped for a step
/// whenever the last step went against the gradient, until the certified gap falls below
/// `tolerance` or the iterations run out.
[[nodiscard]] inline optimum solve_optimum(const dataset& data, double lambda, double tolerance = 1e-10,
                                           int max_iterations = 20000) {
  BELLOWS_EXPECTS(lambda > 0, "memsgd: solve_optimum needs lambda > 0, got ", lambda);
  const std::size_t d = data.d;
  const double smooth = 1.1 * data_curvature(data) / 4.0 + lambda;
  const double root = std::sqrt(smooth / lambda), momentum = (root - 1.0) / (root + 1.0);
  std::vector<double> x(d, 0.0), previous(d, 0.0), y(d, 0.0), grad(d);
  optimum best;
  best.smoothness = smooth;
  best.value = std::numeric_limits<double>::infinity();
  double lower = -best.value;
  for (int it = 0; it < max_iterations; ++it) {
    const double f = objective_and_gradient(data, lambda, y, grad);
    double gsq = 0;
    for (double g : grad) gsq += g * g;
    lower = std::max(lower, f - gsq / (2 * lambda));
    if (f < best.value) {
      best.x = y;
      best.value = f;
    }
    best.gap_bound = best.value - lower;
    best.iterations = it + 1;
    if (best.gap_bound <= tolerance) break;
    double along = 0;
    for (std::size_t j = 0; j < d; ++j) {
      previous[j] = x[j];
      x[j] = y[j] - grad[j] / smooth;
      along += grad[j] * (x[j] - previous[j]);
    }
    const double beta = along > 0 ? 0.0 : momentum;
    for (std::size_t j = 0; j < d; ++j) y[j] = x[j] + beta * (x[j] - previous[j]);
  }
  return best;
}

}  // namespace memsgd
