// SPDX-License-Identifier: Apache-2.0
// One step of a bucket of layers in one collective call per round and operation: each layer's
// phases (concepts.hpp, PhasedCompressor) around buffers shared by the whole bucket. Written once
// over the executor; the Synchronizer runs every bucket through it, and a trainer that drives
// its own states can too.
//
// Layout. Per round r, the layers whose step has a round r get one part each, one after the other
// from a multiple of part_alignment bytes: an allreduce_sum part in the round's summed buffer, an
// allgather part in the round's block (this rank's payloads), an alltoall part in each of the
// round's W scattered blocks (block j: this rank's payloads for rank j, at the same place in
// each). The call of round r is one allreduce_sum of the summed buffer, one allgather of the block
// and one alltoall of the scattered blocks, each made only when some layer needs it; every rank
// makes the same calls, since rounds(state, ranks) is the same on every rank. The alltoall is
// host memory's (AlltoallCollective, through core/slotted_calls.hpp); a bucket that needs one over
// a collective without it is refused before any layer begins. The blocks are of one size on every
// rank: where the collective has allgather_slots (a DeviceCollective, and host collectives that
// offer it: one call where allgather may make two), the copies land a block apart in an array of
// the backend's memory; otherwise in a gather_buffer on the host, whose blocks of one size lie a
// block apart too. A
// finite payload shorter than its part (top-k's approximate count) travels at its part's length;
// the traffic reported per layer is the compressor's own, as its reduce reports it.
//
// A bucket of one layer is that layer's reduce: the same bits, and it reads a verdict after a
// round that saves the next (identity's data, PowerSGD's Q), where the phases, which read no
// verdict, make every round for every layer. No phase waits for the executor: a bucket's
// verdicts and counts (the device copies them into pinned host memory) are read after the one
// wait of run(), or of a caller's settle for all the buckets it started.
//
// Buffers grow to the largest bucket seen and are reused: a steady loop allocates nothing here.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "bellows/concepts.hpp"
#include "bellows/core/checked.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/gather_buffer.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/slotted_calls.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/plan/float_array.hpp"

namespace bellows {

/// The floats a part of `bytes` takes in a bucket's buffers: its floats, padded to a multiple of
/// part_alignment bytes, so that the next part starts aligned.
[[nodiscard]] constexpr std::size_t part_floats(std::size_t bytes) noexcept {
  constexpr std::size_t align = part_alignment / sizeof(float);
  return ((bytes + sizeof(float) - 1) / sizeof(float) + align - 1) / align * align;
}

/// Buckets of consecutive layers, grouped from the last layer back while their gradients' bytes
/// (4 per element) fit `budget`, as DDP groups its parameters: a layer larger than the budget is
/// a bucket alone, and a budget of 0 puts every layer alone. Returned as the first layer of each
/// bucket from 0 up, then the layer count (none for no layers).
[[nodiscard]] inline std::vector<std::uint32_t> plan_buckets(std::span<const layer_info> layers, std::size_t budget) {
  std::vector<std::uint32_t> bounds(1, static_cast<std::uint32_t>(layers.size()));
  std::size_t bytes = 0;
  for (std::size_t id = layers.size(); id-- > 0;) {
    const std::size_t b = detail::saturating_mul(layers[id].size(), sizeof(float));
    if (id + 1 < bounds.back() && (budget == 0 || b > budget - std::min(bytes, budget))) {
      bounds.push_back(static_cast<std::uint32_t>(id + 1));
      bytes = 0;
    }
    bytes += b;  // no overflow: b fits beside bytes, or bytes was 0
  }
  if (bounds.back() != 0) bounds.push_back(0);
  std::ranges::reverse(bounds);
  return bounds;
}

/// One layer of a bucket: the compressor of its level, its state, and its gradient (the
/// backend's memory), replaced by the average.
template <class C>
struct bucket_layer {
  C* compressor = nullptr;
  typename C::state* state = nullptr;
  std::span<float> grad;
};

template <class Exec>
class bucket_exchange {
public:
  explicit bucket_exchange(Exec& exec) : exec_(&exec) {}

  /// One step of every layer of `bucket` (a collective call; every rank passes the same layers
  /// in the same order): results[i] is what reduce would return for bucket[i]. One allreduce_sum
  /// and one allgather at most per round; then one synchronize() of the executor for the whole
  /// bucket. A malformed gathered payload raises bellows::wire_error naming its layer; then no
  /// layer of the bucket is concluded (their states are as before the step), and the gradients
  /// of the layers finished hold their averages (on the device every other layer's; see verify).
  template <PhasedCompressor C, CollectiveFor<Exec> Coll>
  void run(std::span<const bucket_layer<C>> bucket, std::span<reduce_result> results, Coll& coll) {
    if (!start(bucket, results, coll)) return;
    exec_->synchronize();  // the bucket's one wait
    verify(bucket);
    conclude(bucket, results);
  }

