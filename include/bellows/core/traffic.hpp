// SPDX-License-Identifier: Apache-2.0
// What one step of a compressor reports: whether it ran, and the traffic it caused.
#pragma once

#include <cstdint>

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

}  // namespace bellows
