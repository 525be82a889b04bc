// SPDX-License-Identifier: Apache-2.0
// What top-k and rand-k share: the rule for k (docs/spec.md#k-from-a-ratio), their payload (ascending indices, then
// values) and its complete validation, the per-layer state of a step whose error-memory update
// waits until every rank's input proved finite, and the functions around it.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "bellows/compressors/detail/gather_average.hpp"
#include "bellows/compressors/detail/step_checks.hpp"
#include "bellows/compressors/detail/step_record.hpp"
#include "bellows/concepts.hpp"
#include "bellows/core/checked.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/gather_buffer.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/sparse.hpp"
#include "bellows/feedback/error_feedback.hpp"

namespace bellows::detail {

/// k for a layer (docs/spec.md#k-from-a-ratio): `count` when it is > 0 (at most n), else
/// clamp(ceil(ratio * n), 1, n); 0 for a layer with no elements. The product is computed in
/// double and reduced by a relative 2^-50 before the ceiling, so that a ratio written in decimal
/// gives the k of that decimal (0.07 of 100 elements is 7, though the double nearest 0.07
/// exceeds it). `ratio` and `count` are as check_kept_params accepts them (the compressors
/// check their parameters at construction).
[[nodiscard]] inline std::size_t kept_count(const layer_info& layer, double ratio, std::int64_t count) noexcept {
  const std::size_t n = layer.size();
  if (n == 0) return 0;
  if (count > 0) return std::min(n, static_cast<std::size_t>(count));
  const double product = ratio * static_cast<double>(n);
  const double k = std::ceil(product - product * 0x1p-50);
  return std::clamp(static_cast<std::size_t>(k), std::size_t{1}, n);
}

/// Sparse payloads carry 64-bit indices for layers of 2^32 elements or more.
[[nodiscard]] constexpr bool wide_indices(std::uint64_t n) noexcept { return (n >> 32) != 0; }

/// Top-k's dense switch (docs/spec.md#top-k), on every backend: one allreduce of the n sums
/// replaces the allgather when the allgather would move at least as many bytes,
/// W * most * (index + value bytes) >= 4 n, with `most` the entries a payload may hold.
/// Saturating: a product past std::size_t exceeds 4 n as well.
[[nodiscard]] inline bool dense_is_cheaper(std::size_t n, std::size_t ranks, std::size_t most) noexcept {
  const std::size_t entry = (wide_indices(n) ? 8 : 4) + sizeof(float);
  return saturating_mul(saturating_mul(ranks, most), entry) >= saturating_mul(4, n);
}

/// Bytes of a sparse payload of `count` entries for a layer of n elements; bellows::error when
/// that does not fit std::size_t.
[[nodiscard]] constexpr std::size_t sparse_payload_bytes(std::uint64_t n, std::size_t count) {
  const std::size_t indices =
      wide_indices(n) ? wire::array_end<std::uint64_t>(0, count) : wire::array_end<std::uint32_t>(0, count);
  return wire::payload_bytes(wire::array_end<float>(indices, count));
}

/// Top-k's rounds on every backend: one allgather of a payload of `counts` = {least, most}
/// entries (exact when they are equal), or, where dense_switch finds it cheaper, one allreduce
/// of n + 1 floats.
[[nodiscard]] inline exchange_rounds topk_rounds(const layer_info& layer, std::pair<std::size_t, std::size_t> counts,
                                                 bool dense_switch, std::size_t ranks) {
  const std::size_t n = layer.size();
  if (dense_switch && dense_is_cheaper(n, ranks, counts.second))
    return {{collective_op::allreduce_sum, (n + 1) * sizeof(float)}};
  return {{collective_op::allgather, sparse_payload_bytes(n, counts.second), counts.first == counts.second}};
}

/// Rand-k's rounds on every backend: with indices `shared` by every rank, one allreduce of the k
/// values and the verdict; else one allgather of a payload of k entries.
[[nodiscard]] inline exchange_rounds randk_rounds(const layer_info& layer, std::size_t k, bool shared) {
  if (shared) return {{collective_op::allreduce_sum, (k + 1) * sizeof(float)}};
  return {{collective_op::allgather, sparse_payload_bytes(layer.size(), k)}};
}

/// Writes a sparse payload into `out`. `select(begin)` runs the selection; once it knows the
/// count it calls begin(count), which writes the header and returns Arrays<Index>{index, value}
/// over the payload's arrays for it to fill. `select` returns false for non-finite input
/// (whether or not it called begin), and the payload is then flagged non-finite with no entries.
template <template <class> class Arrays, class Select>
[[nodiscard]] std::span<std::byte> write_sparse(std::span<std::byte> out, wire::codec codec, std::uint64_t n,
                                                Select&& select) {
  wire::header h{};
  h.codec = codec.id;
  h.n = n;
  if (wide_indices(n)) h.flags |= wire::flag::index64;
  std::optional<wire::writer> w;
  auto begin = [&]<class Index>(std::size_t count, Index*) {
    h.count = count;
    w.emplace(out, h);
    const std::span<Index> index = w->template array<Index>(count);
    return Arrays<Index>{index, w->template array<float>(count)};
  };
  bool finite = true;
  if (wide_indices(n))
    finite = select([&](std::size_t count) { return begin(count, static_cast<std::uint64_t*>(nullptr)); });
  else
    finite = select([&](std::size_t count) { return begin(count, static_cast<std::uint32_t*>(nullptr)); });
  if (!finite) {
    h.count = 0;
    h.flags |= wire::flag::non_finite;
    w.emplace(out, h);
  }
  return w->finish();
}

/// A validated sparse payload: its status and, when ok, its entries.
struct sparse_entries {
  step_status status = step_status::ok;
  std::span<const std::uint32_t> index32;  ///< used when the layer has fewer than 2^32 elements
  std::span<const std::uint64_t> index64;  ///< used otherwise
  std::span<const float> value;
};

/// Reads a sparse payload of `codec` for `layer` and validates all of it before anything is
/// used: the header (layer size, index width, param 0), the count (in [min_count, max_count];
/// 0 for a payload flagged non-finite), the arrays against the body, indices strictly ascending
/// and below n, values finite. Raises bellows::wire_error naming the layer and the field.
[[nodiscard]] inline sparse_entries read_sparse(std::span<const std::byte> payload, wire::codec codec,
                                                const layer_info& layer, std::uint64_t min_count,
                                                std::uint64_t max_count) {
  wire::reader r(payload, codec);
  const wire::header& h = r.head();
  const char* name = codec.name;
  const std::uint64_t n = layer.size();
  const bool wide = (h.flags & wire::flag::index64) != 0;
  if (h.n != n || h.param != 0 || wide != wide_indices(n))
    fail<wire_error>(name, ": payload for ", h.n, " elements (param ", h.param, ", ", wide ? 64 : 32,
                     "-bit indices) where layer '", layer.name, "' has ", n);
  if (h.flags & wire::flag::non_finite) {
    if (h.count != 0)
      fail<wire_error>(name, ": payload flagged non-finite carries ", h.count, " entries for layer '", layer.name, "'");
    r.finish();
    return {step_status::non_finite, {}, {}, {}};
  }
  if (h.count < min_count || h.count > max_count) {
    if (min_count == max_count)
      fail<wire_error>(name, ": payload of ", h.count, " entries where layer '", layer.name, "' expects ", min_count);
    fail<wire_error>(name, ": payload of ", h.count, " entries where layer '", layer.name, "' expects ", min_count,
                     " to ", max_count);
  }
  sparse_entries e;
  auto check = [&](auto index) {
    std::uint64_t next = 0;  // the smallest index allowed at this position
    for (std::size_t j = 0; j < index.size(); ++j) {
      if (index[j] < next || index[j] >= n)
        fail<wire_error>(name, ": entry ", j, " of layer '", layer.name, "' has index ", index[j],
                         " (indices must ascend strictly and stay below ", n, ")");
      next = std::uint64_t{index[j]} + 1;
    }
  };
  if (wide) {
    e.index64 = r.array<std::uint64_t>(h.count);
    e.value = r.array<float>(h.count);
    r.finish();
    check(e.index64);
  } else {
    e.index32 = r.array<std::uint32_t>(h.count);
    e.value = r.array<float>(h.count);
    r.finish();
    check(e.index32);
  }
  for (std::size_t j = 0; j < e.value.size(); ++j)
    if (!std::isfinite(e.value[j]))
      fail<wire_error>(name, ": entry ", j, " of layer '", layer.name, "' has the non-finite value ", e.value[j],
                       " in a payload not flagged non-finite");
  return e;
}

/// The header of a payload written here or validated before.
[[nodiscard]] inline wire::header header_of(std::span<const std::byte> payload) noexcept {
  wire::header h;
  std::memcpy(static_cast<void*>(&h), payload.data(), sizeof h);
  return h;
}

/// The per-layer state top-k and rand-k share. `memory` is e; a step writes its successor into
/// `staged_` and its payload into `payload_`, and commit makes them current once every rank's
/// input proved finite.
struct sparse_state {
  layer_info layer;
  std::uint64_t step = 0;
  error_memory memory;  ///< the error memory e (no values when feedback is none)

protected:
  template <class, class>
  friend class sparse_codec;

