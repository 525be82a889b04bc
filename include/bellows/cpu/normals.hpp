// SPDX-License-Identifier: Apache-2.0
// Standard normal floats from a Philox stream, addressable by index, for PowerSGD's shared query.
#pragma once

#include <algorithm>
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

/// PowerSGD's warm start: next = query, column by column (m floats each, as many as next holds),
/// except that a column of query that is all zero is drawn instead, as normals j m .. j m + m - 1
/// of stream s (the first draw's), since a zero column would otherwise stay zero for good.
inline void warm_query(executor& exec, std::span<const float> query, std::span<float> next, std::size_t m,
                       const philox::stream& s) {
  BELLOWS_EXPECTS(m != 0 && next.size() % m == 0 && query.size() >= next.size(), "warm_query: a query of ",
                  query.size(), " floats for ", next.size(), " in columns of ", m);
  for (std::size_t j = 0; j < next.size() / m; ++j) {
    const std::span<const float> from = query.subspan(j * m, m);
    const std::span<float> col = next.subspan(j * m, m);
    if (std::ranges::all_of(from, [](float v) { return v == 0.0f; }))
      fill_normals(exec, col, s, j * m);
    else
      std::ranges::copy(from, col.begin());
  }
}

}  // namespace bellows::cpu
