// SPDX-License-Identifier: Apache-2.0
// The versioned wire format of compressed payloads, with a writer and a validating reader.
//
// A payload is a 40-byte header followed by a body of typed arrays, each array starting at a
// multiple of its element size, the whole body padded with zero bytes to a multiple of 8 bytes.
// All integers are little-endian.
//
//   offset  size  field
//        0     4  magic      "BLWS" (0x53574C42)
//        4     2  version    1
//        6     1  codec      the codec's id (wire::codec::id, declared with each compressor)
//        7     1  flags      bit 0: 64-bit indices; bit 1: the sender's input was non-finite
//        8     8  n          elements of the layer
//       16     8  count      codec-defined: kept elements (top-k, rand-k), buckets (QSGD)
//       24     4  param      codec-defined: bits | bucket size << 8 (QSGD), 0 otherwise
//       28     4  reserved   0
//       32     8  body_bytes bytes after the header, padding included
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>

#include "bellows/core/checked.hpp"
#include "bellows/core/config.hpp"
#include "bellows/core/error.hpp"

namespace bellows::wire {

inline constexpr std::uint32_t magic = 0x53574C42u;  // bytes 'B' 'L' 'W' 'S'
inline constexpr std::uint16_t version = 1;
inline constexpr std::size_t body_alignment = 8;

/// A payload format: the id in byte 6 of the header and a name for messages. Each compressor
/// declares its own (its `*_method::codec`); compressors/list.hpp refuses two with one id.
struct codec {
  std::uint8_t id = 0;
  const char* name = "";
};

namespace flag {
inline constexpr std::uint8_t index64 = 1u << 0;
inline constexpr std::uint8_t non_finite = 1u << 1;
/// Set by a scatter exchange's chunk owner (docs/spec.md#scatter-exchange) that received a
/// malformed payload for its chunk: every rank that reads its payload raises the same wire_error.
inline constexpr std::uint8_t relayed_malformed = 1u << 3;
inline constexpr std::uint8_t all = index64 | non_finite;
}  // namespace flag

struct header {
  std::uint32_t magic = wire::magic;
  std::uint16_t version = wire::version;
  std::uint8_t codec = 0;  ///< wire::codec::id
  std::uint8_t flags = 0;
  std::uint64_t n = 0;
  std::uint64_t count = 0;
  std::uint32_t param = 0;
  std::uint32_t reserved = 0;
  std::uint64_t body_bytes = 0;
};
static_assert(sizeof(header) == 40 && std::is_trivially_copyable_v<header>,
              "the wire header must be 40 bytes with no padding");

inline constexpr std::size_t header_bytes = sizeof(header);

/// Where an array of `count` values of T ends in a body when the previous one ended at byte
/// `at` (the array starts at the next multiple of its element size). Raises bellows::error when
/// the size does not fit std::size_t.
template <class T>
[[nodiscard]] constexpr std::size_t array_end(std::size_t at, std::size_t count) {
  return detail::checked_add(detail::checked_round_up(at, alignof(T), "wire: array start"),
                             detail::checked_mul(count, sizeof(T), "wire: array of ", count, " elements"),
                             "wire: array end");
}

/// The padded body size for a body whose last array ends at `end` (checked like array_end).
[[nodiscard]] constexpr std::size_t padded(std::size_t end) {
  return detail::checked_round_up(end, body_alignment, "wire: padded body");
}

/// Bytes of a whole payload (header and padded body) whose last array ends at `end` (checked
/// like array_end): what a codec's max_payload_bytes returns.
[[nodiscard]] constexpr std::size_t payload_bytes(std::size_t end) {
  return detail::checked_add(header_bytes, padded(end), "wire: payload");
}

/// Writes a payload into caller-provided storage (sized with the codec's own size function,
/// from array_end and payload_bytes): the header first, then arrays in order, then `finish`.
class writer {
public:
  writer(std::span<std::byte> out, const header& h) : out_(out) {
    BELLOWS_EXPECTS(out.size() >= header_bytes, "wire::writer: storage of ", out.size(), " bytes cannot hold the ",
                    header_bytes, "-byte header");
    BELLOWS_EXPECTS(reinterpret_cast<std::uintptr_t>(out.data()) % body_alignment == 0,
                    "wire::writer: storage must start at a multiple of ", body_alignment, " bytes");
    h_ = h;
  }

  /// Appends an array and returns where it was written, for kernels that fill it in place.
  template <class T>
  std::span<T> array(std::size_t count) {
    static_assert(std::is_trivially_copyable_v<T>);
    const std::size_t start = (pos_ + alignof(T) - 1) / alignof(T) * alignof(T);
    BELLOWS_EXPECTS(header_bytes + start <= out_.size() && count <= (out_.size() - header_bytes - start) / sizeof(T),
                    "wire::writer: array of ", count, " elements overruns the ", out_.size(), "-byte storage");
    const std::size_t end = start + count * sizeof(T);
    std::memset(out_.data() + header_bytes + pos_, 0, start - pos_);
    pos_ = end;
    return {reinterpret_cast<T*>(out_.data() + header_bytes + start), count};
  }