  /// run() up to its wait, for a caller that exchanges several buckets and waits once for all of
  /// them: a bucket of two or more layers runs its phases up to finish, and returns true (then
  /// after the executor's synchronize(), verify() and conclude() give the results); a bucket of one layer
  /// runs its reduce, writes results[0] and returns false. The next bucket may start at once.
  template <PhasedCompressor C, CollectiveFor<Exec> Coll>
  bool start(std::span<const bucket_layer<C>> bucket, std::span<reduce_result> results, Coll& coll) {
    BELLOWS_EXPECTS(results.size() == bucket.size(), "bucket_exchange: ", results.size(), " results for ",
                    bucket.size(), " layers");
    if (bucket.empty()) return false;
    if (bucket.size() == 1) {
      results[0] = bucket[0].compressor->reduce(*bucket[0].state, bucket[0].grad, coll);
      return false;
    }
    const std::size_t rank = coll.rank(), ranks = coll.size();
    const std::size_t rounds = lay_out(bucket, ranks), n = bucket.size();
    if constexpr (!AlltoallCollective<Coll>)
      for (std::size_t r = 0; r < rounds; ++r)
        BELLOWS_EXPECTS(scattered_[r] == 0, "bucket_exchange: a layer's step needs an alltoall, which the collective "
                                            "has not (AlltoallCollective, concepts.hpp)");
    // Each sweep over the layers runs the other way from the one before: the layers a sweep
    // touched last, still in cache, are the next one's first.
    const auto layer = [n](std::size_t sweep, std::size_t i) { return sweep % 2 == 0 ? i : n - 1 - i; };
    for (std::size_t l = 0; l < n; ++l)
      bucket[l].compressor->begin(*bucket[l].state, bucket[l].grad, parts(l, 0), rank, ranks);
    exchange(0, coll);
    for (std::size_t r = 1; r < rounds; ++r) {
      for (std::size_t i = 0; i < n; ++i)
        if (const std::size_t l = layer(r, i); r < places_[l].rounds)
          bucket[l].compressor->next(*bucket[l].state, bucket[l].grad, r, parts(l, r));
      exchange(r, coll);
    }
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t l = layer(rounds, i);
      bucket[l].compressor->finish(*bucket[l].state, bucket[l].grad, parts(l, rounds), rank, ranks);
    }
    return true;
  }

  /// After start() returned true for `bucket` and the executor's synchronize(): each layer's
  /// verify, which raises the wire_error of a malformed payload the device found (the CPU's
  /// finish raised it already). A caller that waited once for several buckets verifies them all
  /// before it concludes any.
  template <PhasedCompressor C>
  void verify(std::span<const bucket_layer<C>> bucket) {
    if constexpr (requires(const C& c, const typename C::state& st) { c.verify(st); })
      for (const bucket_layer<C>& l : bucket) l.compressor->verify(*l.state);
  }

  /// After verify: each layer's conclude (its status and traffic; the commit of a finite step).
  template <PhasedCompressor C>
  void conclude(std::span<const bucket_layer<C>> bucket, std::span<reduce_result> results) {
    for (std::size_t l = 0; l < bucket.size(); ++l) results[l] = bucket[l].compressor->conclude(*bucket[l].state);
  }

private:
  static constexpr std::size_t max_rounds = exchange_rounds::capacity;

  /// Where one layer's part of one round lies: in the summed buffer, the block or the scattered
  /// blocks, at `at` floats.
  struct place {
    collective_op op = collective_op::allreduce_sum;
    std::size_t at = 0, floats = 0;
  };
  struct layer_places {
    std::size_t rounds = 0;
    place of[max_rounds];
  };

  /// Places every layer's parts and grows the buffers to fit; returns the bucket's round count.
  template <class C>
  std::size_t lay_out(std::span<const bucket_layer<C>> bucket, std::size_t ranks) {
    places_.resize(bucket.size());
    parts_.resize(bucket.size() * max_rounds);
    std::ranges::fill(summed_, 0);
    std::ranges::fill(block_, 0);
    std::ranges::fill(scattered_, 0);
    std::size_t most = 0;
    for (std::size_t l = 0; l < bucket.size(); ++l) {
      const exchange_rounds rounds = bucket[l].compressor->rounds(*bucket[l].state, ranks);
      places_[l].rounds = rounds.size();
      most = std::max(most, rounds.size());
      for (std::size_t r = 0; r < rounds.size(); ++r) {
        const collective_op op = rounds[r].op;
        std::size_t& end = op == collective_op::allgather  ? block_[r]
                           : op == collective_op::alltoall ? scattered_[r]
                                                           : summed_[r];
        places_[l].of[r] = {op, end, (rounds[r].bytes + sizeof(float) - 1) / sizeof(float)};
        end += part_floats(rounds[r].bytes);
      }
    }
    for (std::size_t r = 0; r < most; ++r) {
      grow(sums_[r], summed_[r]);
      grow(sends_[r], block_[r]);
      grow(scatters_[r], scattered_[r] * ranks);
    }
    return most;
  }

