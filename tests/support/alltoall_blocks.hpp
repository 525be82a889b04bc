// SPDX-License-Identifier: Apache-2.0
// Blocks for checking an alltoall (concepts.hpp, AlltoallCollective) against a brute-force
// reference: the block rank `from` sends rank `to` in round `round` has (from * 3 + to * 5 +
// round) % 7 bytes, so that some are empty and sizes differ both ways, and byte k of it is a value
// of (from, to, round, k) alone. Every rank can then say what it should receive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <bellows/core/gather_buffer.hpp>

namespace bellows::testing {

[[nodiscard]] inline std::size_t alltoall_size(std::size_t from, std::size_t to, std::size_t round) {
  return (from * 3 + to * 5 + round) % 7;
}
[[nodiscard]] inline std::byte alltoall_byte(std::size_t from, std::size_t to, std::size_t round, std::size_t k) {
  return std::byte(static_cast<unsigned char>(from * 61 + to * 17 + round * 5 + k));
}

/// What rank `from` sends in `round` to each of `ranks` ranks: the sizes and the blocks back to back.
struct alltoall_send {
  std::vector<std::size_t> sizes;
  std::vector<std::byte> blocks;
  alltoall_send(std::size_t from, std::size_t ranks, std::size_t round) {
    for (std::size_t to = 0; to < ranks; ++to) {
      sizes.push_back(alltoall_size(from, to, round));
      for (std::size_t k = 0; k < sizes.back(); ++k) blocks.push_back(alltoall_byte(from, to, round, k));
    }
  }
};

/// Whether `out` holds, in rank order, what every rank sent rank `to` in `round`, each block at
/// gather_buffer's alignment.
[[nodiscard]] inline bool alltoall_received(const gather_buffer& out, std::size_t to, std::size_t ranks,
                                            std::size_t round) {
  if (out.blocks() != ranks) return false;
  for (std::size_t from = 0; from < ranks; ++from) {
    const std::span<const std::byte> b = out.block(from);
    if (b.size() != alltoall_size(from, to, round) ||
        reinterpret_cast<std::uintptr_t>(b.data()) % gather_buffer::alignment != 0)
      return false;
    for (std::size_t k = 0; k < b.size(); ++k)
      if (b[k] != alltoall_byte(from, to, round, k)) return false;
  }
  return true;
}

}  // namespace bellows::testing