  error_memory staged_;
  std::vector<std::uint64_t> payload_;
  std::size_t payload_bytes_ = 0;
  bool pending_ = false;  ///< a step was staged with finite input and not yet committed
  gather_buffer gathered_;
  std::vector<cpu::sparse_view<std::uint32_t>> narrow_;  ///< every rank's validated entries
  std::vector<cpu::sparse_view<std::uint64_t>> wide_;    ///< the same, for 64-bit indices
  std::vector<std::size_t> cursors_;                     ///< scatter_average's workspace
};

/// S is the state type of compressor C.
template <class S, class C>
concept state_of = std::same_as<S, typename C::state>;

/// What top-k and rand-k share beyond their selection: make_state, the staged step,
/// PayloadCodec, checkpoints and averaging by allgather. Derived (a friend) provides `codec` (its wire::codec), `name`,
/// counts(layer) -> {least, most} entries of its payloads, fit(state&) (validates the
/// parameters for the layer, sizes the workspace) and write(state&, g, e, staged, out, rank),
/// which writes one payload (selecting from g + e, and staging the next memory, when e is not
/// empty). The member templates take Derived::state only.
template <class Derived, class Exec>
class sparse_codec {
public:
  explicit sparse_codec(Exec& exec) : exec_(&exec) {}

