// SPDX-License-Identifier: Apache-2.0
// How the ranks of a payload codec average a layer (docs/spec.md#top-k-leader), named by compressor
// parameters on every backend.
#pragma once

#include <string_view>
#include <vector>

#include "bellows/core/error.hpp"
#include "bellows/core/method.hpp"
#include "bellows/plan/feedback.hpp"

namespace bellows {

enum class exchange : unsigned char {
  gather,   ///< every rank's payload to every rank (allgather); each rank receives W - 1 payloads
  leader,   ///< top-k: the indices of one rank, the leader, used by all; their values allreduced
  scatter,  ///< chunks to their owners (alltoall), each re-encoded there, then an allgather of those
};

[[nodiscard]] constexpr std::string_view to_string(exchange x) noexcept {
  switch (x) {
    case exchange::gather: return "gather";
    case exchange::leader: return "leader";
    case exchange::scatter: return "scatter";
  }
  return "unknown";
}

/// Raises bellows::error unless `x` is one of `allowed`, naming the codec and the value.
inline void check_exchange(std::string_view who, exchange x, std::string_view allowed) {
  for (const std::string_view a : split_choices(allowed))
    if (a == to_string(x)) return;
  if (x != exchange::gather && x != exchange::leader && x != exchange::scatter)
    fail(who, ": exchange must be one of ", allowed, ", got the value ", static_cast<unsigned>(x));
  fail(who, ": exchange ", to_string(x), " is not one of ", who, "'s (", allowed, ")");
}

/// The --exchange option of a method descriptor whose exchanges are `choices` ('|'-separated).
[[nodiscard]] constexpr method_option exchange_option(std::string_view choices) noexcept {
  return {"exchange", "how the ranks average: gather (allgather), scatter (chunk owners) or leader (top-k)", "gather",
          choices};
}

/// The exchange chosen by settings of exchange_option (gather when they name none).
[[nodiscard]] inline exchange exchange_setting(const method_settings& s, std::string_view choices) {
  const std::string_view x = s.choice("exchange", choices, "gather");
  return x == "leader" ? exchange::leader : x == "scatter" ? exchange::scatter : exchange::gather;
}

/// The --owner-memory option of a method with a scatter exchange, whose default is `fallback`.
[[nodiscard]] constexpr method_option owner_memory_option(bool fallback) noexcept {
  return {"owner-memory", "under scatter, whether a chunk's owner keeps its re-encoding's error",
          fallback ? "on" : "off", "on|off"};
}

/// The owner memory chosen by settings of owner_memory_option, or `fallback` when they name none.
[[nodiscard]] inline bool owner_memory_setting(const method_settings& s, bool fallback) {
  return s.choice("owner-memory", "on|off", fallback ? "on" : "off") == "on";
}

/// `p`, a payload codec's parameters, with what every such codec's settings name alike: the
/// memory (`memory` when they name none), the exchange among `choices`, and the owner memory
/// (`owner` when they name none).
template <class Params>
[[nodiscard]] Params with_exchange_settings(Params p, const method_settings& s, std::string_view choices,
                                            feedback memory, bool owner) {
  p.feedback = feedback_setting(s, memory);
  p.exchange = exchange_setting(s, choices);
  p.owner_memory = owner_memory_setting(s, owner);
  return p;
}

/// A payload codec's description: its own parameters, `own`, then the memory, the exchange and
/// the owner memory of `p`.
template <class Params>
[[nodiscard]] std::vector<method_param> with_exchange_description(std::vector<method_param> own, const Params& p) {
  own.push_back({"error_feedback", to_string(p.feedback)});
  own.push_back({"exchange", to_string(p.exchange)});
  own.push_back({"owner_memory", p.owner_memory ? "on" : "off"});
  return own;
}

}  // namespace bellows
