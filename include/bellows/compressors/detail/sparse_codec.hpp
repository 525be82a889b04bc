// SPDX-License-Identifier: Apache-2.0
// What top-k and rand-k share, written once over the executor: the rule for k
// (docs/spec.md#k-from-a-ratio), their rounds, the complete validation of their payload
// (plan/sparse.hpp: ascending indices, then values), and the step around their selection. The
// CPU keeps a state in host memory and exchanges through any Collective, the device in device
// memory through a DeviceCollective on the executor's stream, with the same payload bytes,
// outputs and memories.
//
// One step averaged by allgather:
//   the codec's selection from m = g + e writes this rank's entries into its payload slot, its
//   count and a non-finite word, and the next memory aside (cpu/sparse_payload.hpp,
//   cuda/sparse_payload.cuh) -> finish_payload writes the header (flagged and empty for input
//   that is not finite) -> one allgather (the CPU sends each payload at its length, the device
//   whole slots) -> every rank's payload validated (check_payloads: on the CPU in turn, a
//   malformed payload raising the validation's wire_error; on the device one kernel whose
//   verdicts and counts gate the average there and are copied back without a wait) -> when all
//   are good and finite: g = the average of the scattered entries (average_payloads: zeros, each
//   rank's entries added in rank order, the sums divided by W) -> after the wait for the stream,
//   conclude reads the status (on the device a malformed payload raises the CPU validation's
//   wire_error there) and the staged memory becomes current. A flagged payload leaves g, e and
//   the counter as they were.
// Run as phases (concepts.hpp, PhasedCompressor), the selection goes into the caller's part, the
// caller gathers, and the caller's copies are validated and averaged (the slots' view). Top-k's
// dense switch and rand-k's shared indices average by one allreduce instead (topk.hpp,
// randk.hpp), on the same state.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string_view>
#include <utility>

#include "bellows/compressors/detail/scatter_state.hpp"
#include "bellows/compressors/detail/step_checks.hpp"
#include "bellows/compressors/detail/step_record.hpp"
#include "bellows/concepts.hpp"
#include "bellows/core/checked.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/feedback/error_feedback.hpp"
#include "bellows/plan/feedback.hpp"
#include "bellows/plan/float_array.hpp"
#include "bellows/plan/index_list.hpp"
#include "bellows/plan/payload_slots.hpp"
#include "bellows/plan/sparse.hpp"

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

