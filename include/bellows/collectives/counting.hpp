// SPDX-License-Identifier: Apache-2.0
// A decorator over any Collective that counts what passes through it and models its time on an
// alpha-beta link.
#pragma once

#include <algorithm>
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
  std::uint64_t bytes_received = 0;  ///< bytes of other ranks it got back (allreduce_received for an allreduce)
  double modeled_s = 0.0;            ///< modeled time on the link, every call by the ring algorithm
  double modeled_cheapest_s = 0.0;   ///< every call by the cheapest of the ring and logarithmic ones
};

/// The modeled seconds of one call: by the ring algorithm, and by the cheapest algorithm of those
/// MPI and NCCL pick from by message size.
struct call_time {
  double ring_s = 0.0;
  double cheapest_s = 0.0;
};

/// floor(log2 w) and ceil(log2 w) for w >= 1: the steps of the logarithmic algorithms.
struct log2_steps {
  double floor = 0, ceil = 0;
  explicit constexpr log2_steps(std::size_t w) {
    for (std::size_t v = w; v > 1; v >>= 1) ++floor;
    ceil = floor + ((w & (w - 1)) == 0 ? 0 : 1);
  }
};

/// An allreduce of `bytes` on w ranks. Ring: 2 (w - 1) alpha + 2 (w - 1) / w B / beta.
/// Rabenseifner's (recursive halving, then doubling): 2 log2(w) alpha + 2 (w - 1) / w B / beta.
/// Recursive doubling: log2(w) (alpha + B / beta). Where w is not a power of two, the two
/// logarithmic ones run on the largest power of two below it, after the extra ranks fold their
/// buffers in and before they get the result: 2 (alpha + B / beta) more.
[[nodiscard]] inline call_time model_allreduce(double bytes, std::size_t w, alpha_beta link) {
  if (w <= 1) return {};
  const double a = link.latency_s, t = bytes / link.bandwidth_bytes_per_s, n = static_cast<double>(w);
  const log2_steps steps(w);
  const double fold = steps.floor == steps.ceil ? 0.0 : 2 * (a + t);
  const double ring = 2 * (n - 1) * a + 2 * (n - 1) / n * t;
  const double halving = 2 * steps.floor * a + 2 * (n - 1) / n * t + fold, doubling = steps.floor * (a + t) + fold;
  return {ring, std::min({ring, halving, doubling})};
}

/// The bytes a rank receives in an allreduce of `bytes` on w ranks by the ring or Rabenseifner's
/// algorithm: 2 (w - 1) / w of the buffer (its reduce-scatter, then its allgather), rounded
/// down to a whole byte; 0 for w = 1. What counting records and bellows-bench --model reports.
[[nodiscard]] constexpr std::uint64_t allreduce_received(std::uint64_t bytes, std::size_t w) noexcept {
  return w <= 1 ? 0 : 2 * (w - 1) * bytes / w;
}

/// An allgather delivering `others` bytes of the other ranks' blocks. Ring: (w - 1) alpha +
/// others / beta; Bruck's: ceil(log2 w) alpha + others / beta.
[[nodiscard]] inline call_time model_allgather(double others, std::size_t w, alpha_beta link) {
  if (w <= 1) return {};
  const double t = others / link.bandwidth_bytes_per_s;
  const double ring = static_cast<double>(w - 1) * link.latency_s + t;
  return {ring, std::min(ring, log2_steps(w).ceil * link.latency_s + t)};
}

/// A broadcast of `bytes`. Pipelined chain: (w - 1) alpha + B / beta; binomial tree:
/// ceil(log2 w) (alpha + B / beta).
[[nodiscard]] inline call_time model_broadcast(double bytes, std::size_t w, alpha_beta link) {
  if (w <= 1) return {};
  const double a = link.latency_s, t = bytes / link.bandwidth_bytes_per_s;
  const double chain = static_cast<double>(w - 1) * a + t;
  return {chain, std::min(chain, log2_steps(w).ceil * (a + t))};
}

