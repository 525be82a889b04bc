// SPDX-License-Identifier: Apache-2.0
// The step of the codecs whose payload is one float32 scale per bucket and then packed bytes
// (QSGD's codes, EF-signSGD's sign bits), written once over the executor: the CPU keeps a state
// in host memory and exchanges through any Collective, the device in device memory through a
// DeviceCollective on the executor's stream, with the same payload bytes, outputs and memories.
//
// One step:
//   m = g + e (with a memory) -> the codec's encoding kernel writes the scales and packed bytes
//   into this rank's payload storage, setting a flag word for input that is not finite ->
//   finish_payload writes the header (flagged) and the padding -> the next memory e' = m - this
//   rank's decoded payload, staged in place of m, which lives in the staged buffer (stage_memory:
//   the CPU writes it here, while m is in cache; the device in its averaging pass below, which
//   reads m first) -> one allgather -> every rank's payload validated
//   (check_payloads: on the CPU in turn, a malformed payload raising the validation's
//   wire_error; on the device one kernel whose verdicts gate the average there and are copied
//   back without a wait) -> when all are good and finite: average_payloads writes the average
//   into g (and on the device e') -> after the wait for the stream, conclude reads the status (on
//   the device a malformed payload raises the CPU validation's wire_error there), and when it is
//   ok the staged memory becomes current and the counter advances. A flagged or malformed
//   payload leaves g, e and the counter as they were.
//
// Run as phases (concepts.hpp, PhasedCompressor), begin encodes into the caller's part, the
// caller gathers, finish validates and averages the caller's copies (the slots' view), and
// verify and conclude read the verdicts after the caller's wait.
//
// The scatter exchange (params().exchange, docs/spec.md#scatter-exchange), on the CPU: the layer
// cut into W chunks (plan/chunks.hpp), each encoded into its own payload for its owner (one
// alltoall), every owner averaging the W payloads of its chunk as the gather step averages a
// layer, adding its own memory, re-encoding the sum once (one allgather of the owners' payloads),
// and every rank's output the concatenation of the owners' decoded chunks. The worker's memory is
// m - its decoded chunk payloads, the owner's u - its decoded payload; both become current only
// when the step concludes ok. An owner that received a malformed chunk payload still makes its
// allgather, flagged wire::flag::relayed_malformed, so that every rank raises the same wire_error.
//
// Derived (qsgd<Exec>, signsgd<Exec>) brings its name, its format (compressors/detail/*_format.hpp:
// layout, shape, header checks) and, as private members its base may call:
//   workspace_floats(layout): the floats of scratch its encoder needs;
//   encode_arrays(st, in, layout, scales, codes, workspace, non_finite, rank): its encoding kernel;
//   decode_arrays(scales, codes, layout, out, accumulate): one payload's decoded values added to
//   out (accumulate) or written into it.
// The backends supply the rest (plan/payload_slots.hpp, cpu/payload_slots.hpp,
// cuda/scaled_payload.cuh, and average_payloads beside each codec's kernels).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "bellows/compressors/detail/scatter_state.hpp"
#include "bellows/compressors/detail/step_checks.hpp"
#include "bellows/compressors/detail/step_record.hpp"
#include "bellows/concepts.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/feedback/error_feedback.hpp"
#include "bellows/plan/chunks.hpp"
#include "bellows/plan/exchange.hpp"
#include "bellows/plan/float_array.hpp"
#include "bellows/plan/payload_slots.hpp"

namespace bellows::detail {

template <class Derived, class Exec, class Format, class Parts>
class scaled_codes {
  static_assert(Executor<Exec>, "scaled_codes<Exec>: Exec must model Executor");
  using array = float_array_for<Exec>;
  using slots_type = payload_slots_for<Exec, Parts>;

public:
  using params_type = std::remove_cvref_t<decltype(std::declval<const Format&>().params())>;

