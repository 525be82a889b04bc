// SPDX-License-Identifier: Apache-2.0
// EF-signSGD (Karimireddy, Rebjock, Stich, Jaggi, "Error Feedback Fixes SignSGD and other
// Gradient Compression Schemes", ICML 2019): each element sent as its sign, each bucket as the
// mean |p_i| of its elements, with the error memory carrying what that left out; exchanged by
// allgather and averaged (docs/signsgd.md).
//
// Payload (wire format of core/wire.hpp, codec signsgd, id 5): header with count = buckets and
// param = the bucket parameter (0: the whole layer is one bucket), then one float32 scale per
// bucket, then the sign bits (element i in bit i % 8 of byte i / 8; 1 = negative), the unused
// high bits of the last byte zero. A sender whose input held NaN or Inf (a scale that is not
// finite) sets the non_finite flag; every rank sees it in the allgather.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "bellows/compressors/detail/gather_average.hpp"
#include "bellows/compressors/detail/signsgd_format.hpp"
#include "bellows/compressors/detail/step_record.hpp"
#include "bellows/compressors/signsgd_types.hpp"
#include "bellows/concepts.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/gather_buffer.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/cpu/signs.hpp"
#include "bellows/feedback/error_feedback.hpp"

namespace bellows {

template <class Exec = cpu::executor>
class signsgd {
public:
  /// One layer: step counter, optional error memory, and workspace (this rank's payload, the
  /// gathered payloads, the compensated gradient when there is a memory).
  struct state {
    layer_info layer;
    std::uint64_t step = 0;
    error_memory memory;
    std::vector<std::uint64_t> payload;  ///< 8-byte aligned storage of this rank's payload
    gather_buffer gathered;
    std::vector<sign_arrays> parts;  ///< every rank's validated arrays, for the average
    std::vector<float> compensated;  ///< m = g + e, when there is a memory
    std::vector<float> chunk_sums;   ///< cpu::sign_workspace floats for the scales of long buckets
  };

  /// Raises bellows::error for a bucket of 2^32 elements or more.
  explicit signsgd(const signsgd_params& params = {}, Exec& exec = Exec::shared()) : format_(params), exec_(&exec) {}

  [[nodiscard]] const signsgd_params& params() const noexcept { return format_.params(); }

  [[nodiscard]] state make_state(const layer_info& layer) const {
    state st;
    st.layer = layer;
    st.memory = error_memory(params().feedback, layer.size());
    if (st.memory.enabled()) st.compensated.assign(layer.size(), 0.0f);
    st.payload.assign((max_payload_bytes(st) + 7) / 8, 0);
    st.chunk_sums.resize(cpu::sign_workspace(layout(st)));
    return st;
  }

  [[nodiscard]] bellows::aggregation aggregation() const noexcept { return bellows::aggregation::allgather; }

  template <Collective Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    check_size(st, inout.size());
    st.memory.check_kind("signsgd", st.layer.name, params().feedback);
    if (st.payload.size() * 8 < max_payload_bytes(st)) st.payload.resize((max_payload_bytes(st) + 7) / 8);
    if (st.chunk_sums.size() < cpu::sign_workspace(layout(st))) st.chunk_sums.resize(cpu::sign_workspace(layout(st)));
    std::span<const float> m = inout;
    if (st.memory.enabled()) {
      add(*exec_, st.compensated, inout, st.memory.values());
      m = st.compensated;
    }
    const std::span<std::byte> mine = encode_with(st, m, std::as_writable_bytes(std::span(st.payload)), st.chunk_sums);
    const step_status status = detail::gather_average(
        mine, inout, coll, st.gathered, st.parts,
        [&](std::span<const std::byte> block, sign_arrays& part) {
          const step_status s = validate(st, block);
          if (s == step_status::ok) part = format_.arrays(st.layer, block);
          return s;
        },
        [&](std::span<const sign_arrays> parts, std::span<float> out) {
          cpu::sign_average(*exec_, parts, layout(st), out);
        });
    const traffic sent = format_.sent(st.layer.size());
    if (status != step_status::ok) return {status, sent};
    // e = m - (this rank's decoded contribution)
    if (st.memory.enabled())
      cpu::sign_residual(*exec_, format_.arrays(st.layer, mine), layout(st), m, st.memory.values());
    ++st.step;
    return {step_status::ok, sent};
  }

