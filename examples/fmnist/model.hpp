// SPDX-License-Identifier: Apache-2.0
// The model of the Fashion-MNIST example: an MLP 784-256-128-10 with ReLU and softmax
// cross-entropy, its forward and backward pass, SGD with momentum and weight decay, and a step
// learning-rate schedule. Templated on the scalar so a test can check the gradients in double;
// the example trains in float.
//
// Layout. Parameters live in one flat buffer, one layer per tensor (fc1.weight {256, 784},
// fc1.bias {256}, ...; weights out x in, row-major, as PyTorch's Linear), gradients in a second
// buffer of the same layout. Activations are kept feature-major (features x padded batch), so
// every matrix product is a sum of scaled rows, which compilers vectorise without reordering a
// reduction: results are bit-identical from run to run, and need no -ffast-math.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <bellows/core/error.hpp>
#include <bellows/core/philox.hpp>
#include <bellows/core/shape.hpp>

namespace fmnist {

/// Columns of the matrix kernel are processed in blocks of this many; the batch dimension of
/// activations is padded to a multiple of it.
inline constexpr std::size_t lanes = 16;

[[nodiscard]] constexpr std::size_t round_up(std::size_t n, std::size_t m) noexcept { return (n + m - 1) / m * m; }

/// c += a * b for an m x k matrix a and a k x n matrix b (rows ldb apart) into an m x n matrix c
/// (rows ldc apart); element (i, p) of a is a[i * a_row + p * a_col], so a may be transposed.
/// n must be a multiple of `lanes`. Each element of c sums its k terms in order p = 0, 1, ...
template <class T>
void multiply_add(std::size_t m, std::size_t n, std::size_t k, const T* a, std::size_t a_row, std::size_t a_col,
                  const T* b, std::size_t ldb, T* c, std::size_t ldc) {
  BELLOWS_EXPECTS(n % lanes == 0, "multiply_add: ", n, " columns, not a multiple of ", lanes);
  // Four rows of c share each row of b; a tile of 256 columns of four rows stays in L1.
  constexpr std::size_t rows = 4, tile = 256;
  for (std::size_t j0 = 0; j0 < n; j0 += tile) {
    const std::size_t j1 = std::min(n, j0 + tile);
    for (std::size_t i0 = 0; i0 < m; i0 += rows) {
      const std::size_t r_end = std::min(rows, m - i0);
      for (std::size_t p = 0; p < k; ++p) {
        const T* __restrict brow = b + p * ldb;
        for (std::size_t r = 0; r < r_end; ++r) {
          const T s = a[(i0 + r) * a_row + p * a_col];
          if (s == T(0)) continue;  // ReLU zeroes many terms; adding 0 * b would change nothing
          T* __restrict crow = c + (i0 + r) * ldc;
          for (std::size_t j = j0; j < j1; j += lanes) {
            // Products first, then sums: two fixed-length loops that GCC vectorises even at -O2
            // (a single fused loop it leaves scalar there); the arithmetic is the same.
            T product[lanes];
            for (std::size_t l = 0; l < lanes; ++l) product[l] = s * brow[j + l];
            for (std::size_t l = 0; l < lanes; ++l) crow[j + l] += product[l];
          }
        }
      }
    }
  }
}

/// Loss and accuracy over some samples.
template <class T>
struct evaluation {
  T loss_sum = 0;           ///< sum of the samples' cross-entropies
  std::size_t correct = 0;  ///< samples whose largest logit is the label
};

/// The MLP with its gradients and a workspace for batches of up to `max_batch` samples.
template <class T>
class mlp {
public:
  static constexpr std::array<std::size_t, 4> widths{784, 256, 128, 10};
  static constexpr std::size_t depth = widths.size() - 1;  // fully connected layers

  /// Weights and biases uniform in +-1/sqrt(fan_in) (PyTorch's default for Linear), drawn from
  /// Philox keyed by (seed, tensor id), so a seed gives the same model on every platform.
  mlp(std::uint64_t seed, std::size_t max_batch) : max_batch_(max_batch), ld_(round_up(max_batch, lanes)) {
    BELLOWS_EXPECTS(max_batch >= 1, "mlp: max_batch must be >= 1, got ", max_batch);
    std::size_t size = 0;
    for (std::size_t f = 0; f < depth; ++f) {
      for (const bool bias : {false, true}) {
        const auto id = static_cast<std::uint32_t>(layers_.size());
        const std::string name = "fc" + std::to_string(f + 1) + (bias ? ".bias" : ".weight");
        const bellows::shape shp = bias ? bellows::shape{widths[f + 1]} : bellows::shape{widths[f + 1], widths[f]};
        layers_.push_back({id, name, shp});
        offsets_.push_back(size);
        size += shp.size();
      }
    }
    offsets_.push_back(size);
    params_.resize(size);
    grads_.resize(size);
    for (std::size_t id = 0; id < layers_.size(); ++id) {
      const bellows::philox::stream random{seed, 0, static_cast<std::uint32_t>(id)};
      const T bound = T(1) / std::sqrt(static_cast<T>(widths[id / 2]));
      const std::span<T> p = parameter(id);
      for (std::size_t i = 0; i < p.size(); ++i)
        p[i] = bound * (T(2) * static_cast<T>(bellows::philox::to_uniform(random.word(i))) - T(1));
    }
    for (std::size_t f = 0; f <= depth; ++f) {
      act_[f].resize(widths[f] * ld_);
      if (f > 0) delta_[f].resize(widths[f] * ld_);  // no gradient for the input
      if (f < depth) rows_[f].resize(widths[f] * max_batch);
    }
  }

