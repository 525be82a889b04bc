// SPDX-License-Identifier: Apache-2.0
// What one step of a compressor reports (whether it ran, and the traffic it caused), and the
// rounds of collective calls it makes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>

#include "bellows/core/error.hpp"

namespace bellows {

/// Traffic one rank caused: the bytes it handed to the collective (payload blocks it gathered
/// out, buffers it reduced), the number of values among them (floats sent, the unit the
/// Accordion paper counts), and the number of elements the compressor kept (top-k's achieved
/// count; the layer size for dense methods).
struct traffic {
  std::uint64_t bytes = 0;
  std::uint64_t elements = 0;
  std::uint64_t kept = 0;

  traffic& operator+=(const traffic& o) noexcept {
    bytes += o.bytes;
    elements += o.elements;
    kept += o.kept;
    return *this;
  }
  friend traffic operator+(traffic a, const traffic& b) noexcept { return a += b; }
  friend bool operator==(const traffic&, const traffic&) = default;
};

enum class step_status : std::uint8_t {
  ok,          ///< the averaged result was written and the state advanced
  non_finite,  ///< some rank's input held NaN or Inf: output left as input, no state changed
};

[[nodiscard]] constexpr const char* to_string(step_status s) noexcept {
  return s == step_status::ok ? "ok" : "non_finite";
}

/// What a compressor's `reduce` returns.
struct reduce_result {
  step_status status = step_status::ok;
  traffic sent{};
};

/// The collective operation of one round of a compressor's step.
enum class collective_op : std::uint8_t {
  allreduce_sum,  ///< floats summed elementwise over the ranks
  allgather,      ///< each rank's payload delivered to every rank
  alltoall,       ///< W payloads from each rank, the j-th to rank j (the scatter exchange's first round)
};

/// One round of one layer's step: its operation and the bytes this rank hands to it (4 per float
/// for allreduce_sum). Where a finite payload's size depends on the data (top-k's approximate
/// count), `bytes` is the most and `exact` is false; a payload flagged non-finite may be shorter.
struct exchange_round {
  collective_op op = collective_op::allreduce_sum;
  std::size_t bytes = 0;
  bool exact = true;

  friend constexpr bool operator==(const exchange_round&, const exchange_round&) = default;
};

/// The rounds of one layer's step, in the order the step makes them: one, or two (PowerSGD's P
/// then Q; identity's verdict then the data). A step that finds non-finite input stops after
/// the round that told every rank so.
class exchange_rounds {
public:
  static constexpr std::size_t capacity = 2;

  constexpr exchange_rounds() = default;
  constexpr exchange_rounds(std::initializer_list<exchange_round> rounds) {
    BELLOWS_EXPECTS(rounds.size() <= capacity, "exchange_rounds: ", rounds.size(), " rounds, at most ", capacity);
    for (const exchange_round& r : rounds) rounds_[size_++] = r;
  }

  [[nodiscard]] constexpr std::size_t size() const noexcept { return size_; }
  [[nodiscard]] constexpr const exchange_round& operator[](std::size_t i) const noexcept { return rounds_[i]; }
  [[nodiscard]] constexpr const exchange_round* begin() const noexcept { return rounds_.data(); }
  [[nodiscard]] constexpr const exchange_round* end() const noexcept { return rounds_.data() + size_; }

  /// Round by round (the slots past size() always hold the default round).
  friend constexpr bool operator==(const exchange_rounds&, const exchange_rounds&) = default;

private:
  std::array<exchange_round, capacity> rounds_{};
  std::size_t size_ = 0;
};

/// One layer's part of one round of a step run by phases (concepts.hpp, PhasedCompressor), in the
/// backend's memory, rounds()[i].bytes long:
///  - allreduce_sum: `values`, what this rank hands over, which the call sums in place;
///  - allgather: at begin, `values` is where this rank's payload goes; at finish, rank 0's copy
///    of it in the gathered buffer, rank r's copy starting `stride` floats after rank r - 1's.
///  - alltoall: before the call, `values` is where this rank's payload for rank 0 goes, the one
///    for rank j `stride` floats after the one for rank j - 1; after it, what rank 0 sent to this
///    rank, what rank i sent `stride` floats after what rank i - 1 sent.
struct round_part {
  std::span<float> values;
  std::size_t stride = 0;
};

/// One layer's parts of the rounds of a step, one per round.
using round_parts = std::span<const round_part>;

/// Where PowerSGD's parts start: at a multiple of 16 bytes. The device's products pick their
/// vector width, and with it the order of their sums, by the alignment of what they read and
/// write, so a part aligned as the state's own buffers are gives the bits of reduce. An exchange
/// layer aligns every part so; the other compressors take any float's alignment.
inline constexpr std::size_t part_alignment = 16;

}  // namespace bellows
