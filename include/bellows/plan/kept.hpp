// SPDX-License-Identifier: Apache-2.0
// The check of what top-k and rand-k parameters share, on every backend: k, or the ratio that
// sets it (docs/spec.md#k-from-a-ratio).
#pragma once

#include <cstdint>
#include <string_view>

#include "bellows/core/error.hpp"

namespace bellows::detail {

/// Raises bellows::error naming the parameter for a negative k or, when k is 0 (the ratio sets
/// it), a ratio outside (0, 1].
inline void check_kept_params(std::string_view who, double ratio, std::int64_t k) {
  BELLOWS_EXPECTS(k >= 0, who, ": k must not be negative, got ", k);
  BELLOWS_EXPECTS(k > 0 || (ratio > 0 && ratio <= 1), who, ": ratio must be in (0, 1], got ", ratio);
}

}  // namespace bellows::detail