  /// A state for the layer, its memory and workspace sized; returns a Derived::state.
  [[nodiscard]] auto make_state(const layer_info& layer) const {
    typename Derived::state st;
    st.layer = layer;
    derived().fit(st);
    return st;
  }

  /// The first half of a step, for a trainer that exchanges payloads itself: selects from
  /// m = grad + e, writes the next error memory aside, and returns this rank's payload (held by
  /// the state until the next stage). Changes neither the memory nor the step counter. Once
  /// every rank's payload validated without non_finite, call commit.
  // (clang-format-14 would join the requires clause to the declaration)
  // clang-format off
  template <class State>
    requires state_of<State, Derived>
  std::span<const std::byte> stage(State& st, std::span<const float> grad, std::size_t rank = 0) const {
    // clang-format on
    derived().fit(st);
    check_buffer(Derived::name, st.layer, grad.size());
    const bool feedback = st.memory.enabled();
    st.payload_.resize((max_payload_bytes(st) + 7) / 8);
    const std::span<const std::byte> payload = derived().write(
        st, grad, feedback ? std::span<const float>(st.memory.values()) : std::span<const float>{},
        feedback ? st.staged_.values() : std::span<float>{}, std::as_writable_bytes(std::span(st.payload_)), rank);
    st.payload_bytes_ = payload.size();
    st.pending_ = (header_of(payload).flags & wire::flag::non_finite) == 0;
    return payload;
  }

  /// The second half: the staged memory becomes current and the step counter advances.
  template <class State>
    requires state_of<State, Derived>
  void commit(State& st) const {
    BELLOWS_EXPECTS(st.pending_, Derived::name, ": layer '", st.layer.name,
                    "' has no staged step with finite input to commit");
    if (st.memory.enabled()) std::swap(st.memory, st.staged_);
    ++st.step;
    st.pending_ = false;
  }

  // PayloadCodec: the selection from `in` as it is (no error memory), keyed by state.step.

  template <class State>
    requires state_of<State, Derived>
  [[nodiscard]] std::size_t max_payload_bytes(const State& st) const {
    return sparse_payload_bytes(st.layer.size(), derived().counts(st.layer).second);
  }

  template <class State>
    requires state_of<State, Derived>
  [[nodiscard]] std::span<std::byte> encode(State& st, std::span<const float> in, std::span<std::byte> out,
                                            std::size_t rank = 0) const {
    derived().fit(st);
    check_buffer(Derived::name, st.layer, in.size());
    return derived().write(st, in, {}, {}, out, rank);
  }

  template <class State>
    requires state_of<State, Derived>
  [[nodiscard]] step_status validate(const State& st, std::span<const std::byte> payload) const {
    return read(st, payload).status;
  }

