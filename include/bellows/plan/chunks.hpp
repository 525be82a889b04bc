// SPDX-License-Identifier: Apache-2.0
// How the scatter exchange (docs/spec.md#scatter-exchange) cuts a layer among W ranks: chunks of
// whole codec blocks, the rank that owns each, and the Philox rank words of its streams. Every
// rank derives the same plan from (n, W, block, layer id); nothing of it travels.
#pragma once

#include <cstddef>
#include <cstdint>

#include "bellows/core/error.hpp"

namespace bellows {

/// A layer of n elements cut into W chunks of whole blocks (a codec's scale bucket; the last block
/// may be short): chunk c holds blocks/W blocks, one more for the first blocks % W chunks, so the
/// last chunks may be shorter or empty. Chunk c is owned by rank (c + rotation) mod W, where the
/// rotation is the layer's id mod W: the small layers of a model, each a chunk or two, spread over
/// the ranks instead of all landing on rank 0.
class chunk_plan {
public:
  /// The most ranks a scatter exchange takes: a rank and a chunk share one 32-bit Philox word.
  static constexpr std::size_t max_ranks = std::size_t{1} << 15;

  chunk_plan() = default;
  /// Raises bellows::error naming `who` for W = 0, W > max_ranks or a block of 0.
  chunk_plan(const char* who, std::size_t n, std::size_t ranks, std::size_t block, std::uint32_t layer_id)
      : n_(n), ranks_(ranks), block_(block) {
    BELLOWS_EXPECTS(ranks >= 1 && ranks <= max_ranks, who, ": the scatter exchange takes 1 to ", max_ranks,
                    " ranks, got ", ranks);
    BELLOWS_EXPECTS(block >= 1, who, ": a chunk's block must hold 1 element at least");
    blocks_ = (n + block - 1) / block;
    rotation_ = layer_id % ranks;
  }

  [[nodiscard]] std::size_t ranks() const noexcept { return ranks_; }
  /// Chunk c covers elements [begin(c), end(c)).
  [[nodiscard]] std::size_t begin(std::size_t c) const noexcept {
    const std::size_t q = blocks_ / ranks_, r = blocks_ % ranks_;
    const std::size_t b = c * q + (c < r ? c : r);
    return b * block_ < n_ ? b * block_ : n_;
  }
  [[nodiscard]] std::size_t end(std::size_t c) const noexcept { return begin(c + 1); }
  [[nodiscard]] std::size_t size(std::size_t c) const noexcept { return end(c) - begin(c); }
  /// The largest chunk: chunk 0's.
  [[nodiscard]] std::size_t largest() const noexcept { return ranks_ == 0 ? 0 : size(0); }

  [[nodiscard]] std::size_t owner(std::size_t c) const noexcept { return (c + rotation_) % ranks_; }
  /// The chunk rank r owns.
  [[nodiscard]] std::size_t owned_by(std::size_t r) const noexcept { return (r + ranks_ - rotation_) % ranks_; }

  /// The Philox rank word of rank r's encoding of chunk c: bit 31 set (a gather step's words are
  /// ranks, below 2^31), bit 30 clear, the chunk in bits 15 to 29 and the rank in bits 0 to 14.
  [[nodiscard]] static std::uint32_t worker_stream(std::size_t c, std::size_t r) noexcept {
    return 0x8000'0000u | static_cast<std::uint32_t>(c) << 15 | static_cast<std::uint32_t>(r);
  }
  /// The Philox rank word of the owner's encoding of chunk c: bits 31 and 30 set, the chunk in
  /// bits 15 to 29, bits 0 to 14 zero, so that it is never philox::stream::shared (all ones).
  [[nodiscard]] static std::uint32_t owner_stream(std::size_t c) noexcept {
    return 0xC000'0000u | static_cast<std::uint32_t>(c) << 15;
  }

  friend constexpr bool operator==(const chunk_plan&, const chunk_plan&) = default;

private:
  std::size_t n_ = 0, ranks_ = 0, block_ = 1, blocks_ = 0, rotation_ = 0;
};

}  // namespace bellows