/// An alltoall in which this rank sends `sent` and receives `received` bytes of the other ranks'
/// blocks. Pairwise exchange: (w - 1) alpha + max(sent, received) / beta, a link carrying both
/// ways at once. Bruck's: ceil(log2 w) steps, step j forwarding every block whose distance
/// (destination - source mod w) has bit j set, so that a block travels as many times as its
/// distance has bits: ceil(log2 w) alpha + h / (w - 1) max(sent, received) / beta, h the bits of
/// the distances 1 to w - 1 together (about log2(w) / 2 per block), for blocks of equal size.
/// MPI libraries take Bruck's for small blocks on many ranks, the pairwise one otherwise.
[[nodiscard]] inline call_time model_alltoall(double sent, double received, std::size_t w, alpha_beta link) {
  if (w <= 1) return {};
  const double t = std::max(sent, received) / link.bandwidth_bytes_per_s;
  const double pairwise = static_cast<double>(w - 1) * link.latency_s + t;
  std::size_t bits = 0;  // of the distances 1 .. w - 1: per bit, whole periods of 2 b and the rest
  for (std::size_t b = 1; b < w; b <<= 1) bits += w / (2 * b) * b + (w % (2 * b) > b ? w % (2 * b) - b : 0);
  const double bruck = log2_steps(w).ceil * link.latency_s + static_cast<double>(bits) / static_cast<double>(w - 1) * t;
  return {pairwise, std::min(pairwise, bruck)};
}

/// Wraps a Collective, forwards every call, and records per operation kind the calls, the bytes
/// sent and received (an allreduce of B bytes receives allreduce_received: 2 (W - 1) / W B), and
/// two modeled times (model_allreduce, model_allgather, model_broadcast, model_alltoall above):
/// `modeled_s` by the usual ring algorithms on W ranks, for a buffer of B bytes,
///  - allreduce_sum: 2 (W - 1) alpha + 2 (W - 1) / W * B / beta
///  - allgather:     (W - 1) alpha + (bytes of the other ranks' blocks) / beta
///  - broadcast:     (W - 1) alpha + B / beta (a pipelined chain)
///  - alltoall:      (W - 1) alpha + max(bytes sent, bytes received) / beta (pairwise)
/// and `modeled_cheapest_s` by the cheapest of those and the logarithmic algorithms. With W = 1
/// every modeled time is 0.
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
    record(allreduce_, v.size_bytes(), allreduce_received(v.size_bytes(), size()),
           model_allreduce(static_cast<double>(v.size_bytes()), size(), link_));
  }

  void allgather(std::span<const std::byte> mine, gather_buffer& out) {
    inner_->allgather(mine, out);
    const std::size_t others = out.total_bytes() - mine.size();
    record(allgather_, mine.size(), others, model_allgather(static_cast<double>(others), size(), link_));
  }

  // (clang-format-14 would join the requires clause to the declaration)
  // clang-format off
  void broadcast(std::span<std::byte> data, std::size_t root)
    requires requires(Inner& i) { i.broadcast(data, root); }
  // clang-format on
  {
    inner_->broadcast(data, root);
    const bool is_root = rank() == root;
    record(broadcast_, is_root ? data.size() : 0, is_root ? 0 : data.size(),
           model_broadcast(static_cast<double>(data.size()), size(), link_));
  }

  /// Where Inner has it (AlltoallCollective): bytes sent and received count the other ranks'
  /// blocks, not this rank's own.
  // clang-format off
  void alltoall(std::span<const std::byte> blocks, std::span<const std::size_t> sizes, gather_buffer& out)
    requires AlltoallCollective<Inner>
  // clang-format on
  {
    inner_->alltoall(blocks, sizes, out);
    const std::size_t own = sizes[rank()], sent = blocks.size() - own, received = out.total_bytes() - own;
    record(alltoall_, sent, received,
           model_alltoall(static_cast<double>(sent), static_cast<double>(received), size(), link_));
  }

  [[nodiscard]] const op_counts& allreduce() const noexcept { return allreduce_; }
  [[nodiscard]] const op_counts& allgather() const noexcept { return allgather_; }
  [[nodiscard]] const op_counts& broadcast() const noexcept { return broadcast_; }
  [[nodiscard]] const op_counts& alltoall() const noexcept { return alltoall_; }
  /// The four kinds added together.
  [[nodiscard]] op_counts total() const noexcept {
    op_counts t;
    for (const op_counts* o : {&allreduce_, &allgather_, &broadcast_, &alltoall_}) {
      t.calls += o->calls;
      t.bytes_sent += o->bytes_sent;
      t.bytes_received += o->bytes_received;
      t.modeled_s += o->modeled_s;
      t.modeled_cheapest_s += o->modeled_cheapest_s;
    }
    return t;
  }
  void reset() noexcept { allreduce_ = allgather_ = broadcast_ = alltoall_ = {}; }
  [[nodiscard]] Inner& inner() const noexcept { return *inner_; }

private:
  static void record(op_counts& c, std::size_t sent, std::size_t received, call_time time) {
    ++c.calls;
    c.bytes_sent += sent;
    c.bytes_received += received;
    c.modeled_s += time.ring_s;
    c.modeled_cheapest_s += time.cheapest_s;
  }

  Inner* inner_;
  alpha_beta link_;
  op_counts allreduce_, allgather_, broadcast_, alltoall_;
};

}  // namespace bellows::collectives
