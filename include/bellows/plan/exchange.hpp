// SPDX-License-Identifier: Apache-2.0
// How the ranks of a payload codec average a layer (docs/spec.md#top-k-leader), named by compressor
// parameters on every backend.
#pragma once

#include <string_view>

#include "bellows/core/error.hpp"
#include "bellows/core/method.hpp"

namespace bellows {

enum class exchange : unsigned char {
  gather,  ///< every rank's payload to every rank (allgather); each rank receives W - 1 payloads
  leader,  ///< top-k: the indices of one rank, the leader, used by all; their values allreduced
};

[[nodiscard]] constexpr std::string_view to_string(exchange x) noexcept {
  switch (x) {
    case exchange::gather: return "gather";
    case exchange::leader: return "leader";
  }
  return "unknown";
}

/// Raises bellows::error unless `x` is one of `allowed`, naming the codec and the value.
inline void check_exchange(std::string_view who, exchange x, std::string_view allowed) {
  for (const std::string_view a : split_choices(allowed))
    if (a == to_string(x)) return;
  if (x != exchange::gather && x != exchange::leader)
    fail(who, ": exchange must be one of ", allowed, ", got the value ", static_cast<unsigned>(x));
  fail(who, ": exchange ", to_string(x), " is not one of ", who, "'s (", allowed, ")");
}

/// The --exchange option of a method descriptor whose exchanges are `choices` ('|'-separated).
[[nodiscard]] constexpr method_option exchange_option(std::string_view choices) noexcept {
  return {"exchange", "how the ranks average: gather, or leader (one rank's indices)", "gather", choices};
}

/// The exchange chosen by settings of exchange_option (gather when they name none).
[[nodiscard]] inline exchange exchange_setting(const method_settings& s, std::string_view choices) {
  return s.choice("exchange", choices, "gather") == "leader" ? exchange::leader : exchange::gather;
}

}  // namespace bellows