  /// Pads the body, writes the header with `flags` added to its own (what the arrays turned out
  /// to hold, e.g. flag::non_finite), and returns the payload's bytes.
  std::span<std::byte> finish(std::uint8_t flags = 0) {
    const std::size_t body = padded(pos_);
    h_.flags |= flags;
    BELLOWS_EXPECTS(header_bytes + body <= out_.size(), "wire::writer: padding overruns storage");
    std::memset(out_.data() + header_bytes + pos_, 0, body - pos_);
    h_.body_bytes = body;
    std::memcpy(out_.data(), &h_, header_bytes);
    return out_.first(header_bytes + body);
  }

private:
  std::span<std::byte> out_;
  header h_{};
  std::size_t pos_ = 0;
};

/// Raises bellows::error, naming `who` and the layer, when `out` cannot hold a payload of
/// `bytes` as a codec's encode writes it (too short, or not starting at a multiple of 8 bytes).
inline void check_storage(std::string_view who, std::string_view layer, std::span<const std::byte> out,
                          std::size_t bytes) {
  BELLOWS_EXPECTS(out.size() >= bytes, who, ": layer '", layer, "': storage of ", out.size(),
                  " bytes for a payload of up to ", bytes, " (max_payload_bytes)");
  BELLOWS_EXPECTS(reinterpret_cast<std::uintptr_t>(out.data()) % body_alignment == 0, who, ": layer '", layer,
                  "': payload storage must start at a multiple of ", body_alignment, " bytes");
}

/// Reads a payload, validating everything before anything is used. Construction checks the
/// header against the expected codec; `array` checks each array against the body; `finish`
/// checks that the body held nothing more than the arrays and zero padding. Every failure
/// raises bellows::wire_error naming the field and the value.
class reader {
public:
  reader(std::span<const std::byte> in, codec expected) : in_(in), name_(expected.name) {
    if (in.size() < header_bytes)
      fail<wire_error>("wire: payload of ", in.size(), " bytes is shorter than the ", header_bytes, "-byte header");
    if (reinterpret_cast<std::uintptr_t>(in.data()) % body_alignment != 0)
      fail<wire_error>("wire: payload does not start at a multiple of ", body_alignment, " bytes");
    std::memcpy(static_cast<void*>(&h_), in.data(), header_bytes);
    if (h_.magic != magic) fail<wire_error>("wire: bad magic 0x", std::hex, h_.magic, " (expected 0x", magic, ")");
    if (h_.version != version)
      fail<wire_error>("wire: unsupported version ", h_.version, " (this build reads ", version, ")");
    if (h_.codec != expected.id)
      fail<wire_error>("wire: payload of codec ", unsigned{h_.codec}, " where ", expected.name, " (",
                       unsigned{expected.id}, ") was expected");
    if ((h_.flags & flag::relayed_malformed) != 0)
      fail<wire_error>("wire: its sender, a chunk's owner, received a malformed payload for the chunk");
    if ((h_.flags & ~flag::all) != 0) fail<wire_error>("wire: unknown flag bits 0x", std::hex, unsigned{h_.flags});
    if (h_.reserved != 0) fail<wire_error>("wire: reserved field is ", h_.reserved, ", not 0");
    if (h_.body_bytes != in.size() - header_bytes)
      fail<wire_error>("wire: header says ", h_.body_bytes, " body bytes, payload has ", in.size() - header_bytes);
    if (h_.body_bytes % body_alignment != 0)
      fail<wire_error>("wire: body of ", h_.body_bytes, " bytes is not padded to ", body_alignment);
  }

  [[nodiscard]] const header& head() const noexcept { return h_; }

  /// The next array of `count` values of T.
  template <class T>
  [[nodiscard]] std::span<const T> array(std::uint64_t count) {
    static_assert(std::is_trivially_copyable_v<T>);
    const std::size_t body = in_.size() - header_bytes;
    const std::size_t start = (pos_ + alignof(T) - 1) / alignof(T) * alignof(T);
    if (count > (body - std::min(start, body)) / sizeof(T))
      fail<wire_error>("wire: array of ", count, " elements of ", sizeof(T), " bytes overruns the ", body,
                       "-byte body of a ", name_, " payload");
    pos_ = start + count * sizeof(T);
    return {reinterpret_cast<const T*>(in_.data() + header_bytes + start), static_cast<std::size_t>(count)};
  }

  /// Checks that only zero padding follows the last array.
  void finish() const {
    const std::size_t body = in_.size() - header_bytes;
    if (padded(pos_) != body)
      fail<wire_error>("wire: ", body - pos_, " bytes follow the arrays of a ", name_, " payload (expected ",
                       padded(pos_) - pos_, ")");
    for (std::size_t i = pos_; i < body; ++i)
      if (in_[header_bytes + i] != std::byte{0}) fail<wire_error>("wire: non-zero padding byte at body offset ", i);
  }

private:
  std::span<const std::byte> in_;
  const char* name_;
  header h_{};
  std::size_t pos_ = 0;
};

}  // namespace bellows::wire
