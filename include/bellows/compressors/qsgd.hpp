// SPDX-License-Identifier: Apache-2.0
// QSGD (Alistarh, Grubic, Li, Tomioka, Vojnovic, NeurIPS 2017): unbiased stochastic quantisation
// to b bits per element, bucket by bucket, exchanged by allgather and averaged (docs/spec.md#qsgd).
//
// Payload (wire format of core/wire.hpp, codec qsgd): header with count = buckets and
// param = bits | bucket << 8, then one float32 scale per bucket, then the b-bit codes packed
// little-endian within bytes (element i in bits (i b) mod 8 of byte (i b) / 8; sign in the top
// bit of a code), the last bucket possibly short. A sender whose input held NaN or Inf (a bucket
// scale that is not finite) sets the non_finite flag; every rank sees it in the allgather.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "bellows/compressors/detail/gather_average.hpp"
#include "bellows/compressors/detail/qsgd_format.hpp"
#include "bellows/compressors/detail/step_record.hpp"
#include "bellows/compressors/qsgd_types.hpp"
#include "bellows/concepts.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/gather_buffer.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/cpu/quantize.hpp"
#include "bellows/feedback/error_feedback.hpp"

namespace bellows {

template <class Exec = cpu::executor>
class qsgd {
public:
  /// One layer: step counter, optional error memory, and workspace (this rank's payload, the
  /// gathered payloads, the compensated gradient when there is a memory).
  struct state {
    layer_info layer;
    std::uint64_t step = 0;
    error_memory memory;
    std::vector<std::uint64_t> payload;  ///< 8-byte aligned storage of this rank's payload
    gather_buffer gathered;
    std::vector<code_arrays> parts;  ///< every rank's validated arrays, for the average
    std::vector<float> compensated;  ///< m = g + e, when there is a memory
  };

  explicit qsgd(const qsgd_params& params = {}, Exec& exec = Exec::shared()) : format_(params), exec_(&exec) {}

  [[nodiscard]] const qsgd_params& params() const noexcept { return format_.params(); }

  [[nodiscard]] state make_state(const layer_info& layer) const {
    detail::qsgd_format::check_layer(layer);
    state st;
    st.layer = layer;
    st.memory = error_memory(params().feedback, layer.size());
    if (st.memory.enabled()) st.compensated.assign(layer.size(), 0.0f);
    st.payload.assign((max_payload_bytes(st) + 7) / 8, 0);
    return st;
  }

  [[nodiscard]] bellows::aggregation aggregation() const noexcept { return bellows::aggregation::allgather; }

  template <Collective Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    check_size(st, inout.size());
    st.memory.check_kind("qsgd", st.layer.name, params().feedback);
    if (st.payload.size() * 8 < max_payload_bytes(st)) st.payload.resize((max_payload_bytes(st) + 7) / 8);
    std::span<const float> m = inout;
    if (st.memory.enabled()) {
      add(*exec_, st.compensated, inout, st.memory.values());
      m = st.compensated;
    }
    const std::span<std::byte> mine = encode(st, m, std::as_writable_bytes(std::span(st.payload)), coll.rank());
    const step_status status = detail::gather_average(
        mine, inout, coll, st.gathered, st.parts,
        [&](std::span<const std::byte> block, code_arrays& part) {
          const step_status s = validate(st, block);
          if (s == step_status::ok) part = read(st, block);
          return s;
        },
        [&](std::span<const code_arrays> parts, std::span<float> out) {
          average_dequantize(*exec_, parts, layout(st), out);
        });
    const traffic sent = format_.sent(st.layer.size());
    if (status != step_status::ok) return {status, sent};
    if (st.memory.enabled()) {
      // e = m - (this rank's decoded contribution)
      const auto [scales, codes] = read(st, mine);
      unpack_dequantize(*exec_, scales, codes, layout(st), st.memory.values(), false);
      subtract(*exec_, st.memory.values(), m, st.memory.values());
    }
    ++st.step;
    return {step_status::ok, sent};
  }

  [[nodiscard]] std::size_t max_payload_bytes(const state& st) const { return format_.payload_bytes(st.layer.size()); }

  [[nodiscard]] std::span<std::byte> encode(const state& st, std::span<const float> in, std::span<std::byte> out,
                                            std::size_t rank = 0) const {
    check_size(st, in.size());
    const code_layout l = layout(st);
    wire::writer w(out, format_.header(l.n));
    const std::span<float> scales = w.array<float>(l.buckets());
    const std::span<std::uint8_t> codes = w.array<std::uint8_t>(l.code_bytes());
    const bool finite =
        quantize_pack(*exec_, in, l, params().norm, format_.stream(st.step, st.layer, rank), scales, codes);
    return w.finish(finite ? 0 : wire::flag::non_finite);
  }

  [[nodiscard]] step_status validate(const state& st, std::span<const std::byte> payload) const {
    const wire::reader r = format_.check(st.layer, payload);
    return (r.head().flags & wire::flag::non_finite) ? step_status::non_finite : step_status::ok;
  }

  [[nodiscard]] step_status decode_add(const state& st, std::span<const std::byte> payload,
                                       std::span<float> acc) const {
    check_size(st, acc.size());
    if (validate(st, payload) == step_status::non_finite) return step_status::non_finite;
    const auto [scales, codes] = read(st, payload);
    unpack_dequantize(*exec_, scales, codes, layout(st), acc, true);
    return step_status::ok;
  }

  /// Appends the step counter and the error memory (empty without one).
  void save(const state& st, checkpoint_writer& out) const {
    detail::write_step_record(out, st.step, st.memory.values());
  }
  /// Reads what save wrote for the same layer and configuration; checks before it changes anything.
  void load(state& st, checkpoint_reader& in) const {
    const detail::step_record rec =
        detail::read_step_record(in, st.memory.values().size(), "qsgd step", "qsgd error memory");
    std::ranges::copy(rec.memory, st.memory.values().begin());
    st.step = rec.step;
  }

private:
  [[nodiscard]] code_layout layout(const state& st) const noexcept { return format_.layout(st.layer.size()); }

  /// The scales and codes of a payload that format_.check accepted.
  [[nodiscard]] code_arrays read(const state& st, std::span<const std::byte> payload) const {
    const code_layout l = layout(st);
    wire::reader r(payload, qsgd_method::codec);
    const std::span<const float> scales = r.array<float>(l.buckets());
    return {scales, r.array<std::uint8_t>(l.code_bytes())};
  }

  static void check_size(const state& st, std::size_t n) { detail::qsgd_format::check_size(st.layer, n); }

  detail::qsgd_format format_;
  Exec* exec_;
};

static_assert(Compressor<qsgd<>, archetypes::collective>, "qsgd must model Compressor");
static_assert(CheckpointedCompressor<qsgd<>>, "qsgd must model CheckpointedCompressor");
static_assert(PayloadCodec<qsgd<>>, "qsgd must model PayloadCodec");

template <>
struct method_slot<qsgd_method::codec.id> {
  using type = qsgd_method;
};

}  // namespace bellows

#if defined(__CUDACC__)  // the device compressor, for device code that includes the list
#include "bellows/compressors/qsgd.cuh"
#endif