  [[nodiscard]] std::size_t max_payload_bytes(const state& st) const { return format_.payload_bytes(st.layer.size()); }

  /// This rank's payload for `in` (m = g + e when the caller keeps a memory), written into `out`
  /// (8-byte aligned, max_payload_bytes long). No randomness: `rank` is not used. A layer with
  /// buckets of more than 2^16 elements allocates its chunk sums here (reduce uses the state's).
  [[nodiscard]] std::span<std::byte> encode(const state& st, std::span<const float> in, std::span<std::byte> out,
                                            std::size_t rank = 0) const {
    (void)rank;
    std::vector<float> workspace(cpu::sign_workspace(layout(st)));
    return encode_with(st, in, out, workspace);
  }

  [[nodiscard]] step_status validate(const state& st, std::span<const std::byte> payload) const {
    const wire::reader r = format_.check(st.layer, payload);
    return (r.head().flags & wire::flag::non_finite) ? step_status::non_finite : step_status::ok;
  }

  [[nodiscard]] step_status decode_add(const state& st, std::span<const std::byte> payload,
                                       std::span<float> acc) const {
    check_size(st, acc.size());
    if (validate(st, payload) == step_status::non_finite) return step_status::non_finite;
    cpu::sign_decode(*exec_, format_.arrays(st.layer, payload), layout(st), acc, true);
    return step_status::ok;
  }

  /// Appends the step counter and the error memory (empty without one).
  void save(const state& st, checkpoint_writer& out) const {
    detail::write_step_record(out, st.step, st.memory.values());
  }
  /// Reads what save wrote for the same layer and configuration; checks before it changes anything.
  void load(state& st, checkpoint_reader& in) const {
    const detail::step_record rec =
        detail::read_step_record(in, st.memory.values().size(), "signsgd step", "signsgd error memory");
    std::ranges::copy(rec.memory, st.memory.values().begin());
    st.step = rec.step;
  }

private:
  [[nodiscard]] sign_layout layout(const state& st) const noexcept { return format_.layout(st.layer.size()); }

  [[nodiscard]] std::span<std::byte> encode_with(const state& st, std::span<const float> in, std::span<std::byte> out,
                                                 std::span<float> workspace) const {
    check_size(st, in.size());
    const sign_layout l = layout(st);
    wire::writer w(out, format_.header(l.n));
    const std::span<float> scales = w.array<float>(l.buckets());
    const std::span<std::uint8_t> signs = w.array<std::uint8_t>(l.sign_bytes());
    const bool finite = cpu::sign_encode(*exec_, in, l, scales, signs, workspace);
    return w.finish(finite ? 0 : wire::flag::non_finite);
  }

  static void check_size(const state& st, std::size_t n) { detail::signsgd_format::check_size(st.layer, n); }

  detail::signsgd_format format_;
  Exec* exec_;
};

static_assert(Compressor<signsgd<>, archetypes::collective>, "signsgd must model Compressor");
static_assert(CheckpointedCompressor<signsgd<>>, "signsgd must model CheckpointedCompressor");
static_assert(PayloadCodec<signsgd<>>, "signsgd must model PayloadCodec");

template <>
struct method_slot<signsgd_method::codec.id> {
  using type = signsgd_method;
};

}  // namespace bellows

#if defined(__CUDACC__)  // the device compressor, for device code that includes the list
#include "bellows/compressors/signsgd.cuh"
#endif
