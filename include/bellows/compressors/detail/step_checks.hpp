// SPDX-License-Identifier: Apache-2.0
// The checks every compressor makes before a step or a PayloadCodec call changes anything, on
// every backend, with one wording: the buffer fits the layer, and the collective enqueues on the
// executor's stream where both have one.
#pragma once

#include <cstddef>
#include <string_view>

#include "bellows/core/error.hpp"
#include "bellows/core/shape.hpp"

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

}  // namespace bellows::detail
