// SPDX-License-Identifier: Apache-2.0
// The scatter exchange's part of a layer's state (docs/spec.md#scatter-exchange), written once for
// every codec that offers it (compressors/detail/scaled_codes.hpp, sparse_codec.hpp): the chunks
// at the last step's W, this rank, the owner memory of the chunk it owns and its successor staged
// by the step under way, reduce's buffers, the checkpoint record, and reduce's step over the
// codec's phases (an alltoall of chunk payloads, the owner's round, an allgather of the owners'
// payloads). The codecs bring what differs: how a chunk is encoded, how its owner combines the W
// payloads it receives, and how the owners' payloads become the output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bellows/concepts.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/slotted_calls.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/feedback/error_feedback.hpp"
#include "bellows/plan/chunks.hpp"
#include "bellows/plan/exchange.hpp"
#include "bellows/plan/float_array.hpp"

namespace bellows::detail {

/// Whether Exec runs its kernels in the caller's thread, in host memory (the CPU), rather than
/// enqueueing them on a stream (the device, which has no scatter step yet).
template <class Exec>
inline constexpr bool runs_on_host = !requires(const Exec& e) {
  e.stream();
};

/// Payload slot j of a round's part (this rank's payload for rank j, or what rank j sent), of
/// `bytes`.
[[nodiscard]] inline std::span<std::byte> chunk_slot(const round_part& part, std::size_t j, std::size_t bytes) {
  return {reinterpret_cast<std::byte*>(part.values.data() + j * part.stride), bytes};
}

/// What a checkpoint holds of the scatter exchange, read and checked before anything changes.
struct scatter_record {
  chunk_plan chunks;  ///< none when the state had made no scatter step
  std::size_t rank = 0;
  std::vector<float> owner;
};

template <class Exec>
struct scatter_state {
  bellows::exchange exchange = bellows::exchange::gather;  ///< the exchange the state was made for
  chunk_plan chunks;                                       ///< the layer's chunks at the last step's W
  std::size_t rank = 0;                                    ///< this rank at that step
  layer_memory<Exec> owner;                                ///< E_c of the chunk this rank owns (with owner_memory)
  layer_memory<Exec> owner_staged;                         ///< u_c, then E_c' of the step under way
  float_array_for<Exec> sends, own;  ///< reduce's payloads for the alltoall, and its owner payload
  slotted_calls calls;               ///< reduce's alltoall, then its allgather

  /// Raises bellows::error unless the state serves a compressor of `wanted` (a layer's levels
  /// share one exchange).
  void check_exchange(const char* who, const layer_info& layer, bellows::exchange wanted) const {
    BELLOWS_EXPECTS(exchange == wanted, who, ": layer '", layer.name, "' has a state made for the ",
                    to_string(exchange), " exchange, used by a compressor with ", to_string(wanted),
                    " (a layer's levels share one exchange)");
  }

  /// Before a step as `r` of plan.ranks(): the chunks, and the owner's buffers for this rank's
  /// chunk, allocated at the first step and afresh (zero) when a level of other chunks or another
  /// owner_memory changes them. Raises bellows::error when the owner memory is of another world
  /// size or rank (a checkpoint's, or an earlier step's).
  void prepare(Exec& exec, const char* who, const layer_info& layer, const chunk_plan& plan, std::size_t r,
               bool owner_memory, feedback kind) {
    BELLOWS_EXPECTS(chunks.ranks() == 0 || (chunks.ranks() == plan.ranks() && rank == r), who, ": layer '", layer.name,
                    "': its owner memory is of rank ", rank, " of ", chunks.ranks(), " ranks, this step is rank ", r,
                    " of ", plan.ranks(),
                    " (a checkpoint of another world size starts afresh: docs/spec.md#scatter-exchange)");
    if (plan == chunks && owner.enabled() == owner_memory) return;
    chunks = plan;
    rank = r;
    allocate(exec, owner_memory, kind);
  }

  /// After a step whose every input was finite: the staged owner memory becomes current.
  void commit() noexcept {
    if (owner.enabled()) std::swap(owner, owner_staged);
  }