  template <class State>
    requires state_of<State, Derived>
  [[nodiscard]] step_status decode_add(const State& st, std::span<const std::byte> payload,
                                       std::span<float> acc) const {
    check_buffer(Derived::name, st.layer, acc.size());
    const sparse_entries e = read(st, payload);
    if (e.status == step_status::ok) {
      if (wide_indices(st.layer.size()))
        scatter_add(*exec_, acc, e.index64, e.value);
      else
        scatter_add(*exec_, acc, e.index32, e.value);
    }
    return e.status;
  }

  /// When the trainer's learning rate changes from lr_old to lr_new: a feedback::scaled memory
  /// is multiplied by lr_old / lr_new, so that it stands for the same parameter update; other
  /// memories are left alone.
  template <class State>
    requires state_of<State, Derived>
  void rescale(State& st, float lr_old, float lr_new) const {
    st.memory.rescale(*exec_, lr_old, lr_new, Derived::name);
  }

  /// Checkpoint of a layer's state: its step counter and error memory.
  template <class State>
    requires state_of<State, Derived>
  void save(const State& st, checkpoint_writer& out) const { save_step_record(*exec_, st.step, st.memory, out); }
  template <class State>
    requires state_of<State, Derived>
  void load(State& st, checkpoint_reader& in) const {
    load_step_record(*exec_, st.step, st.memory, in, Derived::name, Derived::name);
    st.pending_ = false;
  }

protected:
  /// Sizes the memories for `kind` on a fresh state; on a used one, checks that the kind is the
  /// one it was made with (a state keeps its memory across compressors of other ratios).
  void fit_memory(sparse_state& st, feedback kind) const {
    const std::size_t n = st.layer.size();
    if (st.memory.kind() == kind && st.memory.values().size() == (kind == feedback::none ? 0 : n)) return;
    BELLOWS_EXPECTS(st.step == 0 && st.memory.kind() == feedback::none && st.memory.values().empty(), Derived::name,
                    ": layer '", st.layer.name, "' has a state made with feedback ", to_string(st.memory.kind()),
                    ", used by a compressor with feedback ", to_string(kind));
    st.memory = error_memory(*exec_, kind, n);
    st.staged_ = error_memory(*exec_, kind, n);
  }

  /// The memory e and the buffer its successor goes to; both empty without feedback.
  [[nodiscard]] static std::pair<std::span<const float>, std::span<float>> compensation(sparse_state& st) noexcept {
    if (!st.memory.enabled()) return {};
    return {st.memory.values(), st.staged_.values()};
  }

  /// Records a step staged without a payload (its values went to an allreduce buffer).
  static void staged_without_payload(sparse_state& st, bool finite) noexcept {
    st.payload_bytes_ = 0;
    st.pending_ = finite;
  }

  /// Averages the payload `mine` of a staged step over the ranks by allgather.
  template <class State, Collective Coll>
  reduce_result average_by_allgather(State& st, std::span<const std::byte> mine, std::span<float> inout,
                                     Coll& coll) const {
    const auto average = [&]<class Index>(std::vector<cpu::sparse_view<Index>>& parts,
                                          std::span<const Index> sparse_entries::*index) {
      return gather_average(
          mine, inout, coll, st.gathered_, parts,
          [&](std::span<const std::byte> block, cpu::sparse_view<Index>& part) {
            const sparse_entries e = read(st, block);
            part = {e.*index, e.value};
            return e.status;
          },
          [&](std::span<const cpu::sparse_view<Index>> all, std::span<float> out) {
            st.cursors_.resize(cpu::scatter_average_cursors(all.size(), out.size()));
            scatter_average(*exec_, out, all, std::span(st.cursors_));
          });
    };
    reduce_result r;
    r.status = wide_indices(st.layer.size()) ? average(st.wide_, &sparse_entries::index64)
                                             : average(st.narrow_, &sparse_entries::index32);
    const std::uint64_t kept = header_of(mine).count;
    r.sent = {mine.size(), kept, kept};
    return r;
  }

  /// Ends a step: commits it if it went through everywhere, else forgets it.
  template <class State>
  reduce_result conclude(State& st, reduce_result r) const {
    if (r.status == step_status::ok)
      commit(st);
    else
      st.pending_ = false;
    return r;
  }

  Exec* exec_;

private:
  [[nodiscard]] const Derived& derived() const noexcept { return static_cast<const Derived&>(*this); }

  [[nodiscard]] sparse_entries read(const sparse_state& st, std::span<const std::byte> payload) const {
    const auto [least, most] = derived().counts(st.layer);
    return read_sparse(payload, Derived::codec, st.layer, least, most);
  }
};

}  // namespace bellows::detail
