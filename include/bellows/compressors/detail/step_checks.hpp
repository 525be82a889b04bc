// SPDX-License-Identifier: Apache-2.0
// The checks every compressor makes before a step or a PayloadCodec call changes anything, on
// every backend, with one wording: the buffer fits the layer, the collective enqueues on the
// executor's stream where both have one, and the parts of a step run by phases fit its rounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "bellows/core/error.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"

namespace bellows::detail {

/// Raises bellows::error, naming `who` and the layer, when a buffer of n elements does not fit it.
inline void check_buffer(std::string_view who, const layer_info& layer, std::size_t n) {
  BELLOWS_EXPECTS(n == layer.size(), who, ": layer '", layer.name, "' of shape ", layer.shape.to_string(), " has ",
                  layer.size(), " elements, the buffer ", n);
}

/// Raises bellows::error, naming `who` and the layer, when the collective and the executor both
/// enqueue on a stream and not on the same one (their work would race); nothing for a backend of
/// host memory.
template <class Coll, class Exec>
void check_stream(std::string_view who, const layer_info& layer, Coll& coll, Exec& exec) {
  if constexpr (requires { coll.stream() == exec.stream(); })
    BELLOWS_EXPECTS(coll.stream() == exec.stream(), who, ": layer '", layer.name,
                    "': the collective and the executor enqueue on different streams; give both the same one");
}

/// Raises bellows::error, naming `who` and the layer, unless `parts` has one part per round of
/// `rounds`, each round an allreduce_sum of as many floats as its part holds (the phases of
/// allgather rounds are not written yet), each part starting at a multiple of `alignment` bytes.
inline void check_parts(std::string_view who, const layer_info& layer, const exchange_rounds& rounds, round_parts parts,
                        std::size_t alignment = alignof(float)) {
  BELLOWS_EXPECTS(parts.size() == rounds.size(), who, ": layer '", layer.name, "': ", parts.size(),
                  " parts for a step of ", rounds.size(), " rounds");
  for (std::size_t i = 0; i < parts.size(); ++i) {
    BELLOWS_EXPECTS(rounds[i].op == collective_op::allreduce_sum, who, ": layer '", layer.name, "': round ", i,
                    " is an allgather, and only allreduce rounds run by phases yet (call reduce)");
    BELLOWS_EXPECTS(parts[i].size() * sizeof(float) == rounds[i].bytes, who, ": layer '", layer.name, "': part ", i,
                    " holds ", parts[i].size(), " floats, round ", i, " sums ", rounds[i].bytes / sizeof(float));
    BELLOWS_EXPECTS(reinterpret_cast<std::uintptr_t>(parts[i].data()) % alignment == 0, who, ": layer '", layer.name,
                    "': part ", i, " does not start at a multiple of ", alignment, " bytes");
  }
}

}  // namespace bellows::detail
