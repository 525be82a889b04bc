// SPDX-License-Identifier: Apache-2.0
// The CPU's float array (plan/float_array.hpp): host memory, so reading it on the host is free,
// and the L2 norm in the order both backends compute it. With them the CPU backend is complete:
// cpu::executor is checked against the Executor concept here.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include "bellows/concepts.hpp"
#include "bellows/core/error.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/plan/float_array.hpp"

namespace bellows::cpu {

/// n floats in host memory, zero when made.
class float_array {
public:
  float_array() = default;
  float_array(executor& /*exec*/, std::size_t n) : values_(n, 0.0f) {}

  [[nodiscard]] std::span<float> span() noexcept { return values_; }
  [[nodiscard]] std::span<const float> span() const noexcept { return values_; }
  [[nodiscard]] std::size_t size() const noexcept { return values_.size(); }

  /// The values, readable on the host: the array itself (`staging` is for the device's copy).
  [[nodiscard]] std::span<const float> host(executor& /*exec*/, std::vector<float>& /*staging*/) const noexcept {
    return values_;
  }

  /// Element by element (host memory can be compared in place).
  friend bool operator==(const float_array&, const float_array&) = default;

  /// Copies the values into `to` (size() of them), as the device's send does without a wait.
  template <class Host>
  void send(executor& /*exec*/, Host& to) const {
    for (std::size_t i = 0; i < values_.size(); ++i) to[i] = values_[i];
  }

  /// Copies `from` (host memory, as many elements) in.
  void assign(executor& /*exec*/, std::span<const float> from) {
    BELLOWS_EXPECTS(from.size() == values_.size(), "float_array: ", from.size(), " values for ", values_.size(),
                    " elements");
    std::ranges::copy(from, values_.begin());
  }

private:
  std::vector<float> values_;
};

/// n values on the host that copy_word delivers into (plan/float_array.hpp), value-initialised.
template <class T>
class host_values {
public:
  host_values() = default;
  host_values(executor& /*exec*/, std::size_t n) : values_(n) {}
  [[nodiscard]] T& operator[](std::size_t i) noexcept { return values_[i]; }
  [[nodiscard]] const T& operator[](std::size_t i) const noexcept { return values_[i]; }
  [[nodiscard]] std::size_t size() const noexcept { return values_.size(); }

private:
  std::vector<T> values_;
};

/// *out = sqrt(x_0^2 + x_1^2 + ...) / divisor, rounded to float, or 0 when divisor is 0: the
/// squares summed in double in index order, the order cuda::mean_norm keeps, so that both
/// backends get the same bits (each square of a float is exact in double, so a fused
/// multiply-add rounds as the separate product and sum do).
inline void mean_norm(executor& /*exec*/, std::span<const float> x, double divisor, float* out) {
  if (divisor == 0.0) {
    *out = 0.0f;
    return;
  }
  double squares = 0.0;
  for (const float v : x) squares += double{v} * v;
  *out = static_cast<float>(std::sqrt(squares) / divisor);
}

/// Copies one word of the backend's memory (a count or a flag a kernel wrote) into `to`: at
/// once here; on the device, complete once exec.synchronize() returns.
template <class T>
void copy_word(executor& /*exec*/, T& to, const T* from) noexcept {
  std::memcpy(static_cast<void*>(&to), from, sizeof(T));
}

}  // namespace bellows::cpu

namespace bellows {
template <>
struct float_array_of<cpu::executor> {
  using type = cpu::float_array;
};
template <class T>
struct host_values_of<cpu::executor, T> {
  using type = cpu::host_values<T>;
};
static_assert(Executor<cpu::executor>, "cpu::executor must model Executor");
}  // namespace bellows
