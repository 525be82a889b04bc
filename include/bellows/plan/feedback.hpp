// SPDX-License-Identifier: Apache-2.0
// The kinds of error memory (docs/spec.md#error-feedback), named by compressor parameters on
// every backend.
#pragma once

#include <string_view>

namespace bellows {

enum class feedback : unsigned char {
  none,      ///< no memory
  residual,  ///< e = m - contribution, in gradient units
  scaled,    ///< the same, rescaled by lr_old / lr_new when the learning rate changes (Mem-SGD's units)
};

[[nodiscard]] constexpr std::string_view to_string(feedback f) noexcept {
  switch (f) {
    case feedback::none: return "none";
    case feedback::residual: return "residual";
    case feedback::scaled: return "scaled";
  }
  return "unknown";
}

}  // namespace bellows