/// Top-k's dense switch (docs/spec.md#top-k), on every backend: one allreduce of the n sums
/// replaces the allgather when the allgather would move at least as many bytes,
/// W * most * (index + value bytes) >= 4 n, with `most` the entries a payload may hold.
/// Saturating: a product past std::size_t exceeds 4 n as well.
[[nodiscard]] inline bool dense_is_cheaper(std::size_t n, std::size_t ranks, std::size_t most) noexcept {
  const std::size_t entry = entry_bytes(n);
  return saturating_mul(saturating_mul(ranks, most), entry) >= saturating_mul(4, n);
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
                                                std::string_view layer, std::uint64_t n, std::uint64_t min_count,
                                                std::uint64_t max_count) {
  wire::reader r(payload, codec);
  const wire::header& h = r.head();
  const char* name = codec.name;
  const bool wide = (h.flags & wire::flag::index64) != 0;
  if (h.n != n || h.param != 0 || wide != wide_indices(n))
    fail<wire_error>(name, ": payload for ", h.n, " elements (param ", h.param, ", ", wide ? 64 : 32,
                     "-bit indices) where layer '", layer, "' has ", n);
  if (h.flags & wire::flag::non_finite) {
    if (h.count != 0)
      fail<wire_error>(name, ": payload flagged non-finite carries ", h.count, " entries for layer '", layer, "'");
    r.finish();
    return {step_status::non_finite, {}, {}, {}};
  }
  if (h.count < min_count || h.count > max_count) {
    if (min_count == max_count)
      fail<wire_error>(name, ": payload of ", h.count, " entries where layer '", layer, "' expects ", min_count);
    fail<wire_error>(name, ": payload of ", h.count, " entries where layer '", layer, "' expects ", min_count, " to ",
                     max_count);
  }
  sparse_entries e;
  auto check = [&](auto index) {
    std::uint64_t next = 0;  // the smallest index allowed at this position
    for (std::size_t j = 0; j < index.size(); ++j) {
      if (index[j] < next || index[j] >= n)
        fail<wire_error>(name, ": entry ", j, " of layer '", layer, "' has index ", index[j],
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
      fail<wire_error>(name, ": entry ", j, " of layer '", layer, "' has the non-finite value ", e.value[j],
                       " in a payload not flagged non-finite");
  return e;
}
/// The same for a payload of a whole layer.
[[nodiscard]] inline sparse_entries read_sparse(std::span<const std::byte> payload, wire::codec codec,
                                                const layer_info& layer, std::uint64_t min_count,
                                                std::uint64_t max_count) {
  return read_sparse(payload, codec, layer.name, layer.size(), min_count, max_count);
}

/// ceil(a b / c) for a and b at most c > 0: the entries a chunk of b of a layer's c elements
/// keeps when the layer keeps a (docs/spec.md#scatter-exchange).
[[nodiscard]] inline std::size_t share_of(std::size_t a, std::size_t b, std::size_t c) noexcept {
  if (a == 0 || b == 0) return 0;
  if (a <= std::numeric_limits<std::size_t>::max() / b) return (a * b - 1) / c + 1;
  return static_cast<std::size_t>(
      std::ceil(static_cast<long double>(a) * static_cast<long double>(b) / static_cast<long double>(c)));
}

/// What top-k and rand-k share beyond their selection, written once over the executor: the
/// parameters, the layer's state, make_state, the step averaged by allgather, stage and commit,
/// PayloadCodec, rescale and checkpoints. Method is the compressor's descriptor (topk_method,
/// randk_method: its codec and parameters), Plan the selection's plan (select_plan, sample_plan)
/// and Workspace the backend's workspace for it. Derived (a friend of the state) provides
/// counts(layer) -> {least, most} entries of its payloads, plan_for(layer) -> Plan (validating
/// its parameters for the layer), and select(st, g, e, staged, body, rank) -> sparse_words,
/// which enqueues the selection (from g + e, writing the residual into `staged`, when `e` is not
/// empty) into a payload's body.
template <class Derived, class Exec, class Method, class Plan, class Workspace>
class sparse_codec {
  static_assert(Executor<Exec>, "sparse_codec<Exec>: Exec must model Executor");
  using slots_type = payload_slots_for<Exec, sparse_payload>;

public:
  /// A layer's state: its step counter and error memory (public), and the plan, workspace and
  /// buffers of its steps, in the backend's memory. A state may serve compressors of other
  /// ratios or modes too (the two levels of an Accordion schedule): it keeps its memory, and its
  /// plan and workspace follow the compressor at the next step (allocating only then).
  class state : public scatter_state<Exec> {
  public:
    layer_info layer;
    std::uint64_t step = 0;
    layer_memory<Exec> memory;  ///< the error memory e (no values when feedback is none)

    /// The elements kept per step (in top-k's approximate mode, the least).
    [[nodiscard]] std::size_t k() const noexcept { return plan_.k; }

  private:
    friend sparse_codec;
    friend Derived;
    /// What a step averaged by allreduce reads back: the summed verdict, this rank's own
    /// verdict and its count; for top-k's leader, the summed verdict, the device's verdict on
    /// the list and the leader's count.
    struct reported {
      float sum = 0.0f;
      unsigned own = 0;
      sparse_count_for<Exec> count = 0;
    };
    Plan plan_{};
    Workspace work_{};
    layer_memory<Exec> staged_;                        ///< the next e, current once every rank's input proved finite
    slots_type slots_;                                 ///< this step's payloads (or the device's scratch)
    float_array_for<Exec> dense_;                      ///< top-k's dense average: n sums, then the verdict
    host_values_for<Exec, reported> reported_;         ///< copied back by the phases of an allreduce step
    std::span<const float> list_;                      ///< top-k's leader: the summed index list (the caller's part)
    index_list_words<sparse_count_for<Exec>> listed_;  ///< top-k's leader: what the list's check reported
    Plan part_plan_{};                                 ///< the scatter exchange's: the last chunk's selection
    Workspace part_work_{};                            ///< and its workspace
    float_array_for<Exec> part_sum_;                   ///< the owner's average of its chunk
    bool by_allgather_ = false;                        ///< the step under way is averaged by allgather
    bool pending_ = false;                             ///< a step was staged with finite input and not yet committed
  };

  using params_type = typename Method::params;
  static constexpr wire::codec codec = Method::codec;
  static constexpr const char* name = Method::codec.name;

  /// Raises bellows::error naming a parameter out of range (params_type::validate), and for the
  /// scatter exchange on a backend that enqueues on a stream (the device has no scatter step yet).
  explicit sparse_codec(const params_type& params, Exec& exec) : params_(params), exec_(&exec) {
    params_.validate();
    if constexpr (!runs_on_host<Exec>)
      BELLOWS_EXPECTS(!scatters(), name, ": the scatter exchange runs on the CPU backend only, for now");
  }

  [[nodiscard]] const params_type& params() const noexcept { return params_; }

  /// A state for the layer, its memory and workspace sized (on the device, the executor's
  /// workspace reserved: raises bellows::error for a layer the device does not take).
  [[nodiscard]] state make_state(const layer_info& layer) const {
    slots_type::words::reserve(*exec_);
    state st;
    st.layer = layer;
    st.exchange = exchange_kind();
    st.plan_ = derived().plan_for(layer);
    fit_workspace(*exec_, st.work_, st.plan_);  // a plan equal to the default one too
    fit(st);
    st.reported_ = host_values_for<Exec, typename state::reported>(*exec_, 1);
    return st;
  }

  /// The first half of a step, for a trainer that exchanges payloads itself: selects from
  /// m = grad + e, writes the next error memory aside, and returns this rank's payload (held by
  /// the state until its next stage or step). Changes neither the memory nor the step counter. Once
  /// every rank's payload validated without non_finite, call commit. The device waits for its
  /// stream once, for the payload's length.
  std::span<const std::byte> stage(state& st, std::span<const float> grad, std::size_t rank = 0) const {
    fit(st);
    check_buffer(name, st.layer, grad.size());
    st.slots_.prepare(*exec_, 1, max_payload_bytes(st));
    const std::span<std::byte> payload = st.slots_.mine(0);
    write(st, grad, true, payload, rank);
    const wire::header h = header_back(payload);
    st.pending_ = (h.flags & wire::flag::non_finite) == 0;
    return payload.first(wire::header_bytes + h.body_bytes);
  }

  /// A phase (concepts.hpp, PhasedCompressor), after the executor's synchronize(): raises the
  /// CPU validation's wire_error when the device found a gathered payload malformed, before any
  /// layer of a bucket is concluded.
  void verify(const state& st) const {
    if (st.by_allgather_) (void)gathered(st);
  }

  /// The second half: the staged memory becomes current and the step counter advances.
  void commit(state& st) const {
    BELLOWS_EXPECTS(st.pending_, name, ": layer '", st.layer.name, "' has no staged step with finite input to commit");
    std::swap(st.memory, st.staged_);
    ++st.step;
    st.pending_ = false;
  }

  // PayloadCodec, on the backend's memory: the selection from `in` as it is (no error memory),
  // keyed by state.step. The device waits for its stream once per call.

  [[nodiscard]] std::size_t max_payload_bytes(const state& st) const {
    return sparse_payload_bytes(st.layer.size(), derived().counts(st.layer).second);
  }

  /// This rank's payload for `in`, written into `out` (max_payload_bytes from a multiple of 8).
  /// Raises bellows::error when `in` or `out` does not fit.
  [[nodiscard]] std::span<std::byte> encode(state& st, std::span<const float> in, std::span<std::byte> out,
                                            std::size_t rank = 0) const {
    fit(st);
    check_buffer(name, st.layer, in.size());
    wire::check_storage(name, st.layer.name, out, max_payload_bytes(st));
    write(st, in, false, out, rank);
    return out.first(wire::header_bytes + header_back(out).body_bytes);
  }

  /// The status of one payload: non_finite for a flagged one; raises bellows::wire_error for a
  /// malformed one.
  [[nodiscard]] step_status validate(const state& st, std::span<const std::byte> payload) const {
    return validate_payload(*exec_, name, st.layer, payload, shape_of(st.layer),
                            [&](std::span<const std::byte> host) { return read(st, host).status; });
  }

  /// Validates as validate does, and when the payload is good and finite adds its entries to
  /// `acc` (n floats). `acc` is untouched on error or non_finite.
  [[nodiscard]] step_status decode_add(const state& st, std::span<const std::byte> payload,
                                       std::span<float> acc) const {
    check_buffer(name, st.layer, acc.size());
    const step_status s = validate(st, payload);
    if (s != step_status::ok) return s;
    // a validated payload of count c has c entries in its body, padded by less than one entry
    const std::size_t body = payload.size() - wire::header_bytes;
    add_entries(acc, payload.data() + wire::header_bytes, body / entry_bytes(st.layer.size()));
    return s;
  }

  /// When the trainer's learning rate changes from lr_old to lr_new: a feedback::scaled memory
  /// is multiplied by lr_old / lr_new, so that it stands for the same parameter update; other
  /// memories are left alone.
  void rescale(state& st, float lr_old, float lr_new) const {
    st.memory.rescale(*exec_, lr_old, lr_new, name);
    st.owner.rescale(*exec_, lr_old, lr_new, name);
  }

  /// Checkpoint of a layer's state: its step counter and error memory, the same record on every
  /// backend (waits for the executor); under scatter then its record of the exchange
  /// (scatter_state::save). load checks all of it before it changes anything.
  void save(const state& st, checkpoint_writer& out) const {
    save_step_record(*exec_, st.step, st.memory, out);
    if (scatters()) st.save(*exec_, out);
  }
  void load(state& st, checkpoint_reader& in) const {
    const step_record rec = read_step_record(in, st.memory.values().size(), name, name);
    scatter_record scatter;
    if (scatters())
      scatter = scatter_state<Exec>::read(
          name, st.layer, in, [&](std::size_t ranks) { return parts_of(st.layer, ranks); }, owner_memory());
    st.memory.assign(*exec_, rec.memory);
    st.step = rec.step;
    st.restore(*exec_, scatter, owner_memory(), params_.feedback);
    st.pending_ = false;
  }

protected:
  /// Before a step: the plan, workspace and memory fit this compressor, and the buffer and the
  /// collective fit the layer.
  template <class Coll>
  void begin_step(state& st, std::size_t size, Coll& coll) const {
    fit(st);
    check_buffer(name, st.layer, size);
    check_stream(name, st.layer, coll, *exec_);
  }

  /// Before the phases of a step: the plan, workspace and memory fit this compressor, and the
  /// gradient and the parts fit the layer and the rounds over `ranks`.
  void begin_phases(state& st, std::size_t size, round_parts parts, std::size_t ranks) const {
    fit(st);
    check_buffer(name, st.layer, size);
    check_parts(name, st.layer, derived().rounds(st, ranks), parts);
  }

  /// The memory e and the buffer its successor goes to; both empty without feedback.
  [[nodiscard]] static std::pair<std::span<const float>, std::span<float>> compensation(state& st) noexcept {
    if (!st.memory.enabled()) return {};
    return {st.memory.values(), st.staged_.values()};
  }

  /// A step averaged by allgather: this rank's payload into its slot (selected from g + e, the
  /// next memory staged), one allgather, every payload validated (check_payloads) and, when all
  /// are good and finite, out = their average (average_payloads); then the wait (on the device,
  /// the step's one) and conclude.
  template <class Coll>
  reduce_result average_by_allgather(state& st, std::span<float> inout, Coll& coll) const {
    const std::size_t rank = coll.rank();
    st.by_allgather_ = true;
    st.slots_.prepare(*exec_, coll.size(), max_payload_bytes(st));
    write(st, inout, true, st.slots_.mine(rank), rank);
    st.slots_.gather(coll, rank);
    average_gathered(st, inout, rank);
    exec_->synchronize();  // the verdicts and counts
    return conclude(st, gathered(st));
  }

  // The phases of a step averaged by allgather: part 0 this rank's payload (after begin_phases).

  /// The selection from grad + e (the next memory staged) into part 0.
  void begin_gathered(state& st, std::span<const float> grad, round_parts parts, std::size_t rank,
                      std::size_t ranks) const {
    st.by_allgather_ = true;
    st.slots_.prepare(*exec_, ranks, 0);  // the words only: the payloads are the caller's
    write(st, grad, true, std::as_writable_bytes(parts[0].values), rank);
  }
  /// Every gathered payload validated, and their average into grad when all are good and finite.
  void finish_gathered(state& st, std::span<float> grad, round_parts parts, std::size_t rank, std::size_t ranks) const {
    const std::size_t bytes = max_payload_bytes(st), stride = parts[0].stride * sizeof(float);
    check_gathered(name, st.layer, stride, bytes, ranks);
    st.slots_.view(reinterpret_cast<std::byte*>(parts[0].values.data()), stride, ranks, bytes);
    average_gathered(st, grad, rank);
  }

  /// Every gathered payload validated (check_payloads: on the CPU a malformed one raises the
  /// validation's wire_error; the device's verdicts are read after the wait), and when all are
  /// good and finite, out = their average (average_payloads; the device enqueues it, gated by
  /// its verdicts).
  void average_gathered(state& st, std::span<float> out, std::size_t rank) const {
    const sparse_payload shape = shape_of(st.layer);
    check_payloads(*exec_, st.slots_, name, st.layer, shape,
                   [&](std::span<const std::byte> host) { return read(st, host).status; });
    st.slots_.keep_count(rank);  // this rank's traffic
    if (st.slots_.may_average()) average_payloads(*exec_, st.slots_, shape, out);
  }

  /// After the executor's synchronize(), of a step averaged by allgather: its status (on the
  /// device a malformed payload raises the CPU validation's wire_error here) and this rank's
  /// traffic, its count's payload.
  [[nodiscard]] reduce_result gathered(const state& st) const {
    const step_status status = st.slots_.status(*exec_, name, st.layer,
                                                [&](std::span<const std::byte> host) { return read(st, host).status; });
    const std::size_t kept = st.slots_.kept();
    return {status, {sparse_payload_bytes(st.layer.size(), kept), kept, kept}};
  }

  /// acc[index[j]] += value[j] for the `count` entries of a payload body at `body`, the values
  /// taken from `values` where it is not empty; nothing when `skip` points to a float of the
  /// backend's memory that is not 0.
  void add_entries(std::span<float> acc, const std::byte* body, std::size_t count, std::span<const float> values = {},
                   const float* skip = nullptr) const {
    const auto add = [&]<class Index>(Index) {
      const auto [index, value] = payload_entries<Index>(body, count);
      scatter_add(*exec_, acc, index, values.empty() ? value : values, skip);
    };
    if (wide_indices(acc.size()))
      add(std::uint64_t{});
    else
      add(std::uint32_t{});
  }

  // The scatter exchange (docs/spec.md#scatter-exchange), on the CPU: the layer cut into W chunks
  // of whole runs of four elements (so that every chunk of a memory starts 16 bytes in, as the
  // selection's streaming stores want); each chunk of m = g + e selected into its own payload of
  // ceil(k n_c / n) entries for its owner (the next memory staged by the selection); the owner's
  // average of the W payloads of its chunk, plus its memory E_c, selected again to as many entries
  // (E_c' = the rest, staged by that selection); every rank's output the owners' entries. Derived
  // brings select_part(st, n, k, word, g, e, staged, body): the selection (top-k) or draw
  // (per-rank rand-k) of k of a chunk's n elements with the Philox rank word `word`, into a
  // payload's body, on the workspace fit_part gives.

  /// The parameters' exchange and owner memory (gather and none for a codec without the choice).
  [[nodiscard]] bellows::exchange exchange_kind() const noexcept {
    if constexpr (requires(const params_type& p) { p.exchange; })
      return params_.exchange;
    else
      return exchange::gather;
  }
  [[nodiscard]] bool owner_memory() const noexcept {
    if constexpr (requires(const params_type& p) { p.owner_memory; })
      return params_.owner_memory;
    else
      return false;
  }
  [[nodiscard]] bool scatters() const noexcept { return exchange_kind() == exchange::scatter; }
  /// The layer's chunks over `ranks`.
  [[nodiscard]] chunk_plan parts_of(const layer_info& layer, std::size_t ranks) const {
    return {name, layer.size(), ranks, 4, layer.id};
  }
  /// The entries a chunk of `size` elements keeps: ceil(k size / n).
  [[nodiscard]] std::size_t part_count(const layer_info& layer, std::size_t size) const {
    return share_of(derived().counts(layer).first, size, layer.size());
  }
  /// The bytes of the payload of a chunk of `size` elements.
  [[nodiscard]] std::size_t part_bytes(const layer_info& layer, std::size_t size) const {
    return sparse_payload_bytes(size, part_count(layer, size));
  }
  /// An alltoall of W chunk payloads, then an allgather of the owner's, in slots of the largest
  /// chunk's payload (chunk 0's: the counts grow with the sizes).
  [[nodiscard]] exchange_rounds scatter_rounds(const layer_info& layer, std::size_t ranks) const {
    const std::size_t slot = part_bytes(layer, parts_of(layer, ranks).largest());
    return {{collective_op::alltoall, slot}, {collective_op::allgather, slot}};
  }

  /// The chunks at `ranks` and the owner's buffers (scatter_state::prepare), then each chunk of
  /// m = grad + e selected into part 0's slot of its owner, the next memory staged chunk by chunk.
  void begin_scattered(state& st, std::span<const float> grad, round_parts parts, std::size_t rank, std::size_t ranks) {
    st.by_allgather_ = false;
    st.prepare(*exec_, name, st.layer, parts_of(st.layer, ranks), rank, owner_memory(), params_.feedback);
    const chunk_plan& p = st.chunks;
    const std::size_t owned = p.size(p.owned_by(rank));
    if (st.part_sum_.size() < owned) st.part_sum_ = float_array_for<Exec>(*exec_, owned);  // the first step's
    check_gathered(name, st.layer, parts[0].stride * sizeof(float), part_bytes(st.layer, p.largest()), ranks);
    const auto [e, staged] = compensation(st);
    for (std::size_t c = 0; c < ranks; ++c) {
      const std::size_t at = p.begin(c), n = p.size(c), k = part_count(st.layer, n);
      const std::span<std::byte> payload = chunk_slot(parts[0], p.owner(c), sparse_payload_bytes(n, k));
      const auto words = derived().select_part(
          st, n, k, chunk_plan::worker_stream(c, rank), grad.subspan(at, n), e.empty() ? e : e.subspan(at, n),
          staged.empty() ? staged : staged.subspan(at, n), payload.subspan(wire::header_bytes));
      finish_payload(*exec_, payload, sparse_payload_of(codec.id, n, k, k), words);
    }
  }

  /// The owner's round: the W payloads of its chunk (`received`) validated; when all are good and
  /// finite, u = their average (the gather step's arithmetic) + E_c, selected again with the
  /// owner's stream into `out`, and E_c' = the rest of u staged. A flagged payload makes the
  /// owner's flagged, a malformed one flagged relayed_malformed; neither raises here, so that every
  /// rank still meets the allgather.
  void reselect_part(state& st, const round_part& received, const round_part& out) {
    const chunk_plan& p = st.chunks;
    const std::size_t c = p.owned_by(st.rank), n = p.size(c), k = part_count(st.layer, n);
    const std::size_t bytes = sparse_payload_bytes(n, k);
    check_gathered(name, st.layer, received.stride * sizeof(float), bytes, p.ranks());
    bool flagged = false, malformed = false;
    for (std::size_t i = 0; i < p.ranks(); ++i) {
      try {
        flagged |= read_part(st, n, chunk_slot(received, i, bytes)).status == step_status::non_finite;
      } catch (const wire_error&) {
        malformed = true;
      }
    }
    const sparse_payload shape = sparse_payload_of(codec.id, n, k, k);
    const std::span<std::byte> payload = chunk_slot(out, 0, bytes);
    if (flagged || malformed) {
      constexpr unsigned not_finite = 1;
      finish_payload(*exec_, payload, shape, sparse_words<sparse_count_for<Exec>>{&not_finite});
      if (malformed) payload[offsetof(wire::header, flags)] |= std::byte{wire::flag::relayed_malformed};
      return;
    }
    const std::span<float> u = st.part_sum_.span().first(n);
    st.slots_.view(reinterpret_cast<const std::byte*>(received.values.data()), received.stride * sizeof(float),
                   p.ranks(), bytes);
    average_payloads(*exec_, st.slots_, shape, u);
    const bool kept = st.owner.enabled();
    const auto words = derived().select_part(
        st, n, k, chunk_plan::owner_stream(c), u, kept ? std::as_const(st.owner).values() : std::span<const float>{},
        kept ? st.owner_staged.values() : std::span<float>{}, payload.subspan(wire::header_bytes));
    finish_payload(*exec_, payload, shape, words);
  }

  /// Every owner's payload validated, in rank order (a malformed one raises the validation's
  /// wire_error, naming its rank: the same on every rank); when all are good and finite, `grad`
  /// = zeros with every owner's entries in its chunk.
  void concatenate_parts(state& st, std::span<float> grad, const round_part& gathered) {
    const chunk_plan& p = st.chunks;
    check_gathered(name, st.layer, gathered.stride * sizeof(float), part_bytes(st.layer, p.largest()), p.ranks());
    bool flagged = false;
    for (std::size_t r = 0; r < p.ranks(); ++r) {
      const std::size_t n = p.size(p.owned_by(r));
      try {
        flagged |= read_part(st, n, chunk_slot(gathered, r, part_bytes(st.layer, n))).status == step_status::non_finite;
      } catch (const wire_error& e) {
        fail<wire_error>(name, ": layer '", st.layer.name, "': the chunk payload of rank ", r, ": ", e.what());
      }
    }
    st.slots_.set_status(flagged ? step_status::non_finite : step_status::ok);
    if (flagged) return;
    fill(*exec_, grad, 0.0f);
    for (std::size_t r = 0; r < p.ranks(); ++r) {
      const std::size_t c = p.owned_by(r), n = p.size(c);
      add_entries(grad.subspan(p.begin(c), n), chunk_slot(gathered, r, 0).data() + wire::header_bytes,
                  part_count(st.layer, n));
    }
  }

  /// The state's workspace for chunks, fitted to `plan` (allocating only when it grows).
  Workspace& fit_part(state& st, const Plan& plan) const {
    if (!(plan == st.part_plan_)) {
      fit_workspace(*exec_, st.part_work_, plan);
      st.part_plan_ = plan;
    }
    return st.part_work_;
  }

  /// After finish: the status, and what the step handed to its calls (W payload slots to the
  /// alltoall, one to the allgather) with the entries kept in the output.
  [[nodiscard]] reduce_result scatter_result(const state& st) const {
    const chunk_plan& p = st.chunks;
    std::size_t kept = 0;
    for (std::size_t c = 0; c < p.ranks(); ++c) kept += part_count(st.layer, p.size(c));
    const bool ok = st.slots_.may_average();
    return {ok ? step_status::ok : step_status::non_finite,
            {(p.ranks() + 1) * part_bytes(st.layer, p.largest()), ok ? kept : 0, ok ? kept : 0}};
  }

  /// Ends a step: commits it when every rank's input proved finite, else forgets it.
  reduce_result conclude(state& st, reduce_result r) const {
    st.pending_ = r.status == step_status::ok;
    if (!st.pending_) return r;
    if (scatters()) st.scatter_state<Exec>::commit();  // the owner memory staged by this step
    commit(st);
    return r;
  }

  params_type params_;
  Exec* exec_;

private:
  [[nodiscard]] const Derived& derived() const noexcept { return static_cast<const Derived&>(*this); }

  [[nodiscard]] sparse_payload shape_of(const layer_info& layer) const {
    const auto [least, most] = derived().counts(layer);
    return sparse_payload_of(codec.id, layer.size(), least, most);
  }

  [[nodiscard]] sparse_entries read(const state& st, std::span<const std::byte> payload) const {
    const auto [least, most] = derived().counts(st.layer);
    return read_sparse(payload, codec, st.layer, least, most);
  }
  /// The chunk payload of `size` elements in a slot (as long as its header says, at most the
  /// slot: a flagged one is shorter), validated, under scatter.
  [[nodiscard]] sparse_entries read_part(const state& st, std::size_t size, std::span<const std::byte> slot) const {
    const std::size_t k = part_count(st.layer, size);
    wire::header h;
    std::memcpy(static_cast<void*>(&h), slot.data(), sizeof h);
    const std::size_t room = slot.size() - wire::header_bytes;
    return read_sparse(slot.first(wire::header_bytes + (h.body_bytes < room ? h.body_bytes : room)), codec,
                       st.layer.name, size, k, k);
  }

  /// The plan and workspace of this compressor (allocating only when they change), and the
  /// memories: sized for its feedback on a fresh state; on a used one, the kind must be the one
  /// it was made with.
  void fit(state& st) const {
    if (st.exchange == exchange::scatter || scatters()) st.check_exchange(name, st.layer, exchange_kind());
    const Plan plan = derived().plan_for(st.layer);
    if (!(plan == st.plan_)) {
      fit_workspace(*exec_, st.work_, plan);
      st.plan_ = plan;
    }
    const feedback kind = params_.feedback;
    const std::size_t n = st.layer.size();
    if (st.memory.kind() == kind && st.memory.values().size() == (kind == feedback::none ? 0 : n)) return;
    BELLOWS_EXPECTS(st.step == 0 && st.memory.kind() == feedback::none && st.memory.values().empty(), name, ": layer '",
                    st.layer.name, "' has a state made with feedback ", to_string(st.memory.kind()),
                    ", used by a compressor with feedback ", to_string(kind));
    st.memory = layer_memory<Exec>(*exec_, kind, n);
    st.staged_ = layer_memory<Exec>(*exec_, kind, n);
  }

  /// Selects from `in` (+ e, staging the next memory, when `compensate` and the state has a
  /// memory) into the payload storage `out` and writes its header; enqueued.
  void write(state& st, std::span<const float> in, bool compensate, std::span<std::byte> out, std::size_t rank) const {
    const auto [e, staged] = compensate ? compensation(st) : std::pair<std::span<const float>, std::span<float>>{};
    const auto words = derived().select(st, in, e, staged, out.subspan(wire::header_bytes), rank);
    finish_payload(*exec_, out, shape_of(st.layer), words);
  }

  /// The header at the start of `payload`, read on the host (the device waits for its stream).
  [[nodiscard]] wire::header header_back(std::span<const std::byte> payload) const {
    wire::header h;
    copy_word(*exec_, h, reinterpret_cast<const wire::header*>(payload.data()));
    exec_->synchronize();
    return h;
  }
};

}  // namespace bellows::detail
