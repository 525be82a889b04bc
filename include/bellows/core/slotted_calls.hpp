// SPDX-License-Identifier: Apache-2.0
// Collective calls of blocks of one size, in host memory, whose copies land a slot apart: the
// scatter exchange's alltoall and allgather (compressors/detail/scaled_codes.hpp,
// sync/bucket_exchange.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "bellows/core/error.hpp"
#include "bellows/core/gather_buffer.hpp"

namespace bellows {

/// Where a collective offers allgather_slots or alltoall_slots (one call of blocks of one size,
/// straight into an array, as bellows_torch's process group does where its allgather and alltoall
/// make two), they are used; otherwise its allgather or alltoall, into a gather_buffer whose
/// blocks, of one size and a multiple of its alignment, lie a slot apart too. The storage grows to
/// the largest call seen and is reused.
class slotted_calls {
public:
  /// Every rank's `mine` (of one size on every rank, a multiple of 8 bytes), rank r's at byte
  /// r * mine.size() of the result.
  template <class Coll>
  std::span<std::byte> allgather(Coll& coll, std::span<const std::byte> mine) {
    const std::size_t slot = mine.size(), w = coll.size();
    check(slot);
    if constexpr (requires(std::span<std::byte> out) { coll.allgather_slots(mine, out, slot); }) {
      coll.allgather_slots(mine, grow(w * slot), slot);
      return grow(w * slot);
    } else {
      coll.allgather(mine, buffer_);
      return {buffer_.block(0).data(), w * slot};
    }
  }

  /// What each rank sent this one of `blocks` (W blocks of `slot` bytes, a multiple of 8, block j
  /// for rank j), what rank i sent at byte i * slot of the result.
  template <class Coll>
  std::span<std::byte> alltoall(Coll& coll, std::span<const std::byte> blocks, std::size_t slot) {
    const std::size_t w = coll.size();
    check(slot);
    if constexpr (requires(std::span<std::byte> out) { coll.alltoall_slots(blocks, out, slot); }) {
      coll.alltoall_slots(blocks, grow(w * slot), slot);
      return grow(w * slot);
    } else {
      sizes_.assign(w, slot);
      coll.alltoall(blocks, sizes_, buffer_);
      return {buffer_.block(0).data(), w * slot};
    }
  }

private:
  static void check(std::size_t slot) {
    BELLOWS_EXPECTS(slot % gather_buffer::alignment == 0, "slotted_calls: slots of ", slot,
                    " bytes, not a multiple of ", gather_buffer::alignment);
  }
  std::span<std::byte> grow(std::size_t bytes) {
    if (slots_.size() * 8 < bytes) slots_.resize((bytes + 7) / 8);  // allocates while calls grow
    return std::as_writable_bytes(std::span(slots_)).first(bytes);
  }

  gather_buffer buffer_;
  std::vector<std::uint64_t> slots_;  // 8-byte aligned
  std::vector<std::size_t> sizes_;
};

}  // namespace bellows
