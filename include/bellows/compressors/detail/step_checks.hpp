// SPDX-License-Identifier: Apache-2.0
// The checks every compressor makes before a step or a PayloadCodec call changes anything, on
// every backend, with one wording: the buffer fits the layer, the collective enqueues on the
// executor's stream where both have one, and the parts of a step run by phases fit its rounds.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "bellows/core/error.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/core/wire.hpp"

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
/// `rounds`, each as long as its round's bytes, and starting at a multiple of `alignment` bytes
/// (of 8 at least for an allgather's or an alltoall's payload, as the wire format asks).
inline void check_parts(std::string_view who, const layer_info& layer, const exchange_rounds& rounds, round_parts parts,
                        std::size_t alignment = alignof(float)) {
  BELLOWS_EXPECTS(parts.size() == rounds.size(), who, ": layer '", layer.name, "': ", parts.size(),
                  " parts for a step of ", rounds.size(), " rounds");
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const std::span<float> part = parts[i].values;
    BELLOWS_EXPECTS(part.size_bytes() == rounds[i].bytes, who, ": layer '", layer.name, "': part ", i, " holds ",
                    part.size_bytes(), " bytes, round ", i, " takes ", rounds[i].bytes);
    const std::size_t align =
        rounds[i].op != collective_op::allreduce_sum ? std::max(alignment, wire::body_alignment) : alignment;
    BELLOWS_EXPECTS(reinterpret_cast<std::uintptr_t>(part.data()) % align == 0, who, ": layer '", layer.name,
                    "': part ", i, " does not start at a multiple of ", align, " bytes");
  }
}

/// Raises bellows::error, naming `who` and the layer, unless gathered payloads of up to `bytes`
/// lying `stride` bytes apart (W = `ranks`) leave each its room, at a multiple of 8 bytes.
inline void check_gathered(std::string_view who, const layer_info& layer, std::size_t stride, std::size_t bytes,
                           std::size_t ranks) {
  BELLOWS_EXPECTS(ranks == 1 || (stride >= bytes && stride % wire::body_alignment == 0), who, ": layer '", layer.name,
                  "': gathered payloads ", stride, " bytes apart, for payloads of up to ", bytes, " (a multiple of ",
                  wire::body_alignment, " at least as large)");
}

}  // namespace bellows::detail
