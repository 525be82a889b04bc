// SPDX-License-Identifier: Apache-2.0
#include "fmnist/model.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

/// n samples of 784 inputs (standard normal) and labels 0..9, from a seed.
struct batch_data {
  std::vector<double> x;
  std::vector<std::uint8_t> labels;
};
batch_data random_batch(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  batch_data b{std::vector<double>(n * 784), std::vector<std::uint8_t>(n)};
  for (double& v : b.x) v = normal(rng);
  for (std::size_t i = 0; i < n; ++i) b.labels[i] = static_cast<std::uint8_t>(rng() % 10);
  return b;
}

}  // namespace

TEST_CASE("fmnist mlp: one layer per tensor, PyTorch names and shapes, flat buffers") {
  fmnist::mlp<float> m(1, 8);
  const std::vector<std::string> names{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"};
  const std::vector<bellows::shape> shapes{{256, 784}, {256}, {128, 256}, {128}, {10, 128}, {10}};
  REQUIRE(m.layers().size() == 6);
  std::size_t total = 0;
  for (std::size_t id = 0; id < 6; ++id) {
    CHECK(m.layers()[id].id == id);
    CHECK(m.layers()[id].name == names[id]);
    CHECK(m.layers()[id].shape == shapes[id]);
    CHECK(m.parameter(id).data() == m.parameters().data() + total);
    CHECK(m.gradient(id).size() == shapes[id].size());
    total += shapes[id].size();
  }
  CHECK(m.parameters().size() == total);
  CHECK(total == 235146);
}

TEST_CASE("fmnist mlp: initialisation is a function of the seed, within +-1/sqrt(fan_in)") {
  fmnist::mlp<float> a(42, 4), b(42, 64), c(43, 4);
  CHECK(std::vector<float>(a.parameters().begin(), a.parameters().end()) ==
        std::vector<float>(b.parameters().begin(), b.parameters().end()));
  CHECK(std::vector<float>(a.parameters().begin(), a.parameters().end()) !=
        std::vector<float>(c.parameters().begin(), c.parameters().end()));
  for (std::size_t id = 0; id < 6; ++id) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(fmnist::mlp<float>::widths[id / 2]));
    float largest = 0;
    for (const float w : a.parameter(id)) largest = std::max(largest, std::abs(w));
    CHECK(largest <= bound);
    if (id % 2 == 0) CHECK(largest > 0.99f * bound);  // a weight tensor fills its range
  }
}

TEST_CASE("fmnist mlp: gradients match central finite differences (double)") {
  // In double, central differences with h = 1e-6 are accurate to about 1e-10 (truncation h^2,
  // rounding 1e-16 / h); a tolerance of 1e-7 leaves room for that and for no more than that.
  // Five samples in a workspace of eight exercise the padded batch columns.
  constexpr std::size_t n = 5;
  fmnist::mlp<double> m(3, 8);
  const batch_data data = random_batch(n, 11);
  const double loss = m.train_batch(data.x, data.labels);
  const auto mean_loss = [&] { return m.evaluate(data.x, data.labels).loss_sum / n; };
  CHECK(loss == doctest::Approx(mean_loss()).epsilon(1e-12));
  const std::vector<double> analytic(m.gradients().begin(), m.gradients().end());

  std::mt19937_64 rng(5);
  std::size_t offset = 0, checked = 0, nonzero = 0;
  for (std::size_t id = 0; id < m.layers().size(); ++id) {
    const std::span<double> p = m.parameter(id);
    CAPTURE(m.layers()[id].name);
    for (int probe = 0; probe < 16; ++probe) {
      const std::size_t i = p.size() <= 16 ? static_cast<std::size_t>(probe) % p.size() : rng() % p.size();
      constexpr double h = 1e-6;
      const double saved = p[i];
      p[i] = saved + h;
      const double up = mean_loss();
      p[i] = saved - h;
      const double down = mean_loss();
      p[i] = saved;
      const double numeric = (up - down) / (2 * h);
      CAPTURE(i);
      CHECK(std::abs(numeric - analytic[offset + i]) <= 1e-7);
      ++checked;
      nonzero += analytic[offset + i] != 0.0 ? 1 : 0;
    }
    offset += p.size();
  }
  CHECK(checked == 96);
  CHECK(nonzero > 60);  // ReLU zeroes some, but the check is not a comparison of zeros
}

TEST_CASE("fmnist mlp: float gradients agree with double ones") {
  constexpr std::size_t n = 16;
  fmnist::mlp<double> d(9, n);
  fmnist::mlp<float> f(9, n);
  // The same initial weights in both precisions.
  for (std::size_t i = 0; i < f.parameters().size(); ++i) d.parameters()[i] = f.parameters()[i];
  const batch_data data = random_batch(n, 12);
  const std::vector<float> xf(data.x.begin(), data.x.end());
  const double loss_d = d.train_batch(data.x, data.labels);
  const float loss_f = f.train_batch(xf, data.labels);
  CHECK(loss_f == doctest::Approx(loss_d).epsilon(1e-5));
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < f.gradients().size(); ++i) {
    worst = std::max(worst, std::abs(f.gradients()[i] - d.gradients()[i]));
    scale = std::max(scale, std::abs(d.gradients()[i]));
  }
  CHECK(worst <= 1e-4 * scale);
}

