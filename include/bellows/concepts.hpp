// SPDX-License-Identifier: Apache-2.0
// The four concepts a trainer plugs together: Collective, Compressor, ErrorFeedback and
// RegimeDetector, the capabilities the Synchronizer asks for beyond them, and Executor, the
// contract a backend (cpu/, cuda/) keeps with the code written once over it. Each is a numbered
// list of requirements with a minimal model or its models named beside it; every model in
// bellows is checked against its concept with a static_assert where it is defined.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "bellows/core/gather_buffer.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/plan/float_array.hpp"
#include "bellows/plan/regime.hpp"

namespace bellows {

class checkpoint_writer;  // core/checkpoint.hpp
class checkpoint_reader;

/// Collective: the transport of one group of ranks (MPI communicator, NCCL communicator, threads).
///  1. `c.rank()` and `c.size()`: this rank's index in [0, size) and the number of ranks, both
///     convertible to std::size_t and fixed for the collective's life.
///  2. `c.allreduce_sum(std::span<float> v)`: in place, every rank's v becomes the elementwise sum
///     over ranks. Every rank passes the same length. Implementations should sum in an order that
///     gives every rank the same bits (the local collective sums in rank order).
///  3. `c.allgather(std::span<const std::byte> mine, gather_buffer& out)`: afterwards `out` holds
///     one block per rank, in rank order, block r being rank r's `mine`; blocks may differ in size.
///     Implement it by gathering the sizes first, then the bytes (MPI_Allgather + MPI_Allgatherv).
///  4. Every rank calls the same operations in the same order; a failure on one rank must make the
///     others fail too (throw), never hang.
///  5. Optionally `c.allgather_slots(std::span<const std::byte> mine, std::span<std::byte> slots,
///     slot)`, as DeviceCollective's below but in the collective's own memory: for blocks of one
///     size on every rank, in one call where allgather may take two. sync/bucket_exchange.hpp
///     uses it where it exists (collectives::mpi and bellows_torch's process-group adapter offer it).
/// Minimal model: archetypes::collective below (one rank).
template <class C>
concept Collective = requires(C& c, const C& cc, std::span<float> values, std::span<const std::byte> mine,
                              gather_buffer& out) {
  { cc.rank() } -> std::convertible_to<std::size_t>;
  { cc.size() } -> std::convertible_to<std::size_t>;
  c.allreduce_sum(values);
  c.allgather(mine, out);
};

/// AlltoallCollective: a Collective in which every rank also sends each rank a block of its own,
/// in one call (docs/collectives.md): what an exchange whose traffic per rank stays flat in W
/// needs (each rank sends each chunk's owner its part of that chunk).
///  1. `c.alltoall(std::span<const std::byte> blocks, std::span<const std::size_t> sizes,
///     gather_buffer& out)`: `sizes` holds size() block sizes and `blocks` the blocks back to
///     back, block j (sizes[j] bytes) for rank j. Afterwards `out` holds size() blocks in rank
///     order, block i being what rank i sent to this rank. Blocks may be empty and of any size,
///     different from rank to rank.
///  2. As every operation (Collective 4): every rank calls it in the same order, and a failure
///     on one rank makes the others throw. A call whose sizes do not fit its blocks raises
///     bellows::error before anything is sent (check_alltoall_blocks, core/gather_buffer.hpp).
///  3. Optionally `c.alltoall_slots(blocks, slots, slot)`: W blocks of `slot` bytes each, block j
///     for rank j; afterwards what rank i sent lies at byte i * slot of `slots`. Where it exists
///     the scatter exchange uses it (core/slotted_calls.hpp), in one call where alltoall may make
///     two (collectives::mpi and bellows_torch's process group offer it).
/// Models: collectives::local, collectives::mpi, collectives::nccl, collectives::staged and
/// collectives::counting over one of them; minimal model archetypes::alltoall_collective below.
template <class C>
concept AlltoallCollective = Collective<C> &&
    requires(C& c, std::span<const std::byte> blocks, std::span<const std::size_t> sizes, gather_buffer& out) {
  c.alltoall(blocks, sizes, out);
};

namespace archetypes {
/// The least a Collective provides, for checking other concepts against (one rank, no traffic).
struct collective {
  [[nodiscard]] std::size_t rank() const noexcept { return 0; }
  [[nodiscard]] std::size_t size() const noexcept { return 1; }
  void allreduce_sum(std::span<float>) noexcept {}
  void allgather(std::span<const std::byte> mine, gather_buffer& out) {
    const std::size_t n = mine.size();
    out.resize({&n, 1});
    std::ranges::copy(mine, out.block(0).begin());
  }
};
static_assert(Collective<collective>, "the archetype must model Collective");

/// The least an AlltoallCollective provides (one rank, no traffic): the one block comes back.
struct alltoall_collective : collective {
  void alltoall(std::span<const std::byte> blocks, std::span<const std::size_t> sizes, gather_buffer& out) {
    allgather(blocks.first(sizes[0]), out);
  }
};
static_assert(AlltoallCollective<alltoall_collective>, "the archetype must model AlltoallCollective");
}  // namespace archetypes

/// DeviceCollective: a Collective that also exchanges device memory in place, on a CUDA stream,
/// for compressors whose state lives on a GPU (compressors/qsgd.cuh). Models: collectives::nccl.
///  1. `c.stream()`: the stream (cudaStream_t) its exchanges are enqueued on; a compressor
///     enqueues its kernels on the same one, so nothing waits for anything else.
///  2. `c.allgather_slots(std::span<const std::byte> mine, std::span<std::byte> slots, slot)`:
///     device memory; afterwards rank r's `mine` (at most `slot` bytes) starts at byte r * slot
///     of `slots` (size() * slot bytes) on every rank. Enqueued, not waited for.
/// Minimal model: archetypes::device_collective below (one rank).
template <class C>
concept DeviceCollective = Collective<C> &&
    requires(const C& cc, C& c, std::span<const std::byte> mine, std::span<std::byte> slots, std::size_t slot) {
  cc.stream();
  c.allgather_slots(mine, slots, slot);
};

namespace archetypes {
/// The least a DeviceCollective provides (one rank, the default stream), for checking other
/// concepts against: its copy runs on the host, so it cannot move device memory.
struct device_collective : collective {
  [[nodiscard]] void* stream() const noexcept { return nullptr; }
  void allgather_slots(std::span<const std::byte> mine, std::span<std::byte> slots, std::size_t) {
    std::ranges::copy(mine, slots.begin());
  }
};
static_assert(DeviceCollective<device_collective>, "the archetype must model DeviceCollective");
}  // namespace archetypes

/// CollectiveFor<C, E>: a Collective that code written once over executor E can exchange
/// through: any Collective for an executor of host memory, a DeviceCollective for one that
/// enqueues on a stream (E has `stream()`: cuda::executor), so that the exchanges run on the
/// stream of the kernels around them.
template <class C, class E>
concept CollectiveFor = Collective<C> &&(!requires(const E& e) { e.stream(); } || DeviceCollective<C>);

/// Compressor: compresses one layer's gradient, exchanges it through a Collective, and leaves the
/// average of what every rank contributed.
///  1. `C::state`: everything the compressor keeps for one layer (step counter, workspace, and for
///     PowerSGD its query and error memory); movable. Workspace is sized here, so `reduce` does
///     not allocate once the collective's buffers have grown.
///  2. `c.make_state(layer_info)` -> `C::state`: validates the configuration for that layer and
///     raises bellows::error naming the layer and the bad value.
///  3. `c.reduce(state, std::span<float> inout, collective)` -> reduce_result: a collective call
///     (every rank calls it for the same layer in the same order). On return `inout` holds the
///     average over ranks of each rank's decompressed contribution, identical on every rank, and
///     the step counter of the state has advanced by one. If any rank's input held NaN or Inf,
///     every rank returns step_status::non_finite, `inout` is as it was and no state changed; the
///     ranks agree on this through their first exchange, so no rank waits for another.
///  4. `c.rounds(state, ranks)` -> bellows::exchange_rounds: the collective calls the next reduce
///     of this state by this compressor makes over `ranks` ranks when every input is finite, in
///     order, with the bytes this rank hands to each: true per state (a layer PowerSGD leaves
///     dense, top-k's dense switch), so that an exchange layer can size one buffer for many
///     layers.
/// Single-round codecs also model PayloadCodec below.
/// Minimal model: bellows::identity (compressors/identity.hpp).
template <class C, class Coll>
concept Compressor = Collective<Coll> &&
    requires(C& c, const C& cc, const layer_info& layer, typename C::state& st, std::span<float> inout, Coll& coll) {
  { cc.make_state(layer) } -> std::same_as<typename C::state>;
  { c.reduce(st, inout, coll) } -> std::same_as<reduce_result>;
  { cc.rounds(std::as_const(st), std::size_t{1}) } -> std::same_as<exchange_rounds>;
};

/// PhasedCompressor: a compressor whose step a caller can run as phases around exchanges it
/// makes itself, one collective call per round and operation for many layers
/// (docs/spec.md#phases-a-step-around-exchanges-the-caller-makes). The caller sizes one part per
/// round from `rounds(state, ranks)` (Compressor 4): rounds[i].bytes of the backend's memory
/// (round_part, core/traffic.hpp), from a multiple of part_alignment for PowerSGD and of 8 bytes
/// for an allgather's payload. An allreduce_sum round sums the part in place; an allgather round
/// gathers the part (begin's) into every rank's copy, `stride` floats apart (finish's part is
/// rank 0's copy). No phase waits for the executor or reads a verdict on the host before the
/// caller's synchronize(): the device copies its verdicts into pinned host memory, and its
/// kernels read them on the device (a step of many layers and buckets waits once).
///  1. `c.begin(state, grad, parts, rank, ranks)`: what this rank hands to round 0, written into
///     part 0 from grad (and the error memory).
///  2. `c.next(state, grad, round, parts)`, for round 1, 2, ...: once the parts before hold
///     their sums over the ranks, writes part `round`. It may change the parts before it.
///  3. `c.finish(state, grad, parts, rank, ranks)`: once every part holds its sums or its
///     gathered copies, grad becomes the average and the next memory is written, unless some
///     rank's input was not finite (then neither is touched) or a gathered payload is malformed
///     (the CPU raises bellows::wire_error here, before anything of the layer changes, which
///     ends the step: no conclude).
///  4. Optional, `c.verify(state)`: after the executor's synchronize(), raises the
///     bellows::wire_error of a malformed gathered payload the device found (nothing of the
///     layer changed); a caller verifies every layer it waited for before it concludes any.
///  5. `c.conclude(state)` -> reduce_result: after the executor's synchronize(): the step's
///     status and traffic, as reduce returns them; when ok, the step is committed (the memory and
///     the query take their next values, the counter advances).
/// reduce makes the same calls, or their pieces, on the state's own buffers. Models: every
/// compressor of the list.
template <class C>
concept PhasedCompressor = requires(C& c, typename C::state& st, std::span<const float> grad, std::span<float> out,
                                    round_parts parts, std::size_t i) {
  c.begin(st, grad, parts, i, i);
  c.next(st, grad, i, parts);
  c.finish(st, out, parts, i, i);
  { c.conclude(st) } -> std::same_as<reduce_result>;
};

/// PayloadCodec: a single-round compressor whose payload a trainer may carry itself.
///  1. `c.max_payload_bytes(state)`: an upper bound of the payload size for that layer.
///  2. `c.encode(state, std::span<const float> in, std::span<std::byte> out, rank)` -> the bytes
///     of the payload written at the start of `out` (wire format of core/wire.hpp, `out` aligned
///     to 8 bytes); random choices are keyed by the state's step and, where the codec's section
///     of docs/spec.md says so (see docs/spec.md#random-numbers-philox), the sender's `rank`.
///     encode does not advance the step (reduce does; a trainer driving encode itself advances
///     `state.step` once per exchange).
///  3. `c.validate(state, std::span<const std::byte> payload)` -> step_status: checks the whole
///     payload against the layer (header, sizes, index bounds) and raises bellows::wire_error if
///     it is malformed; returns non_finite if the sender flagged non-finite input.
///  4. `c.decode_add(state, payload, std::span<float> acc)` -> step_status: validates as above
///     (acc untouched on error or on non_finite), else adds the decoded values to acc.
template <class C>
concept PayloadCodec = requires(const C& cc, typename C::state& st, std::span<const float> in, std::span<std::byte> out,
                                std::span<const std::byte> payload, std::span<float> acc, std::size_t rank) {
  { cc.max_payload_bytes(st) } -> std::convertible_to<std::size_t>;
  { cc.encode(st, in, out, rank) } -> std::same_as<std::span<std::byte>>;
  { cc.validate(st, payload) } -> std::same_as<step_status>;
  { cc.decode_add(st, payload, acc) } -> std::same_as<step_status>;
};

/// ErrorFeedback: the memory e that carries what compression left out into the next step.
///  1. `f.add_layer(layer_info)`: sizes the memory of a layer (ids are 0, 1, 2, ... in order).
///  2. `f.compensate(id, std::span<float> grad)`: grad becomes m = grad + e (or is left alone by
///     the `none` memory).
///  3. `f.update(id, std::span<const float> m, std::span<const float> contribution)`: e becomes
///     m - contribution, where contribution is what this rank's m turned into after compression.
/// Minimal model:
///   struct no_memory {
///     void add_layer(const layer_info&) {}
///     void compensate(std::size_t, std::span<float>) {}
///     void update(std::size_t, std::span<const float>, std::span<const float>) {}
///   };
template <class F>
concept ErrorFeedback = requires(F& f, const layer_info& layer, std::size_t id, std::span<float> grad,
                                 std::span<const float> m, std::span<const float> contribution) {
  f.add_layer(layer);
  f.compensate(id, grad);
  f.update(id, m, contribution);
};

/// RegimeDetector: decides, per layer, whether training is in a critical regime.
///  1. `d.observe(id, std::span<const float> grad)`: during an epoch, the raw local gradient of a
///     layer at one step.
///  2. `d.end_epoch(epoch, lr, collective)` -> a range of `regime`, one per layer: a collective
///     call; every rank gets the same decisions.
/// Minimal model (always critical):
///   struct always_critical {
///     std::vector<regime> r;
///     void observe(std::size_t, std::span<const float>) {}
///     template <Collective C> std::span<const regime> end_epoch(std::size_t, float, C&) { return r; }
///   };
template <class D, class Coll>
concept RegimeDetector = Collective<Coll> &&
    requires(D& d, std::size_t id, std::span<const float> grad, std::size_t epoch, float lr, Coll& coll) {
  d.observe(id, grad);
  { d.end_epoch(epoch, lr, coll) } -> std::convertible_to<std::span<const regime>>;
};

// Capabilities: what the Synchronizer (sync/synchronizer.hpp) asks of a compressor or a detector
// beyond the concepts above. It requires LevelDetector; it uses each of the others where the
// type models it, and checkpoint() and restore() exist only where both types are checkpointed.

/// CheckpointedCompressor: a compressor whose per-layer state can be written and read back.
///  1. `c.save(const C::state&, checkpoint_writer&)`: appends everything a later step depends on
///     (step counter, error memory, PowerSGD's query).
///  2. `c.load(C::state&, checkpoint_reader&)`: reads what save wrote for the same layer and
///     configuration, validates all of it before it changes anything, and raises
///     bellows::wire_error (via the reader) for bytes that do not fit.
/// Models: identity, topk, randk, powersgd, qsgd.
template <class C>
concept CheckpointedCompressor = requires(const C& cc, const typename C::state& in, typename C::state& out,
                                          checkpoint_writer& w, checkpoint_reader& r) {
  cc.save(in, w);
  cc.load(out, r);
};

/// CheckpointedDetector: a regime detector whose state can be written and read back.
///  1. `d.save(checkpoint_writer&)` (const): appends the detector's whole state.
///  2. `d.load(checkpoint_reader&)`: reads it back, validated before anything changes.
/// Models: accordion, static_policy.
template <class D>
concept CheckpointedDetector = requires(const D& cd, D& d, checkpoint_writer& w, checkpoint_reader& r) {
  cd.save(w);
  d.load(r);
};

/// SelectiveCompressor: per-layer participation. A compressor that leaves some layers
/// uncompressed (averaged exactly) says which, so that those layers take no part in regime
/// detection (they would gain nothing from a change of level).
///  1. `c.compresses(const C::state&)` -> bool: false for a layer this configuration averages
///     uncompressed; fixed for the state's life.
/// A compressor that does not model it compresses every layer. Model: powersgd (1-D layers, and
/// those whose factors would not be smaller than the matrix).
template <class C>
concept SelectiveCompressor = requires(const C& cc, const typename C::state& st) {
  { cc.compresses(st) } -> std::convertible_to<bool>;
};

/// LevelDetector: a regime detector that a Synchronizer drives, layer by layer.
///  1. `d.add_layer(layer_info, participation)`: registers the next layer (ids 0, 1, 2, ...).
///  2. `d.regimes()` (const) -> a range of `regime`, one per registered layer: the levels in force.
///  3. `d.observe(id, std::span<const float> grad)`, as RegimeDetector 1.
///  4. `d.end_epoch(epoch, lr, collective)` for every Collective the synchronizer is stepped with,
///     as RegimeDetector 2 (checked where the synchronizer calls it).
/// Models: accordion, static_policy.
template <class D>
concept LevelDetector = requires(D& d, const D& cd, const layer_info& layer, participation p, std::size_t id,
                                 std::span<const float> grad) {
  d.add_layer(layer, p);
  { cd.regimes() } -> std::convertible_to<std::span<const regime>>;
  d.observe(id, grad);
};

/// ObservingDetector: the finiteness vote. A detector that reads gradients only in some epochs
/// says when, so that the synchronizer spends its one allreduce of per-layer finiteness flags
/// only in those epochs, and hands over gradients the vote found finite on every rank.
///  1. `d.observing(id)` (const) -> bool: whether layer id's gradient is read in this epoch.
///  2. `d.observe_finite(id, std::span<const float> grad)`: as observe, for a gradient known to
///     be finite on every rank (no second scan for NaN or Inf).
/// A detector that does not model it is taken to observe every layer in every epoch, and gets
/// observe(). Models: accordion, static_policy (which never observes).
template <class D>
concept ObservingDetector = requires(D& d, const D& cd, std::size_t id, std::span<const float> grad) {
  { cd.observing(id) } -> std::convertible_to<bool>;
  d.observe_finite(id, grad);
};

/// Executor: a backend, the part of it that code written once over executors asks for (Accordion,
/// the Synchronizer's finiteness vote and norms). The algorithm names the operations; the backend
/// decides where the data lives (host or device memory) and how the work runs (a thread pool, a
/// CUDA stream). For an executor `e` of type E:
///  1. `E::shared()` -> E&: a process-wide executor for callers that bring none. An executor is
///     not copied: algorithms keep its address.
///  2. `float_array_for<E>` (plan/float_array.hpp), the backend's array of floats:
///     `A(e, n)` holds n zeros in the backend's memory; `a.span()` (std::span<float>, or of const
///     float on a const array) and `a.size()`; `a.host(e, staging)` -> std::span<const float>:
///     the values readable on the host, after everything enqueued before (the one place an
///     algorithm waits; `staging` is a host vector the backend may copy into, grown only when
///     too small); `a.assign(e, values)`: host values in, complete on return.
///     `copy_word(e, word, from)`: one word a kernel wrote in the backend's memory (a float or an
///     unsigned verdict here; a count, a payload's header) into a host variable, complete once
///     e.synchronize() returns; into an element of `host_values_for<E, T>` (`H(e, n)`: n values
///     on the host, value-initialised, `h[i]`), it is enqueued without a wait (pinned memory on a
///     device).
///  3. Kernels, found by argument-dependent lookup beside E, on spans of the backend's memory
///     (an algorithm that needs more, as PowerSGD its products, states them beside it):
///     `fill(e, x, v)`; `copy(e, out, x)`; `scale(e, x, s)`; `divide(e, x, d)`;
///     `divide(e, out, x, d)`; and `fill(e, x, v, skip)` and `divide(e, out, x, d, skip)`, which
///     write nothing when *skip (a float of the backend's memory, such as a summed verdict) is
///     not 0, read where the kernel runs;
///     `add_into(e, x, y)` (x += y); `add(e, out, a, b)`; `subtract(e, out, a, b)`;
///     `flag_non_finite(e, x, flag)`: *flag (one float of the backend's memory) = 1 when x holds
///     a NaN or an Inf, else unchanged; `flag_to_float(e, word, out)`: *out = 1 when the
///     unsigned word a kernel set is not 0, else 0; `mean_norm(e, x, divisor, out)`: *out = the L2 norm of x
///     (squares summed in double, in index order) / divisor, or 0 when divisor is 0.
///  4. Order: kernels run in call order; one may complete after it returns (a device stream),
///     but before any later kernel or host() on the same executor reads what it wrote.
///     `e.synchronize()` waits for all of it (before buffers that work may still use are
///     replaced). Nothing here allocates, except host()'s staging growth and A's construction.
///  5. Bits: every backend gives the same bits for the same inputs, whatever its thread count or
///     launch shape (tests/cuda holds the device kernels to the CPU's).
/// Models: cpu::executor (checked in cpu/float_array.hpp), cuda::executor (cuda/float_array.cuh).
/// Minimal model: archetypes::executor below (host memory, one thread).
template <class E>
concept Executor = requires(E& e, float_array_for<E>& a, const float_array_for<E>& ca, std::span<float> x,
                            std::span<const float> y, std::vector<float>& staging, float v, double divisor, float* out,
                            float& word, unsigned& verdict, const unsigned* flag) {
  { E::shared() } -> std::same_as<E&>;
  requires !std::copy_constructible<E>;
  e.synchronize();
  float_array_for<E>(e, std::size_t{1});
  { host_values_for<E, float>(e, std::size_t{1})[0] } -> std::same_as<float&>;
  { a.span() } -> std::same_as<std::span<float>>;
  { ca.span() } -> std::same_as<std::span<const float>>;
  { ca.size() } -> std::convertible_to<std::size_t>;
  { ca.host(e, staging) } -> std::same_as<std::span<const float>>;
  a.assign(e, y);
  fill(e, x, v);
  fill(e, x, v, out);
  copy(e, x, y);
  scale(e, x, v);
  divide(e, x, v);
  divide(e, x, y, v);
  divide(e, x, y, v, out);
  add_into(e, x, y);
  add(e, x, y, y);
  subtract(e, x, y, y);
  copy_word(e, word, out);
  copy_word(e, verdict, flag);
  flag_non_finite(e, y, out);
  flag_to_float(e, flag, out);
  mean_norm(e, y, divisor, out);
};

namespace archetypes {
/// The least an Executor provides: host memory, every kernel run at once on the calling thread.
struct executor {
  executor() = default;
  executor(const executor&) = delete;
  executor& operator=(const executor&) = delete;
  static executor& shared() {
    static executor instance;
    return instance;
  }
  void synchronize() const noexcept {}
};
struct float_array {
  float_array(executor& /*e*/, std::size_t n) : values(n, 0.0f) {}
  [[nodiscard]] std::span<float> span() noexcept { return values; }
  [[nodiscard]] std::span<const float> span() const noexcept { return values; }
  [[nodiscard]] std::size_t size() const noexcept { return values.size(); }
  [[nodiscard]] std::span<const float> host(executor& /*e*/, std::vector<float>& /*staging*/) const noexcept {
    return values;
  }
  void assign(executor& /*e*/, std::span<const float> from) { std::ranges::copy(from, values.begin()); }
  std::vector<float> values;
};
template <class T>
struct host_values {
  host_values(executor& /*e*/, std::size_t n) : values(n) {}
  [[nodiscard]] T& operator[](std::size_t i) noexcept { return values[i]; }
  std::vector<T> values;
};
inline void fill(executor&, std::span<float> x, float v) { std::ranges::fill(x, v); }
inline void fill(executor& e, std::span<float> x, float v, const float* skip) {
  if (*skip == 0.0f) fill(e, x, v);
}
inline void copy(executor&, std::span<float> out, std::span<const float> x) { std::ranges::copy(x, out.begin()); }
inline void scale(executor&, std::span<float> x, float s) {
  for (float& v : x) v *= s;
}
inline void divide(executor&, std::span<float> x, float d) {
  for (float& v : x) v /= d;
}
inline void divide(executor&, std::span<float> out, std::span<const float> x, float d) {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = x[i] / d;
}
inline void divide(executor& e, std::span<float> out, std::span<const float> x, float d, const float* skip) {
  if (*skip == 0.0f) divide(e, out, x, d);
}
inline void add_into(executor&, std::span<float> x, std::span<const float> y) {
  for (std::size_t i = 0; i < x.size(); ++i) x[i] += y[i];
}
inline void add(executor&, std::span<float> out, std::span<const float> a, std::span<const float> b) {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = a[i] + b[i];
}
inline void subtract(executor&, std::span<float> out, std::span<const float> a, std::span<const float> b) {
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = a[i] - b[i];
}
inline void flag_non_finite(executor&, std::span<const float> x, float* flag) {
  for (const float v : x)
    if (v - v != 0.0f) *flag = 1.0f;  // NaN - NaN and Inf - Inf are NaN
}
template <class T>
void copy_word(executor&, T& to, const T* from) {
  to = *from;
}
inline void flag_to_float(executor&, const unsigned* flag, float* out) { *out = *flag != 0 ? 1.0f : 0.0f; }
inline void mean_norm(executor&, std::span<const float> x, double divisor, float* out) {
  double squares = 0.0;
  for (const float v : x) squares += double{v} * v;
  *out = divisor == 0.0 ? 0.0f : static_cast<float>(std::sqrt(squares) / divisor);
}
}  // namespace archetypes

template <>
struct float_array_of<archetypes::executor> {
  using type = archetypes::float_array;
};
template <class T>
struct host_values_of<archetypes::executor, T> {
  using type = archetypes::host_values<T>;
};

static_assert(Executor<archetypes::executor>, "the archetype must model Executor");

}  // namespace bellows
