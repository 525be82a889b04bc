// SPDX-License-Identifier: Apache-2.0
// Where a variable-size allgather leaves the blocks of all ranks.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "bellows/core/checked.hpp"
#include "bellows/core/error.hpp"

namespace bellows {

/// The result of an allgather: one byte block per rank, in rank order. Every block starts at a
/// multiple of `alignment` bytes from the start of the storage, so a block whose producer padded
/// it to that multiple (as the wire format does) can be read as arrays of 4- and 8-byte values.
/// The storage grows to the largest total seen and is reused, so a steady training loop does not
/// allocate here after its first steps.
class gather_buffer {
public:
  static constexpr std::size_t alignment = 8;

  /// For collective implementers: lay out one block per rank of the given sizes. Sizes whose
  /// padded total does not fit std::size_t (as a corrupted size from a peer may claim) raise
  /// bellows::error naming the rank, and leave the buffer as it was.
  void resize(std::span<const std::size_t> sizes) {
    std::size_t total = 0;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      const std::size_t block = detail::checked_round_up(sizes[r], alignment, "gather_buffer: block of rank ", r);
      total = detail::checked_add(total, block, "gather_buffer: blocks up to rank ", r);
    }
    bytes_.resize(total);
    offsets_.resize(sizes.size() + 1);
    sizes_.assign(sizes.begin(), sizes.end());
    std::size_t at = 0;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      offsets_[r] = at;
      at += (sizes[r] + alignment - 1) / alignment * alignment;
    }
    offsets_[sizes.size()] = at;
  }

  /// Number of blocks (the collective's size after a gather).
  [[nodiscard]] std::size_t blocks() const noexcept { return sizes_.size(); }

  /// Block of rank r.
  [[nodiscard]] std::span<const std::byte> block(std::size_t r) const {
    BELLOWS_EXPECTS(r < blocks(), "gather_buffer: no block ", r, " in ", blocks());
    return {bytes_.data() + offsets_[r], sizes_[r]};
  }
  /// Writable block of rank r, for collective implementers.
  [[nodiscard]] std::span<std::byte> block(std::size_t r) {
    BELLOWS_EXPECTS(r < blocks(), "gather_buffer: no block ", r, " in ", blocks());
    return {bytes_.data() + offsets_[r], sizes_[r]};
  }

  /// Sum of the block sizes (without alignment padding).
  [[nodiscard]] std::size_t total_bytes() const noexcept {
    std::size_t t = 0;
    for (std::size_t s : sizes_) t += s;
    return t;
  }

private:
  std::vector<std::byte> bytes_;
  std::vector<std::size_t> offsets_;
  std::vector<std::size_t> sizes_;
};

/// Refuses, with bellows::error naming `who`, an alltoall's blocks (concepts.hpp,
/// AlltoallCollective) that are not one size per rank of `ranks`, adding up to the bytes given.
inline void check_alltoall_blocks(std::string_view who, std::span<const std::byte> blocks,
                                  std::span<const std::size_t> sizes, std::size_t ranks) {
  BELLOWS_EXPECTS(sizes.size() == ranks, who, ": ", sizes.size(), " block sizes for ", ranks, " ranks");
  std::size_t total = 0;
  for (const std::size_t s : sizes) {
    BELLOWS_EXPECTS(s <= blocks.size() - total, who, ": the blocks' sizes exceed the ", blocks.size(), " bytes given");
    total += s;
  }
  BELLOWS_EXPECTS(total == blocks.size(), who, ": the blocks' sizes add up to ", total, " bytes of the ", blocks.size(),
                  " given");
}

}  // namespace bellows