  /// One layer: step counter, error memory and workspace, all but the counter in the backend's
  /// memory. The payload slots are sized by the first step (they depend on the ranks), as are the
  /// scatter exchange's chunks and owner memory (its base).
  struct state : scatter_state<Exec> {
    layer_info layer;
    std::uint64_t step = 0;
    layer_memory<Exec> memory;  ///< e, zero at first (no values without a memory)
    layer_memory<Exec> staged;  ///< m = g + e, then e' of the step under way, current once it concludes ok
    mutable array workspace;    ///< the encoder's scratch (EF-signSGD's chunk sums of long buckets)
    slots_type slots;           ///< this step's payloads (reduce's), and the words of their checks
  };

  [[nodiscard]] const params_type& params() const noexcept { return format_.params(); }
  /// One allgather of this rank's payload, of one size for every rank and step; under scatter an
  /// alltoall of W chunk payloads, then an allgather of this rank's owner payload, each in slots
  /// of the largest chunk payload's bytes.
  [[nodiscard]] exchange_rounds rounds(const state& st, std::size_t ranks) const {
    if (scattered()) {
      const std::size_t slot = format_.shape(plan(st.layer, ranks).largest()).bytes;
      return {{collective_op::alltoall, slot}, {collective_op::allgather, slot}};
    }
    return {{collective_op::allgather, format_.shape(st.layer.size()).bytes}};
  }

  /// Validates the layer and sizes its state; reserves what a PayloadCodec call on one payload
  /// needs of the executor (the device's flag and verdict words).
  [[nodiscard]] state make_state(const layer_info& layer) const {
    Format::check_layer(layer);
    slots_type::words::reserve(*exec_);
    const std::size_t n = layer.size();
    state st;
    st.layer = layer;
    st.exchange = params().exchange;
    st.memory = layer_memory<Exec>(*exec_, params().feedback, n);
    st.staged = layer_memory<Exec>(*exec_, params().feedback, n);
    st.workspace = array(*exec_, derived().workspace_floats(format_.layout(n)));
    return st;
  }

  /// One step (a collective call; see the file's comment): the phases' pieces on the state's
  /// own payload slots. On the device the collective enqueues on the executor's stream; the step
  /// waits for it once, for the verdicts, after the average and the memory's update.
  template <CollectiveFor<Exec> Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    check_stream(Derived::name, st.layer, coll, *exec_);
    if constexpr (runs_on_host<Exec>)
      if (scattered()) return reduce_scattered(Derived::name, derived_mut(), st, *exec_, inout, coll);
    const std::size_t rank = coll.rank();
    const scaled_payload shape = begin_step(st, inout.size());
    st.slots.prepare(*exec_, coll.size(), shape.bytes);
    const std::span<const float> m = compensate(st, inout);
    encode_into(st, m, st.slots.mine(rank), shape, st.slots.non_finite(), rank);
    stage(st, st.slots.mine(rank));
    st.slots.gather(coll, rank);
    average_gathered(st, inout, m, rank);
    exec_->synchronize();  // the verdicts
    return conclude(st);
  }

  // Phases (concepts.hpp, PhasedCompressor): one allgather round, part 0 this rank's payload.

