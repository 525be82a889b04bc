// SPDX-License-Identifier: Apache-2.0
// The kinds of error memory (docs/spec.md#error-feedback), named by compressor parameters on
// every backend.
#pragma once

#include <string_view>

#include "bellows/core/error.hpp"
#include "bellows/core/method.hpp"

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

/// Raises bellows::error unless `f` is one of the kinds above (a value cast from a number may not be).
inline void check_feedback(std::string_view who, feedback f) {
  BELLOWS_EXPECTS(f == feedback::none || f == feedback::residual || f == feedback::scaled, who,
                  ": feedback must be none, residual or scaled, got the value ", static_cast<unsigned>(f));
}

/// The --error-feedback option of a method descriptor whose default memory is `fallback`.
[[nodiscard]] constexpr method_option feedback_option(feedback fallback) noexcept {
  return {"error-feedback", "memory of what compression left out", to_string(fallback), "residual|none"};
}

/// The memory chosen by settings of feedback_option, or `fallback` when they name none.
[[nodiscard]] inline feedback feedback_setting(const method_settings& s, feedback fallback) {
  const std::string_view v = s.choice("error-feedback", "residual|none", to_string(fallback));
  return v == "none" ? feedback::none : feedback::residual;
}

}  // namespace bellows
