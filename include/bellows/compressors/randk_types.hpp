// SPDX-License-Identifier: Apache-2.0
// Parameters of the rand-k compressor (compressors/randk.hpp).
#pragma once

#include <cstdint>
#include <string_view>

#include "bellows/plan/feedback.hpp"

namespace bellows {

enum class randk_mode : std::uint8_t {
  shared,    ///< every rank keeps the same indices; the values are averaged by one allreduce
  per_rank,  ///< each rank draws its own indices; payloads are averaged by allgather
};

[[nodiscard]] constexpr std::string_view to_string(randk_mode m) noexcept {
  return m == randk_mode::shared ? "shared" : "per_rank";
}

struct randk_params {
  /// k = clamp(ceil(ratio * n), 1, n) for a layer of n elements; ratio in (0, 1].
  double ratio = 0.01;
  /// When > 0, keep min(k, n) elements of every layer and ignore `ratio`; never negative.
  std::int64_t k = 0;
  randk_mode mode = randk_mode::shared;
  /// Multiply the kept values by n / k, so that the compressed vector is unbiased. Only without
  /// error feedback: the scaled compressor is no contraction, and its memory would grow.
  bool unbiased = false;
  /// Error feedback, fused into the gathering pass. On by default: unscaled rand-k keeps k / n of
  /// the gradient in expectation, and the memory returns the rest in later steps.
  bellows::feedback feedback = bellows::feedback::residual;
  /// Keys the index draw, with the step, the layer and (per-rank mode) the rank.
  std::uint64_t seed = 0;
};

}  // namespace bellows