  void grow(float_array_for<Exec>& a, std::size_t floats) {
    if (a.size() < floats) a = float_array_for<Exec>(*exec_, floats);  // allocates while buckets grow
  }

  /// Layer l's parts when the first `exchanged` rounds were exchanged: before its exchange a
  /// gathered part is this rank's place in the block, and a scattered part its place in the
  /// block for rank 0, the next rank's a block later; after it, rank 0's copy, or what rank 0
  /// sent, the next rank's a block later.
  round_parts parts(std::size_t l, std::size_t exchanged) {
    const layer_places& p = places_[l];
    round_part* out = parts_.data() + l * max_rounds;
    for (std::size_t r = 0; r < p.rounds; ++r) {
      const place& w = p.of[r];
      const bool done = r < exchanged;
      if (w.op == collective_op::allreduce_sum)
        out[r] = {sums_[r].span().subspan(w.at, w.floats), 0};
      else if (w.op == collective_op::alltoall)
        out[r] = {(done ? scattered(r) : scatters_[r].span()).subspan(w.at, w.floats), scattered_[r]};
      else if (!done)
        out[r] = {sends_[r].span().subspan(w.at, w.floats), 0};
      else
        out[r] = {gathered(r).subspan(w.at, w.floats), block_[r]};
    }
    return {out, p.rounds};
  }

  /// Every rank's block of round r, in rank order (after exchange(r)).
  std::span<float> gathered(std::size_t r) {
    if (slotted_) return copies_[r].span();
    auto* first = reinterpret_cast<float*>(received_[r].block(0).data());
    return {first, block_[r] * received_[r].blocks()};
  }

  /// What every rank sent this one in round r's alltoall, in rank order (after exchange(r)).
  std::span<float> scattered(std::size_t r) {
    return {reinterpret_cast<float*>(spread_at_[r].data()), spread_at_[r].size() / sizeof(float)};
  }

  /// Round r's calls: one allreduce_sum of its summed parts, one alltoall of its scattered
  /// blocks, one allgather of its block.
  template <class Coll>
  void exchange(std::size_t r, Coll& coll) {
    if (summed_[r] != 0) coll.allreduce_sum(sums_[r].span().first(summed_[r]));
    if constexpr (AlltoallCollective<Coll>)
      if (scattered_[r] != 0)
        spread_at_[r] = spread_[r].alltoall(coll, std::as_bytes(scatters_[r].span().first(scattered_[r] * coll.size())),
                                            scattered_[r] * sizeof(float));
    if (block_[r] == 0) return;
    const std::span<const std::byte> mine = std::as_bytes(sends_[r].span().first(block_[r]));
    constexpr bool slots = requires(Coll & c, std::span<std::byte> out, std::size_t slot) {
      c.allgather_slots(std::span<const std::byte>(), out, slot);
    };
    slotted_ = slots;
    if constexpr (slots) {
      grow(copies_[r], block_[r] * coll.size());  // allocates while buckets grow
      coll.allgather_slots(mine, std::as_writable_bytes(copies_[r].span()).first(mine.size() * coll.size()),
                           mine.size());
    } else {
      coll.allgather(mine, received_[r]);
    }
  }

  Exec* exec_;
  std::vector<layer_places> places_;
  std::vector<round_part> parts_;
  std::size_t summed_[max_rounds]{}, block_[max_rounds]{};  // floats per round, padded parts included
  std::size_t scattered_[max_rounds]{};                     // floats per rank's block of an alltoall
  float_array_for<Exec> sums_[max_rounds], sends_[max_rounds];
  float_array_for<Exec> scatters_[max_rounds];  // this rank's alltoall blocks, W of scattered_ floats
  slotted_calls spread_[max_rounds];            // the alltoalls
  std::span<std::byte> spread_at_[max_rounds];  // what every rank sent this one, in rank order
  float_array_for<Exec> copies_[max_rounds];    // every rank's block, by allgather_slots
  gather_buffer received_[max_rounds];          // every rank's block, by allgather
  bool slotted_ = false;                        // whether the last exchange used allgather_slots
};

}  // namespace bellows
