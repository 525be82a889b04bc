// SPDX-License-Identifier: Apache-2.0
// The aggregation of every allgather codec, written once: gather the payloads, validate all of
// them, and only then write the average of their decoded values.
#pragma once

#include <cstddef>
#include <span>

#include "bellows/concepts.hpp"
#include "bellows/core/gather_buffer.hpp"
#include "bellows/core/traffic.hpp"

namespace bellows::detail {

/// Allgathers this rank's payload `mine`, validates every rank's block (a malformed one raises
/// bellows::wire_error before `out` is touched), and returns non_finite if any sender flagged
/// non-finite input, leaving `out` as it was. Otherwise `out` becomes (1/W) * the sum over ranks,
/// in rank order, of the decoded blocks. `zero` and `divide` are the backend's kernels.
template <PayloadCodec Codec, Collective Coll, class Zero, class Divide>
step_status gather_average(const Codec& codec, const typename Codec::state& st,
                           std::span<const std::byte> mine, std::span<float> out, Coll& coll,
                           gather_buffer& gathered, Zero&& zero, Divide&& divide) {
  coll.allgather(mine, gathered);
  bool flagged = false;
  for (std::size_t r = 0; r < gathered.blocks(); ++r)
    flagged |= codec.validate(st, gathered.block(r)) == step_status::non_finite;
  if (flagged) return step_status::non_finite;
  zero(out);
  for (std::size_t r = 0; r < gathered.blocks(); ++r) (void)codec.decode_add(st, gathered.block(r), out);
  divide(out, static_cast<float>(gathered.blocks()));
  return step_status::ok;
}

}  // namespace bellows::detail