  /// The ranks and rank of the last step (0 and 0 before one) and the owner memory (empty
  /// without one). Waits for the executor.
  void save(Exec& exec, checkpoint_writer& out) const {
    out.put(std::uint64_t{chunks.ranks()});
    out.put(std::uint64_t{rank});
    std::vector<float> staging;
    out.put_array(owner.host(exec, staging));
  }
  /// Reads what save wrote, checking it: `plan_of(ranks)` gives the layer's chunks at a world
  /// size. Raises bellows::wire_error for a rank that cannot be.
  template <class PlanOf>
  [[nodiscard]] static scatter_record read(const char* who, const layer_info& layer, checkpoint_reader& in,
                                           PlanOf plan_of, bool owner_memory) {
    const std::string name(who);
    const auto ranks = in.get<std::uint64_t>(name + " ranks");
    const auto r = in.get<std::uint64_t>(name + " rank");
    scatter_record rec;
    if (ranks != 0) {
      if (r >= ranks || ranks > chunk_plan::max_ranks)
        fail<wire_error>(who, ": checkpoint of layer '", layer.name, "' saved by rank ", r, " of ", ranks);
      rec.chunks = plan_of(static_cast<std::size_t>(ranks));
      rec.rank = static_cast<std::size_t>(r);
      rec.owner.resize(owner_memory ? rec.chunks.size(rec.chunks.owned_by(rec.rank)) : 0);
    }
    in.get_finite_array(std::span<float>(rec.owner), name + " owner memory");
    return rec;
  }
  /// Takes a record that read() returned; the state keeps its ranks and rank, so that a step at
  /// others raises bellows::error (prepare).
  void restore(Exec& exec, const scatter_record& rec, bool owner_memory, feedback kind) {
    if (rec.chunks.ranks() == 0) return;
    chunks = rec.chunks;
    rank = rec.rank;
    allocate(exec, owner_memory, kind);
    owner.assign(exec, rec.owner);
  }

private:
  /// The owner's buffers for the chunk of `rank` at `chunks`, zero: a memory of the worker's kind
  /// (scaled stays scaled) with owner_memory, and the staging buffer u_c in any case.
  void allocate(Exec& exec, bool owner_memory, feedback kind) {
    const std::size_t n = chunks.size(chunks.owned_by(rank));
    owner = layer_memory<Exec>(exec,
                               !owner_memory              ? feedback::none
                               : kind == feedback::scaled ? feedback::scaled
                                                          : feedback::residual,
                               n);
    owner_staged = layer_memory<Exec>(exec, feedback::residual, n);
  }
};

/// reduce's scatter step, on the buffers of the state (a scatter_state<Exec>): the codec's
/// phases (begin; the alltoall of W chunk payloads, slots of rounds[0].bytes; next, the owner's
/// round; the allgather of the owners' payloads; finish; conclude). Raises bellows::error, before
/// any state changes, when `coll` has no alltoall.
template <class Codec, class State, class Exec, class Coll>
reduce_result reduce_scattered(const char* who, Codec& codec, State& st, Exec& exec, std::span<float> inout,
                               Coll& coll) {
  if constexpr (!AlltoallCollective<Coll>) {
    fail<error>(who, ": layer '", st.layer.name,
                "': the scatter exchange needs a collective with alltoall (AlltoallCollective, concepts.hpp)");
  } else {
    scatter_state<Exec>& sc = st;
    const std::size_t rank = coll.rank(), ranks = coll.size();
    const std::size_t floats = codec.rounds(st, ranks)[0].bytes / sizeof(float);
    if (sc.sends.size() < ranks * floats) sc.sends = float_array_for<Exec>(exec, ranks * floats);  // the first step's
    if (sc.own.size() < floats) sc.own = float_array_for<Exec>(exec, floats);
    round_part parts[2] = {{sc.sends.span().first(floats), floats}, {sc.own.span().first(floats), 0}};
    codec.begin(st, inout, parts, rank, ranks);
    const auto first = [floats](std::span<std::byte> slots) {
      return std::span<float>(reinterpret_cast<float*>(slots.data()), floats);
    };
    parts[0] = {
        first(sc.calls.alltoall(coll, std::as_bytes(sc.sends.span().first(ranks * floats)), floats * sizeof(float))),
        floats};
    codec.next(st, inout, 1, parts);
    parts[1] = {first(sc.calls.allgather(coll, std::as_bytes(parts[1].values))), floats};
    codec.finish(st, inout, parts, rank, ranks);
    return codec.conclude(st);
  }
}

}  // namespace bellows::detail