  /// m = grad + e (with a memory), this rank's payload of m written into part 0, and (on the
  /// CPU) the next memory staged.
  void begin(state& st, std::span<const float> grad, round_parts parts, std::size_t rank, std::size_t ranks) {
    const scaled_payload shape = begin_step(st, grad.size());
    check_parts(Derived::name, st.layer, rounds(st, ranks), parts);
    st.slots.prepare(*exec_, ranks, 0);  // the words only: the payloads are the caller's
    if constexpr (runs_on_host<Exec>)
      if (scattered()) {
        st.prepare(*exec_, Derived::name, st.layer, plan(st.layer, ranks), rank, params().owner_memory,
                   params().feedback);
        return encode_chunks(st, compensate(st, grad), parts[0]);
      }
    const std::span<const float> m = compensate(st, grad);
    const std::span<std::byte> mine = std::as_writable_bytes(parts[0].values);
    encode_into(st, m, mine, shape, st.slots.non_finite(), rank);
    stage(st, mine);
  }
  /// One round only; under scatter, round 1: the owner's, which reads the payloads of its chunk
  /// (parts[0], as the alltoall left them) and writes its own (parts[1]).
  void next(state& st, std::span<const float> /*grad*/, std::size_t round, round_parts parts) {
    if constexpr (runs_on_host<Exec>)
      if (scattered() && round == 1) return reencode_chunk(st, parts[0], parts[1]);
    fail<error>(Derived::name, ": layer '", st.layer.name, "' has no round ", round);
  }
  /// Every rank's payload validated (on the CPU a malformed one raises the validation's
  /// wire_error; the device's verdicts are read in verify and conclude), and when all are good
  /// and finite, grad = their average (and on the device e' = m - this rank's decoded payload).
  void finish(state& st, std::span<float> grad, round_parts parts, std::size_t rank, std::size_t ranks) {
    if constexpr (runs_on_host<Exec>)
      if (scattered()) return concatenate_chunks(st, grad, parts[1]);
    const std::size_t bytes = format_.shape(st.layer.size()).bytes, stride = parts[0].stride * sizeof(float);
    check_gathered(Derived::name, st.layer, stride, bytes, ranks);
    st.slots.view(reinterpret_cast<std::byte*>(parts[0].values.data()), stride, ranks, bytes);
    average_gathered(st, grad, st.memory.enabled() ? std::span<const float>(st.staged.values()) : grad, rank);
  }
  /// After the executor's synchronize(): raises the CPU validation's wire_error when the device
  /// found a gathered payload malformed (before any layer of a bucket is concluded).
  void verify(const state& st) const { (void)status(st); }
  /// After the executor's synchronize(): the status and traffic; when every rank's payload was
  /// good and finite, the staged memory becomes current and the counter advances.
  reduce_result conclude(state& st) {
    const step_status s = status(st);
    if (s == step_status::ok) {
      std::swap(st.memory, st.staged);
      st.commit();
      ++st.step;
    }
    return {s, scattered() ? scatter_sent(st) : format_.sent(st.layer.size())};
  }

  // PayloadCodec, on the backend's memory (device memory for the device; enqueued there).

  /// The bytes of every payload of the layer.
  [[nodiscard]] std::size_t max_payload_bytes(const state& st) const { return format_.shape(st.layer.size()).bytes; }

  /// This rank's payload for `in` as it is (m = g + e when the caller keeps a memory), with the
  /// step's randomness where the codec draws any, written into `out` (max_payload_bytes from a
  /// multiple of 8). The step counter is not advanced. Raises bellows::error when `in` or `out`
  /// does not fit, or when the state's workspace is too small for this compressor.
  [[nodiscard]] std::span<std::byte> encode(const state& st, std::span<const float> in, std::span<std::byte> out,
                                            std::size_t rank = 0) const {
    check_buffer(Derived::name, st.layer, in.size());
    const scaled_payload shape = format_.shape(st.layer.size());
    wire::check_storage(Derived::name, st.layer.name, out, shape.bytes);
    const std::size_t need = derived().workspace_floats(format_.layout(st.layer.size()));
    BELLOWS_EXPECTS(st.workspace.size() >= need, Derived::name, ": layer '", st.layer.name, "': the state holds ",
                    st.workspace.size(), " floats of workspace, this compressor needs ", need,
                    " (make the state with it)");
    typename slots_type::words words(*exec_);
    encode_into(st, in, out.first(shape.bytes), shape, words.non_finite, rank);
    return out.first(shape.bytes);
  }

  /// The status of one payload: non_finite for a flagged one; raises bellows::wire_error for a
  /// malformed one. The device waits for its stream to return it.
  [[nodiscard]] step_status validate(const state& st, std::span<const std::byte> payload) const {
    return validate_payload(*exec_, Derived::name, st.layer, payload, format_.shape(st.layer.size()),
                            [&](std::span<const std::byte> host) { return host_status(st, host); });
  }

