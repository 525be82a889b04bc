// SPDX-License-Identifier: Apache-2.0
// QSGD (Alistarh, Grubic, Li, Tomioka, Vojnovic, NeurIPS 2017): unbiased stochastic quantisation
// to b bits per element, bucket by bucket, exchanged by allgather and averaged (docs/spec.md#qsgd).
//
// Payload (wire format of core/wire.hpp, codec qsgd): header with count = buckets and
// param = bits | bucket << 8, then one float32 scale per bucket, then the b-bit codes packed
// little-endian within bytes (element i in bits (i b) mod 8 of byte (i b) / 8; sign in the top
// bit of a code), the last bucket possibly short. A sender whose input held NaN or Inf (a bucket
// scale that is not finite) sets the non_finite flag; every rank sees it in the allgather.
//
// Written once over the executor (compressors/detail/scaled_codes.hpp has the step):
// qsgd<cpu::executor> keeps its state in host memory, qsgd<cuda::executor>
// (compressors/qsgd.cuh brings its kernels) in device memory, with the same payload bytes,
// outputs and memories: the same Philox noise, and every sum and quotient rounded in one order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "bellows/compressors/detail/qsgd_format.hpp"
#include "bellows/compressors/detail/scaled_codes.hpp"
#include "bellows/compressors/qsgd_types.hpp"
#include "bellows/concepts.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/cpu/float_array.hpp"
#include "bellows/cpu/payload_slots.hpp"
#include "bellows/cpu/quantize.hpp"
#include "bellows/plan/codes.hpp"

namespace bellows {

template <class Exec = cpu::executor>
class qsgd : public detail::scaled_codes<qsgd<Exec>, Exec, detail::qsgd_format, code_arrays> {
  using base = detail::scaled_codes<qsgd<Exec>, Exec, detail::qsgd_format, code_arrays>;
  friend base;

public:
  static constexpr const char* name = "qsgd";

  explicit qsgd(const qsgd_params& params = {}, Exec& exec = Exec::shared()) : base(params, exec) {}

private:
  [[nodiscard]] static std::size_t workspace_floats(const code_layout& /*layout*/) noexcept { return 0; }

  /// Quantizes `in` with the noise of the layer's stream at state.step for `rank`.
  void encode_arrays(const typename base::state& st, std::span<const float> in, const code_layout& layout,
                     std::span<float> scales, std::span<std::uint8_t> codes, std::span<float> /*workspace*/,
                     unsigned* non_finite, std::size_t rank) const {
    quantize_pack(*this->exec_, in, layout, this->params().norm, this->format_.stream(st.step, st.layer, rank), scales,
                  codes, non_finite);
  }
  void decode_arrays(std::span<const float> scales, std::span<const std::uint8_t> codes, const code_layout& layout,
                     std::span<float> out, bool accumulate) const {
    unpack_dequantize(*this->exec_, scales, codes, layout, out, accumulate);
  }
};

static_assert(Compressor<qsgd<>, archetypes::collective>, "qsgd must model Compressor");
static_assert(CheckpointedCompressor<qsgd<>>, "qsgd must model CheckpointedCompressor");
static_assert(PayloadCodec<qsgd<>>, "qsgd must model PayloadCodec");
static_assert(PhasedCompressor<qsgd<>>, "qsgd must model PhasedCompressor");

template <>
struct method_slot<qsgd_method::codec.id> {
  using type = qsgd_method;
};

}  // namespace bellows

#if defined(__CUDACC__)  // the device compressor, for device code that includes the list
#include "bellows/compressors/qsgd.cuh"
#endif
