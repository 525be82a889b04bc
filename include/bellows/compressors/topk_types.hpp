// SPDX-License-Identifier: Apache-2.0
// Parameters of the top-k compressor (compressors/topk.hpp).
#pragma once

#include <cstdint>
#include <string_view>

#include "bellows/plan/feedback.hpp"

namespace bellows {

enum class topk_mode : std::uint8_t {
  exact,        ///< the k largest |x|; ties at the threshold go to the lower index (docs/spec.md#top-k)
  approximate,  ///< between k and ceil(1.25 k) of the largest |x|, when that saves work
};

[[nodiscard]] constexpr std::string_view to_string(topk_mode m) noexcept {
  return m == topk_mode::exact ? "exact" : "approximate";
}

struct topk_params {
  /// k = clamp(ceil(ratio * n), 1, n) for a layer of n elements; ratio in (0, 1].
  double ratio = 0.01;
  /// When > 0, keep min(k, n) elements of every layer and ignore `ratio`; never negative.
  std::int64_t k = 0;
  topk_mode mode = topk_mode::exact;
  /// Error feedback fused into the selection pass: e = m - (the kept entries of m = g + e).
  bellows::feedback feedback = bellows::feedback::residual;
  /// Keys the sample that sets the selection threshold. Exact results do not depend on it; the
  /// kept set of approximate mode does.
  std::uint64_t seed = 0;
  /// Average by a dense allreduce instead of an allgather when docs/spec.md#top-k finds it cheaper:
  /// W * k * (index + value bytes) >= 4 n.
  bool dense_switch = true;
};

}  // namespace bellows