  /// Validates as validate does, and when the payload is good and finite adds its decoded values
  /// to `acc` (n floats). `acc` is untouched on error or non_finite.
  [[nodiscard]] step_status decode_add(const state& st, std::span<const std::byte> payload,
                                       std::span<float> acc) const {
    check_buffer(Derived::name, st.layer, acc.size());
    const step_status s = validate(st, payload);
    if (s != step_status::ok) return s;
    decode_into(payload, acc, true);
    return s;
  }

  /// When the trainer's learning rate changes from lr_old to lr_new: a feedback::scaled memory
  /// is multiplied by lr_old / lr_new, so that it stands for the same parameter update; other
  /// memories are left alone.
  void rescale(state& st, float lr_old, float lr_new) const {
    st.memory.rescale(*exec_, lr_old, lr_new, Derived::name);
    st.owner.rescale(*exec_, lr_old, lr_new, Derived::name);
  }

  /// Appends the step counter and the error memory (empty without one): the same record on
  /// every backend; under scatter then the ranks and the rank of the last step (0 and 0 before
  /// one) and the owner memory (empty without one). Waits for the executor.
  void save(const state& st, checkpoint_writer& out) const {
    save_step_record(*exec_, st.step, st.memory, out);
    if (scattered()) st.save(*exec_, out);
  }
  /// Reads what save wrote for the same layer and configuration; checks before it changes
  /// anything. A state loaded under scatter keeps the saved ranks and rank: a step at others
  /// raises bellows::error (scatter_state::prepare).
  void load(state& st, checkpoint_reader& in) const {
    const std::string name(Derived::name);
    const step_record rec = read_step_record(in, st.memory.values().size(), name + " step", name + " error memory");
    scatter_record scatter;
    if (scattered())
      scatter = scatter_state<Exec>::read(
          Derived::name, st.layer, in, [&](std::size_t ranks) { return plan(st.layer, ranks); }, params().owner_memory);
    st.memory.assign(*exec_, rec.memory);
    st.step = rec.step;
    st.restore(*exec_, scatter, params().owner_memory, params().feedback);
  }

protected:
  /// Raises bellows::error for the scatter exchange on a backend that enqueues on a stream (the
  /// device has no scatter step yet).
  scaled_codes(const params_type& params, Exec& exec) : format_(params), exec_(&exec) {
    if constexpr (!runs_on_host<Exec>)
      BELLOWS_EXPECTS(!scattered(), Derived::name, ": the scatter exchange runs on the CPU backend only, for now");
  }

  Format format_;
  Exec* exec_;

private:
  [[nodiscard]] const Derived& derived() const noexcept { return static_cast<const Derived&>(*this); }
  [[nodiscard]] Derived& derived_mut() noexcept { return static_cast<Derived&>(*this); }

  /// Before a step: the buffer and the memory kind fit, the workspace too (reallocated only for
  /// another compressor's need). Returns the layer's payload shape.
  scaled_payload begin_step(state& st, std::size_t size) const {
    check_buffer(Derived::name, st.layer, size);
    st.memory.check_kind(Derived::name, st.layer.name, params().feedback);
    st.check_exchange(Derived::name, st.layer, params().exchange);
    if (const std::size_t need = derived().workspace_floats(format_.layout(st.layer.size()));
        st.workspace.size() < need) {
      exec_->synchronize();  // work enqueued before may still use the buffer replaced
      st.workspace = array(*exec_, need);
    }
    return format_.shape(st.layer.size());
  }

  /// m = grad + e into the staged buffer, or grad itself without a memory.
  std::span<const float> compensate(state& st, std::span<const float> grad) const {
    if (!st.memory.enabled()) return grad;
    add(*exec_, st.staged.values(), grad, std::as_const(st.memory).values());
    return st.staged.values();
  }

  /// e' = m - this rank's decoded `payload`, in place of m in the staged buffer, where the
  /// backend writes it now (the CPU's stage_memory; the device's averaging pass writes it instead).
  void stage(state& st, std::span<const std::byte> payload) const {
    if (st.memory.enabled())
      stage_memory(*exec_, payload, format_.layout(st.layer.size()), format_.shape(st.layer.size()),
                   st.staged.values());
  }

