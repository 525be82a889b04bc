// SPDX-License-Identifier: Apache-2.0
// Parameters of QSGD (compressors/qsgd.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "bellows/plan/codes.hpp"
#include "bellows/plan/feedback.hpp"

namespace bellows {

/// How a bucket's scale is measured: its L2 norm (the paper's choice) or its largest magnitude.
using qsgd_norm = bucket_norm;

struct qsgd_params {
  /// b: bits per element, 2, 4 or 8 (sign-magnitude: s = 2^(b-1) - 1 levels above zero).
  unsigned bits = 8;
  /// d: elements per bucket (one float32 scale each), 1 .. 2^24 - 1.
  std::size_t bucket = 512;
  qsgd_norm norm = qsgd_norm::l2;
  /// Key of the rounding noise, drawn from (seed, step, layer, rank).
  std::uint64_t seed = 0;
  /// Off by default (QSGD is unbiased); when on, the contribution is the local decoded value.
  bellows::feedback feedback = bellows::feedback::none;
};

}  // namespace bellows
