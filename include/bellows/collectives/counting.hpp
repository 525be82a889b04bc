// SPDX-License-Identifier: Apache-2.0
// A decorator over any Collective that counts what passes through it and models its time on an
// alpha-beta link.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>

#include "bellows/concepts.hpp"
#include "bellows/core/error.hpp"

namespace bellows::collectives {

/// A link of latency alpha (seconds per message) and bandwidth beta (bytes per second).
struct alpha_beta {
  double latency_s = 0.0;
  double bandwidth_bytes_per_s = std::numeric_limits<double>::infinity();
};

/// Counts of one kind of operation, from this rank's point of view.
struct op_counts {
  std::uint64_t calls = 0;
  std::uint64_t bytes_sent = 0;      ///< bytes this rank handed to the operation
  std::uint64_t bytes_received = 0;  ///< bytes of other ranks it got back (allgather, broadcast)
  double modeled_s = 0.0;            ///< modeled time on the link
};

/// Wraps a Collective, forwards every call, and records per operation kind the calls, bytes and
/// a modeled time. The models are the usual ring algorithms on W ranks, for a buffer of B bytes:
///  - allreduce_sum: 2 (W - 1) alpha + 2 (W - 1) / W * B / beta
///  - allgather:     (W - 1) alpha + (bytes of the other ranks' blocks) / beta
///  - broadcast:     (W - 1) alpha + B / beta (a pipelined chain)
/// With W = 1 every modeled time is 0.
template <Collective Inner>
class counting {
public:
  explicit counting(Inner& inner, alpha_beta link = {}) : inner_(&inner), link_(link) {
    BELLOWS_EXPECTS(link.latency_s >= 0, "counting: latency must be >= 0 s, got ", link.latency_s);
    BELLOWS_EXPECTS(link.bandwidth_bytes_per_s > 0, "counting: bandwidth must be > 0 B/s, got ",
                    link.bandwidth_bytes_per_s);
  }

  [[nodiscard]] std::size_t rank() const { return inner_->rank(); }
  [[nodiscard]] std::size_t size() const { return inner_->size(); }

  void allreduce_sum(std::span<float> v) {
    inner_->allreduce_sum(v);
    const double w = static_cast<double>(size());
    const double bytes = static_cast<double>(v.size_bytes());
    record(allreduce_, v.size_bytes(), 0,
           2 * (w - 1) * link_.latency_s + 2 * (w - 1) / w * bytes / link_.bandwidth_bytes_per_s);
  }

  void allgather(std::span<const std::byte> mine, gather_buffer& out) {
    inner_->allgather(mine, out);
    const std::size_t others = out.total_bytes() - mine.size();
    const double w = static_cast<double>(size());
    record(allgather_, mine.size(), others,
           (w - 1) * link_.latency_s + static_cast<double>(others) / link_.bandwidth_bytes_per_s);
  }

  // (clang-format-14 would join the requires clause to the declaration)
  // clang-format off
  void broadcast(std::span<std::byte> data, std::size_t root)
    requires requires(Inner& i) { i.broadcast(data, root); }
  // clang-format on
  {
    inner_->broadcast(data, root);
    const double w = static_cast<double>(size());
    const bool is_root = rank() == root;
    record(broadcast_, is_root ? data.size() : 0, is_root ? 0 : data.size(),
           w > 1 ? (w - 1) * link_.latency_s + static_cast<double>(data.size()) / link_.bandwidth_bytes_per_s : 0.0);
  }

  [[nodiscard]] const op_counts& allreduce() const noexcept { return allreduce_; }
  [[nodiscard]] const op_counts& allgather() const noexcept { return allgather_; }
  [[nodiscard]] const op_counts& broadcast() const noexcept { return broadcast_; }
  /// The three kinds added together.
  [[nodiscard]] op_counts total() const noexcept {
    op_counts t;
    for (const op_counts* o : {&allreduce_, &allgather_, &broadcast_}) {
      t.calls += o->calls;
      t.bytes_sent += o->bytes_sent;
      t.bytes_received += o->bytes_received;
      t.modeled_s += o->modeled_s;
    }
    return t;
  }
  void reset() noexcept { allreduce_ = allgather_ = broadcast_ = {}; }
  [[nodiscard]] Inner& inner() const noexcept { return *inner_; }

private:
  static void record(op_counts& c, std::size_t sent, std::size_t received, double seconds) {
    ++c.calls;
    c.bytes_sent += sent;
    c.bytes_received += received;
    c.modeled_s += seconds;
  }

  Inner* inner_;
  alpha_beta link_;
  op_counts allreduce_, allgather_, broadcast_;
};

}  // namespace bellows::collectives