  /// Every gathered payload validated (check_payloads), then, when all are good and finite,
  /// out = their average (average_payloads; the device enqueues it, gated by its verdicts, with
  /// e' = m - this rank's decoded payload into the staged memory).
  void average_gathered(state& st, std::span<float> out, std::span<const float> m, std::size_t rank) {
    const std::size_t n = st.layer.size();
    const scaled_payload shape = format_.shape(n);
    check_payloads(*exec_, st.slots, Derived::name, st.layer, shape,
                   [&](std::span<const std::byte> payload) { return host_status(st, payload); });
    if (st.slots.may_average())
      average_payloads(*exec_, st.slots, format_.layout(n), shape, rank, out, m, st.staged.values());
  }

  /// What the checks of the last step found (after the executor's synchronize()).
  [[nodiscard]] step_status status(const state& st) const {
    return st.slots.status(*exec_, Derived::name, st.layer,
                           [&](std::span<const std::byte> payload) { return host_status(st, payload); });
  }

  /// The codec's arrays of `in` (a layer or a chunk of it) into `out` (a payload of `shape`), then
  /// its header and padding; `rank` is the Philox rank word of its noise.
  void encode_into(const state& st, std::span<const float> in, std::span<std::byte> out, const scaled_payload& shape,
                   unsigned* non_finite, std::size_t rank) const {
    const auto layout = format_.layout(in.size());
    derived().encode_arrays(st, in, layout,
                            {reinterpret_cast<float*>(out.data() + wire::header_bytes), layout.buckets()},
                            {reinterpret_cast<std::uint8_t*>(out.data() + shape.codes_at), shape.code_bytes},
                            st.workspace.span(), non_finite, rank);
    finish_payload(*exec_, out, shape, non_finite);
  }

  [[nodiscard]] bool scattered() const noexcept { return params().exchange == exchange::scatter; }
  [[nodiscard]] chunk_plan plan(const layer_info& layer, std::size_t ranks) const {
    return {Derived::name, layer.size(), ranks, format_.block(), layer.id};
  }

  /// Each chunk of m encoded for its owner into `out` (the alltoall's part), with the noise of
  /// (chunk, rank), and the next memory staged chunk by chunk.
  void encode_chunks(state& st, std::span<const float> m, const round_part& out) const {
    const chunk_plan& p = st.chunks;
    check_gathered(Derived::name, st.layer, out.stride * sizeof(float), format_.shape(p.largest()).bytes, p.ranks());
    for (std::size_t c = 0; c < p.ranks(); ++c) {
      const std::size_t at = p.begin(c), n = p.size(c);
      const scaled_payload shape = format_.shape(n);
      const std::span<std::byte> payload = chunk_slot(out, p.owner(c), shape.bytes);
      typename slots_type::words words(*exec_);
      encode_into(st, m.subspan(at, n), payload, shape, words.non_finite, chunk_plan::worker_stream(c, st.rank));
      if (st.memory.enabled())
        stage_memory(*exec_, payload, format_.layout(n), shape, st.staged.values().subspan(at, n));
    }
  }

  /// The owner's round: the W payloads of its chunk validated; when all are good and finite,
  /// u = their average (the gather step's arithmetic) + E_c, encoded with the owner's noise into
  /// `out`, and E_c' = u - its decoded payload staged. A flagged payload makes the owner's
  /// flagged, a malformed one flagged relayed_malformed; neither raises here, so that every rank
  /// still meets the allgather.
  void reencode_chunk(state& st, const round_part& received, const round_part& out) {
    const chunk_plan& p = st.chunks;
    const std::size_t c = p.owned_by(st.rank), n = p.size(c);
    const scaled_payload shape = format_.shape(n);
    check_gathered(Derived::name, st.layer, received.stride * sizeof(float), shape.bytes, p.ranks());
    bool flagged = false, malformed = false;
    for (std::size_t i = 0; i < p.ranks(); ++i) {
      try {
        flagged |= payload_status(st, n, chunk_slot(received, i, shape.bytes)) == step_status::non_finite;
      } catch (const wire_error&) {
        malformed = true;
      }
    }
    const std::span<float> u = st.owner_staged.values();
    typename slots_type::words words(*exec_);
    if (flagged || malformed) {
      fill(*exec_, u, 0.0f);
      *words.non_finite = 1;
    } else {
      st.slots.view(reinterpret_cast<const std::byte*>(received.values.data()), received.stride * sizeof(float),
                    p.ranks(), shape.bytes);
      average_payloads(*exec_, st.slots, format_.layout(n), shape, st.rank, u, {}, {});
      if (st.owner.enabled()) add(*exec_, u, u, std::as_const(st.owner).values());
    }
    const std::span<std::byte> payload = chunk_slot(out, 0, shape.bytes);
    encode_into(st, u, payload, shape, words.non_finite, chunk_plan::owner_stream(c));
    if (malformed) payload[offsetof(wire::header, flags)] |= std::byte{wire::flag::relayed_malformed};
    if (st.owner.enabled()) stage_memory(*exec_, payload, format_.layout(n), shape, u);
  }