TEST_CASE("fmnist mlp: evaluate counts the samples whose largest logit is the label") {
  constexpr std::size_t n = 10;
  fmnist::mlp<float> m(1, n), one(1, 1);  // the same weights; `one` probes a sample at a time
  const batch_data data = random_batch(n, 13);
  const std::vector<float> x(data.x.begin(), data.x.end());
  // The predicted class is the label of least loss. Relabel every sample with it: all correct.
  std::vector<std::uint8_t> predicted(n);
  for (std::size_t b = 0; b < n; ++b) {
    float best_loss = 1e30f;
    for (std::uint8_t c = 0; c < 10; ++c) {
      const std::vector<std::uint8_t> label{c};
      const float l = one.evaluate(std::span<const float>(x.data() + b * 784, 784), label).loss_sum;
      if (l < best_loss) best_loss = l, predicted[b] = c;
    }
  }
  CHECK(m.evaluate(x, predicted).correct == n);
  for (std::uint8_t& l : predicted) l = static_cast<std::uint8_t>((l + 1) % 10);
  CHECK(m.evaluate(x, predicted).correct == 0);
}

TEST_CASE("fmnist multiply_add: equals the textbook triple loop, with a transposed or plain a") {
  constexpr std::size_t m = 7, n = 32, k = 9;
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> a(m * k), b(k * n), c(m * n), at(k * m);
  for (double& v : a) v = u(rng);
  for (double& v : b) v = u(rng);
  for (double& v : c) v = u(rng);
  a[3] = 0;  // a zero term is skipped
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t p = 0; p < k; ++p) at[p * m + i] = a[i * k + p];
  std::vector<double> expected = c;
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t p = 0; p < k; ++p) expected[i * n + j] += a[i * k + p] * b[p * n + j];
  std::vector<double> plain = c, transposed = c;
  fmnist::multiply_add(m, n, k, a.data(), k, std::size_t{1}, b.data(), n, plain.data(), n);
  fmnist::multiply_add(m, n, k, at.data(), std::size_t{1}, m, b.data(), n, transposed.data(), n);
  for (std::size_t i = 0; i < m * n; ++i) {
    CHECK(plain[i] == doctest::Approx(expected[i]).epsilon(1e-14));
    CHECK(transposed[i] == plain[i]);
  }
  CHECK_THROWS_WITH_AS(fmnist::multiply_add(m, 20, k, a.data(), k, std::size_t{1}, b.data(), n, plain.data(), n),
                       doctest::Contains("20 columns"), bellows::error);
}

TEST_CASE("fmnist sgd: torch.optim.SGD's momentum and weight decay; step schedule") {
  fmnist::sgd<double> opt(2, 0.9, 0.1);
  std::vector<double> w{1.0, -2.0};
  const std::vector<double> g{0.5, 0.5};
  opt.step(w, g, 0.1);  // v = g + 0.1 w = {0.6, 0.3}; w -= 0.1 v
  CHECK(w[0] == doctest::Approx(0.94));
  CHECK(w[1] == doctest::Approx(-2.03));
  opt.step(w, g, 0.1);  // v = 0.9 {0.6, 0.3} + {0.5 + 0.094, 0.5 - 0.203}
  CHECK(w[0] == doctest::Approx(0.94 - 0.1 * (0.54 + 0.594)));
  CHECK(w[1] == doctest::Approx(-2.03 - 0.1 * (0.27 + 0.297)));
  CHECK_THROWS_WITH_AS(fmnist::sgd<double>(2, 1.0, 0.0), doctest::Contains("momentum must be in [0, 1), got 1"),
                       bellows::error);

  const fmnist::step_schedule s{0.1f, 0.1f, {5, 8}};
  CHECK(s.at(0) == 0.1f);
  CHECK(s.at(4) == 0.1f);
  CHECK(s.at(5) == doctest::Approx(0.01f));
  CHECK(s.at(8) == doctest::Approx(0.001f));
}

TEST_CASE("fmnist mlp: batches of the wrong size are refused") {
  fmnist::mlp<float> m(1, 4);
  const std::vector<float> x(5 * 784);
  const std::vector<std::uint8_t> labels(5);
  CHECK_THROWS_WITH_AS(m.train_batch(x, labels), doctest::Contains("a batch of 5 samples, max_batch is 4"),
                       bellows::error);
  CHECK_THROWS_WITH_AS(
      m.evaluate(std::span<const float>(x.data(), 700), std::span<const std::uint8_t>(labels.data(), 1)),
      doctest::Contains("700 inputs for 1 samples"), bellows::error);
}