  /// One entry per tensor: id, name and shape, in the order of the flat buffers.
  [[nodiscard]] std::span<const bellows::layer_info> layers() const noexcept { return layers_; }

  [[nodiscard]] std::span<T> parameters() noexcept { return params_; }
  [[nodiscard]] std::span<const T> parameters() const noexcept { return params_; }
  [[nodiscard]] std::span<T> gradients() noexcept { return grads_; }
  [[nodiscard]] std::span<T> parameter(std::size_t id) { return slice(params_, id); }
  [[nodiscard]] std::span<T> gradient(std::size_t id) { return slice(grads_, id); }
  [[nodiscard]] std::size_t max_batch() const noexcept { return max_batch_; }

  /// Forward and backward over n samples (x: n x 784, row-major; labels: n): writes the gradient
  /// of the mean cross-entropy into gradients() and returns that mean. The backward pass goes
  /// from the last layer down and calls ready(id) once the gradients of tensors id and up are
  /// final, so that a trainer can average them while it computes the rest (it may replace them;
  /// the pass reads no gradient it has written).
  template <class Ready = void (*)(std::size_t)>
  T train_batch(
      std::span<const T> x, std::span<const std::uint8_t> labels, Ready&& ready = [](std::size_t) {}) {
    const std::size_t n = forward(x, labels);
    T loss = 0;
    // delta of the logits: (softmax - one hot) / n; padded columns stay 0.
    std::vector<T>& d = delta_[depth];
    std::ranges::fill(d, T(0));
    const std::vector<T>& z = act_[depth];
    for (std::size_t b = 0; b < n; ++b) {
      const T lse = log_sum_exp(z, b);
      loss += lse - z[labels[b] * ld_ + b];
      for (std::size_t o = 0; o < widths[depth]; ++o)
        d[o * ld_ + b] = (std::exp(z[o * ld_ + b] - lse) - (o == labels[b] ? T(1) : T(0))) / static_cast<T>(n);
    }
    for (std::size_t f = depth; f-- > 0;) {
      backward(f, n);
      ready(2 * f);
    }
    return loss / static_cast<T>(n);
  }

  /// Forward only over n samples: summed loss and correct predictions.
  evaluation<T> evaluate(std::span<const T> x, std::span<const std::uint8_t> labels) {
    const std::size_t n = forward(x, labels);
    evaluation<T> e;
    const std::vector<T>& z = act_[depth];
    for (std::size_t b = 0; b < n; ++b) {
      e.loss_sum += log_sum_exp(z, b) - z[labels[b] * ld_ + b];
      std::size_t best = 0;
      for (std::size_t o = 1; o < widths[depth]; ++o)
        if (z[o * ld_ + b] > z[best * ld_ + b]) best = o;
      e.correct += best == labels[b] ? 1 : 0;
    }
    return e;
  }

private:
  [[nodiscard]] std::span<T> slice(std::vector<T>& v, std::size_t id) {
    BELLOWS_EXPECTS(id < layers_.size(), "mlp: no tensor ", id, " in ", layers_.size());
    return std::span<T>(v).subspan(offsets_[id], offsets_[id + 1] - offsets_[id]);
  }

  /// act_[0] = x feature-major; act_[f + 1] = relu(W_f act_[f] + b_f) (no ReLU on the logits).
  /// rows_[f] keeps act_[f] sample-major for the weight gradients. Returns n.
  std::size_t forward(std::span<const T> x, std::span<const std::uint8_t> labels) {
    const std::size_t n = labels.size();
    BELLOWS_EXPECTS(n >= 1 && n <= max_batch_, "mlp: a batch of ", n, " samples, max_batch is ", max_batch_);
    BELLOWS_EXPECTS(x.size() == n * widths[0], "mlp: ", x.size(), " inputs for ", n, " samples of ", widths[0]);
    std::ranges::fill(act_[0], T(0));
    for (std::size_t b = 0; b < n; ++b)
      for (std::size_t i = 0; i < widths[0]; ++i) act_[0][i * ld_ + b] = x[b * widths[0] + i];
    std::copy(x.begin(), x.end(), rows_[0].begin());
    for (std::size_t f = 0; f < depth; ++f) {
      const std::size_t out = widths[f + 1];
      std::vector<T>& y = act_[f + 1];
      const std::span<const T> bias = parameter(2 * f + 1);
      for (std::size_t o = 0; o < out; ++o) std::fill_n(y.begin() + static_cast<std::ptrdiff_t>(o * ld_), ld_, bias[o]);
      multiply_add(out, ld_, widths[f], parameter(2 * f).data(), widths[f], std::size_t{1}, act_[f].data(), ld_,
                   y.data(), ld_);
      if (f + 1 == depth) break;
      for (T& v : y) v = std::max(v, T(0));
      for (std::size_t b = 0; b < n; ++b)
        for (std::size_t o = 0; o < out; ++o) rows_[f + 1][b * out + o] = y[o * ld_ + b];
    }
    return n;
  }

