// SPDX-License-Identifier: Apache-2.0
// The aggregation of every allgather codec, written once: gather the payloads, validate all of
// them, and only then write the average of their decoded values.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "bellows/concepts.hpp"
#include "bellows/core/gather_buffer.hpp"
#include "bellows/core/traffic.hpp"

namespace bellows::detail {

/// Allgathers this rank's payload `mine` into `gathered` and reads every rank's block, in rank
/// order, with read(block, parts[r]): it validates the whole block (a malformed one raises
/// bellows::wire_error before `out` is touched), keeps what the average needs in parts[r], and
/// returns the block's status. If any sender flagged non-finite input, returns non_finite and
/// leaves `out` as it was. Otherwise average(parts, out) writes (1/W) * the sum over ranks, in
/// rank order from 0.0f, of the decoded blocks: the codec's one-pass kernel. `parts` is resized
/// to W (no allocation once it has held W).
template <Collective Coll, class Part, class Read, class Average>
step_status gather_average(std::span<const std::byte> mine, std::span<float> out, Coll& coll, gather_buffer& gathered,
                           std::vector<Part>& parts, Read&& read, Average&& average) {
  coll.allgather(mine, gathered);
  parts.resize(gathered.blocks());
  bool flagged = false;
  for (std::size_t r = 0; r < gathered.blocks(); ++r)
    flagged |= read(gathered.block(r), parts[r]) == step_status::non_finite;
  if (flagged) return step_status::non_finite;
  average(std::span<const Part>(parts), out);
  return step_status::ok;
}

}  // namespace bellows::detail