  /// Every owner's payload validated, in rank order (a malformed one raises the validation's
  /// wire_error, naming its rank: the same on every rank); when all are good and finite, `grad`
  /// = their decoded chunks, one after the other, each written in one pass.
  void concatenate_chunks(state& st, std::span<float> grad, const round_part& gathered) {
    const chunk_plan& p = st.chunks;
    check_gathered(Derived::name, st.layer, gathered.stride * sizeof(float), format_.shape(p.largest()).bytes,
                   p.ranks());
    bool flagged = false;
    for (std::size_t r = 0; r < p.ranks(); ++r) {
      const std::size_t n = p.size(p.owned_by(r));
      try {
        flagged |= payload_status(st, n, chunk_slot(gathered, r, format_.shape(n).bytes)) == step_status::non_finite;
      } catch (const wire_error& e) {
        fail<wire_error>(Derived::name, ": layer '", st.layer.name, "': the chunk payload of rank ", r, ": ", e.what());
      }
    }
    st.slots.set_status(flagged ? step_status::non_finite : step_status::ok);
    if (flagged) return;
    for (std::size_t r = 0; r < p.ranks(); ++r) {
      const std::size_t c = p.owned_by(r), n = p.size(c);
      decode_into(chunk_slot(gathered, r, format_.shape(n).bytes), grad.subspan(p.begin(c), n), false);
    }
  }

  /// A validated payload of out.size() elements (the layer, or a chunk), decoded into `out`:
  /// added to it (accumulate) or written.
  void decode_into(std::span<const std::byte> payload, std::span<float> out, bool accumulate) const {
    const auto layout = format_.layout(out.size());
    const scaled_payload shape = format_.shape(out.size());
    derived().decode_arrays({reinterpret_cast<const float*>(payload.data() + wire::header_bytes), layout.buckets()},
                            {reinterpret_cast<const std::uint8_t*>(payload.data() + shape.codes_at), shape.code_bytes},
                            layout, out, accumulate);
  }

  /// What a scatter step hands to its calls: W payload slots to the alltoall, one to the
  /// allgather; as values and elements, the layer's (as gather reports them).
  [[nodiscard]] traffic scatter_sent(const state& st) const {
    const std::size_t slot = format_.shape(st.chunks.largest()).bytes;
    traffic t = format_.sent(st.layer.size());
    t.bytes = (st.chunks.ranks() + 1) * slot;
    return t;
  }

  /// The CPU's validation of a payload of n elements of the layer (all of it, or a chunk) in host
  /// memory: its status, or a wire_error.
  [[nodiscard]] step_status payload_status(const state& st, std::size_t n, std::span<const std::byte> payload) const {
    const wire::reader r = format_.check(st.layer.name, n, payload);
    return (r.head().flags & wire::flag::non_finite) ? step_status::non_finite : step_status::ok;
  }
  [[nodiscard]] step_status host_status(const state& st, std::span<const std::byte> payload) const {
    return payload_status(st, st.layer.size(), payload);
  }
};

}  // namespace bellows::detail
