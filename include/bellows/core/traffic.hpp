// SPDX-License-Identifier: Apache-2.0
// What one step of a compressor reports: whether it ran, and the traffic it caused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "bellows/core/error.hpp"

namespace bellows {

/// Traffic one rank caused: the bytes it handed to the collective (payload blocks it gathered
/// out, buffers it reduced), the number of values among them (floats sent, the unit the
/// Accordion paper counts), and the number of elements the compressor kept (top-k's achieved
/// count; the layer size for dense methods).
struct traffic {
  std::uint64_t bytes = 0;
  std::uint64_t elements = 0;
  std::uint64_t kept = 0;

  traffic& operator+=(const traffic& o) noexcept {
    bytes += o.bytes;
    elements += o.elements;
    kept += o.kept;
    return *this;
  }
  friend traffic operator+(traffic a, const traffic& b) noexcept { return a += b; }
  friend bool operator==(const traffic&, const traffic&) = default;
};

enum class step_status : std::uint8_t {
  ok,          ///< the averaged result was written and the state advanced
  non_finite,  ///< some rank's input held NaN or Inf: output left as input, no state changed
};

[[nodiscard]] constexpr const char* to_string(step_status s) noexcept {
  return s == step_status::ok ? "ok" : "non_finite";
}

/// What a compressor's `reduce` returns.
struct reduce_result {
  step_status status = step_status::ok;
  traffic sent{};
};

/// Traffic per layer, accumulated over steps, and the total. Sized once for the layers.
class traffic_log {
public:
  explicit traffic_log(std::size_t layers = 0) : per_layer_(layers) {}

  void resize(std::size_t layers) { per_layer_.resize(layers); }
  [[nodiscard]] std::size_t layers() const noexcept { return per_layer_.size(); }

  void record(std::size_t layer, const traffic& t) { at(layer) += t; }
  [[nodiscard]] const traffic& layer(std::size_t layer) const { return const_cast<traffic_log*>(this)->at(layer); }
  [[nodiscard]] traffic total() const noexcept {
    traffic t;
    for (const traffic& l : per_layer_) t += l;
    return t;
  }

private:
  traffic& at(std::size_t layer) {
    if (layer >= per_layer_.size()) fail("traffic_log: layer ", layer, " of ", per_layer_.size());
    return per_layer_[layer];
  }

  std::vector<traffic> per_layer_;
};

}  // namespace bellows
