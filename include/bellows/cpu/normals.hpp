// SPDX-License-Identifier: Apache-2.0
// Standard normal floats from a Philox stream, addressable by index, for PowerSGD's shared query.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "bellows/core/error.hpp"
#include "bellows/core/philox.hpp"
#include "bellows/cpu/executor.hpp"

namespace bellows::cpu {

/// out[t] = normal number `first + t` of stream `s`. Normal number i is the first (i even) or
/// the second (i odd) of philox::to_normals(word 2*(i/2), word 2*(i/2)+1), so any range of
/// the sequence can be drawn on its own and agrees with drawing the whole sequence at once.
inline void fill_normals(executor& /*exec*/, std::span<float> out, const philox::stream& s, std::uint64_t first) {
  BELLOWS_EXPECTS(2 * (first + out.size()) <= philox::stream::max_words, "fill_normals: normals ", first, " .. ",
                  first + out.size(), " overrun the stream");
  for (std::size_t t = 0; t < out.size();) {
    const std::uint64_t i = first + t;
    const auto pair = philox::to_normals(s.word(i & ~std::uint64_t{1}), s.word(i | 1));
    if ((i & 1) == 0) {
      out[t++] = pair.first;
      if (t < out.size()) out[t++] = pair.second;
    } else {
      out[t++] = pair.second;
    }
  }
}

}  // namespace bellows::cpu
