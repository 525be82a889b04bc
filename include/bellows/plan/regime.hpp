// SPDX-License-Identifier: Apache-2.0
// The words of regime detection (docs/spec.md#accordion) that detectors, their parameters and the
// Synchronizer share.
#pragma once

#include <cstdint>

namespace bellows {

/// What a regime detector decides for a layer: `critical` layers get the low compression level.
enum class regime : std::uint8_t { critical, normal };

[[nodiscard]] constexpr const char* to_string(regime r) noexcept {
  return r == regime::critical ? "critical" : "normal";
}

/// Whether a layer takes part in regime detection. A layer that the compressor would not
/// compress (PowerSGD's 1-D tensors, say) is `excluded`: it is never accumulated, adds nothing
/// to the per-epoch exchange, and is reported `critical` (the low compression level) forever.
enum class participation : std::uint8_t { included, excluded };

}  // namespace bellows