  /// From delta_[f + 1], the loss gradient at layer f's pre-activation: layer f's weight and
  /// bias gradients and, above the input, delta_[f] (through layer f - 1's ReLU).
  void backward(std::size_t f, std::size_t n) {
    const std::size_t in = widths[f], out = widths[f + 1];
    const std::vector<T>& d = delta_[f + 1];
    const std::span<T> gw = gradient(2 * f), gb = gradient(2 * f + 1);
    std::ranges::fill(gw, T(0));
    multiply_add(out, in, n, d.data(), ld_, std::size_t{1}, rows_[f].data(), in, gw.data(), in);
    for (std::size_t o = 0; o < out; ++o) {
      T s = 0;
      for (std::size_t b = 0; b < n; ++b) s += d[o * ld_ + b];
      gb[o] = s;
    }
    if (f == 0) return;
    std::vector<T>& below = delta_[f];
    std::ranges::fill(below, T(0));
    multiply_add(in, ld_, out, parameter(2 * f).data(), std::size_t{1}, in, d.data(), ld_, below.data(), ld_);
    const std::vector<T>& a = act_[f];  // ReLU output: its derivative is 1 where a > 0
    for (std::size_t i = 0; i < below.size(); ++i)
      if (a[i] <= T(0)) below[i] = T(0);
  }

  /// log(sum_o exp(z_o)) of sample b's logits, computed stably.
  [[nodiscard]] T log_sum_exp(const std::vector<T>& z, std::size_t b) const {
    T max = z[b];
    for (std::size_t o = 1; o < widths[depth]; ++o) max = std::max(max, z[o * ld_ + b]);
    T sum = 0;
    for (std::size_t o = 0; o < widths[depth]; ++o) sum += std::exp(z[o * ld_ + b] - max);
    return max + std::log(sum);
  }

  std::size_t max_batch_;
  std::size_t ld_;  // padded batch: the row length of feature-major activations
  std::vector<bellows::layer_info> layers_;
  std::vector<std::size_t> offsets_;
  std::vector<T> params_, grads_;
  std::array<std::vector<T>, depth + 1> act_;    // feature-major activations, widths[f] x ld_
  std::array<std::vector<T>, depth + 1> delta_;  // gradients at the pre-activations, same layout
  std::array<std::vector<T>, depth + 1> rows_;   // inputs of each layer sample-major, n x widths[f]
};

/// SGD with momentum and weight decay, as torch.optim.SGD: v = mu v + (g + wd w); w -= lr v.
template <class T>
class sgd {
public:
  sgd(std::size_t size, T momentum, T weight_decay)
      : velocity_(size, T(0)), momentum_(momentum), weight_decay_(weight_decay) {
    BELLOWS_EXPECTS(momentum >= 0 && momentum < 1, "sgd: momentum must be in [0, 1), got ", momentum);
    BELLOWS_EXPECTS(weight_decay >= 0, "sgd: weight decay must be >= 0, got ", weight_decay);
  }

  void step(std::span<T> params, std::span<const T> grads, T lr) {
    BELLOWS_EXPECTS(params.size() == velocity_.size() && grads.size() == velocity_.size(), "sgd: ", params.size(),
                    " parameters and ", grads.size(), " gradients for ", velocity_.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      velocity_[i] = momentum_ * velocity_[i] + (grads[i] + weight_decay_ * params[i]);
      params[i] -= lr * velocity_[i];
    }
  }

  /// The momentum buffer, for checkpoints.
  [[nodiscard]] std::span<T> velocity() noexcept { return velocity_; }

private:
  std::vector<T> velocity_;
  T momentum_, weight_decay_;
};

/// A step learning-rate schedule: `base`, multiplied by `factor` at every milestone epoch passed.
struct step_schedule {
  float base = 0.1f;
  float factor = 0.1f;
  std::vector<std::size_t> milestones;

  [[nodiscard]] float at(std::size_t epoch) const {
    float lr = base;
    for (std::size_t m : milestones)
      if (epoch >= m) lr *= factor;
    return lr;
  }
};

}  // namespace fmnist
