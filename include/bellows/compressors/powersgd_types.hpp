// SPDX-License-Identifier: Apache-2.0
// Parameters of PowerSGD (compressors/powersgd.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "bellows/plan/feedback.hpp"

namespace bellows {

/// How PowerSGD compresses. The defaults are those of PyTorch's PowerSGDState, except the rank
/// (PyTorch's default is 1 too) and the seed, which every rank must share.
struct powersgd_params {
  /// r: columns of the factors P (n x r) and Q (m x r); r' = min(r, n, m) is used. >= 1.
  std::size_t rank = 1;
  /// A layer is compressed only when (n + m) * r' * min_compression_rate < n * m. > 0.
  float min_compression_rate = 2.0f;
  /// Reuse the previous step's Q (orthogonalised again) instead of drawing a new one each step.
  bool warm_start = true;
  /// eps of the orthogonalisation: column j is divided by (||column j|| + eps). >= 0.
  float orthogonalization_eps = 0.0f;
  /// The error memory e = M - out (residual by default; none turns error feedback off).
  bellows::feedback feedback = bellows::feedback::residual;
  /// Key of the shared query's random stream; the same on every rank.
  std::uint64_t seed = 0;
};

}  // namespace bellows
