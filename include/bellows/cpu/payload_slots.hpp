// SPDX-License-Identifier: Apache-2.0
// The CPU's payload slots (plan/payload_slots.hpp): this rank's payload in host memory, the
// gather_buffer a Collective's allgather fills, and the parts the average reads; and the steps of
// a scaled payload that are not the codec's own: writing its header and padding, and validating
// what was gathered (each payload by the codec's host check, in rank order).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "bellows/core/error.hpp"
#include "bellows/core/gather_buffer.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/plan/payload_slots.hpp"

namespace bellows::cpu {

template <class Parts>
class payload_slots {
public:
  /// The words of a call on one payload: host memory on the caller's stack.
  struct words {
    explicit words(executor& /*exec*/) noexcept {}
    words(const words&) = delete;
    words& operator=(const words&) = delete;
    static void reserve(executor& /*exec*/) noexcept {}
    unsigned flag = 0;
    unsigned* non_finite = &flag;
  };

  /// Makes room for this rank's payload of `bytes` (allocating only to grow; 0 for the phases,
  /// whose payloads lie in the caller's buffers) and clears the flag.
  void prepare(executor& /*exec*/, std::size_t /*ranks*/, std::size_t bytes) {
    if (mine_.size() * 8 < bytes) mine_.resize((bytes + 7) / 8);
    bytes_ = bytes;
    flag_ = 0;
    view_ = nullptr;
  }
  /// The payloads a caller gathered: `ranks` of at most `bytes`, rank r's at base + r * stride
  /// (each as long as its header says, within `bytes`), in place of the slots' own.
  void view(const std::byte* base, std::size_t stride, std::size_t ranks, std::size_t bytes) noexcept {
    view_ = base;
    view_stride_ = stride;
    view_ranks_ = ranks;
    view_bytes_ = bytes;
  }
  [[nodiscard]] std::span<std::byte> mine(std::size_t /*rank*/) noexcept {
    return std::as_writable_bytes(std::span(mine_)).first(bytes_);
  }
  [[nodiscard]] unsigned* non_finite() noexcept { return &flag_; }

  /// What check_payloads found (set_status), read as the device's slots are read after a wait:
  /// may_average() whether every payload was good and finite, status(...) the step's status
  /// (a malformed payload raised in check_payloads already).
  void set_status(step_status s) noexcept { status_ = s; }
  [[nodiscard]] bool may_average() const noexcept { return status_ == step_status::ok; }
  template <class Check>
  [[nodiscard]] step_status status(executor& /*exec*/, std::string_view /*who*/, const layer_info& /*layer*/,
                                   Check&& /*check*/) const noexcept {
    return status_;
  }
  /// The step's allgather of this rank's payload.
  template <class Coll>
  void gather(Coll& coll, std::size_t rank) {
    coll.allgather(std::span<const std::byte>(mine(rank)), gathered_);
  }

  [[nodiscard]] std::size_t ranks() const noexcept { return view_ != nullptr ? view_ranks_ : gathered_.blocks(); }
  /// Rank r's payload as gathered.
  [[nodiscard]] std::span<const std::byte> block(std::size_t r) const {
    if (view_ == nullptr) return gathered_.block(r);
    const std::span<const std::byte> slot(view_ + r * view_stride_, view_bytes_);
    if (slot.size() < wire::header_bytes) return slot;
    wire::header h;
    std::memcpy(static_cast<void*>(&h), slot.data(), sizeof h);
    return slot.first(wire::header_bytes + std::min<std::uint64_t>(h.body_bytes, slot.size() - wire::header_bytes));
  }

  /// Every rank's arrays, read from validated payloads of `shape` (no allocation once the slots
  /// have held as many ranks).
  [[nodiscard]] std::span<const Parts> parts(const scaled_payload& shape) {
    parts_.resize(ranks());
    for (std::size_t r = 0; r < ranks(); ++r) parts_[r] = scaled_parts(block(r), shape);
    return parts_;
  }

  /// The arrays of one validated payload of `shape`.
  [[nodiscard]] static Parts scaled_parts(std::span<const std::byte> payload, const scaled_payload& shape) {
    const auto* scales = reinterpret_cast<const float*>(payload.data() + wire::header_bytes);
    const auto* codes = reinterpret_cast<const std::uint8_t*>(payload.data() + shape.codes_at);
    return {{scales, shape.header.count}, {codes, shape.code_bytes}};
  }

protected:
  [[nodiscard]] gather_buffer& gathered() noexcept { return gathered_; }
  [[nodiscard]] std::vector<Parts>& parts_storage() noexcept { return parts_; }

private:
  std::vector<std::uint64_t> mine_;  // 8-byte aligned
  std::size_t bytes_ = 0;
  unsigned flag_ = 0;
  step_status status_ = step_status::ok;
  gather_buffer gathered_;
  const std::byte* view_ = nullptr;  // a caller's gathered payloads, when not null
  std::size_t view_stride_ = 0, view_ranks_ = 0, view_bytes_ = 0;
  std::vector<Parts> parts_;
};

/// Writes `shape.header` at the start of `payload`, flagged non-finite when *non_finite, and
/// zeroes the padding after the packed bytes: what wire::writer::finish writes.
inline void finish_payload(executor& /*exec*/, std::span<std::byte> payload, const scaled_payload& shape,
                           const unsigned* non_finite) {
  wire::header h = shape.header;
  if (*non_finite != 0) h.flags |= wire::flag::non_finite;
  std::memcpy(payload.data(), &h, wire::header_bytes);
  const std::size_t pad = shape.codes_at + shape.code_bytes;
  std::memset(payload.data() + pad, 0, shape.bytes - pad);
}

/// Every gathered payload validated by `check(payload)`, the codec's host validation, in rank
/// order; the slots keep the status: non_finite when any sender flagged its input, else ok. A
/// malformed payload raises the validation's wire_error, naming `who`, the layer and the rank,
/// as the device's slots do.
template <class Parts, class Shape, class Check>
void check_payloads(executor& /*exec*/, payload_slots<Parts>& slots, std::string_view who, const layer_info& layer,
                    const Shape& /*shape*/, Check&& check) {
  bool flagged = false;
  for (std::size_t r = 0; r < slots.ranks(); ++r) {
    try {
      flagged |= check(slots.block(r)) == step_status::non_finite;
    } catch (const wire_error& e) {
      fail<wire_error>(who, ": layer '", layer.name, "': the payload of rank ", r, ": ", e.what());
    }
  }
  slots.set_status(flagged ? step_status::non_finite : step_status::ok);
}

/// The status of one payload in host memory: `check(payload)`, the codec's host validation.
template <class Shape, class Check>
[[nodiscard]] step_status validate_payload(executor& /*exec*/, std::string_view /*who*/, const layer_info& /*layer*/,
                                           std::span<const std::byte> payload, const Shape& /*shape*/, Check&& check) {
  return check(payload);
}

}  // namespace bellows::cpu

namespace bellows {
template <class Parts>
struct payload_slots_of<cpu::executor, Parts> {
  using type = cpu::payload_slots<Parts>;
};
}  // namespace bellows
