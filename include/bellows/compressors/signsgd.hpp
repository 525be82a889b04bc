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
//
// Written once over the executor (compressors/detail/scaled_codes.hpp has the step):
// signsgd<cpu::executor> keeps its state in host memory, signsgd<cuda::executor>
// (compressors/signsgd.cuh brings its kernels) in device memory, with the same payload bytes,
// outputs and memories (every sum and quotient rounded in the order cpu/signs.hpp fixes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "bellows/compressors/detail/scaled_codes.hpp"
#include "bellows/compressors/detail/signsgd_format.hpp"
#include "bellows/compressors/signsgd_types.hpp"
#include "bellows/concepts.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/cpu/float_array.hpp"
#include "bellows/cpu/payload_slots.hpp"
#include "bellows/cpu/signs.hpp"
#include "bellows/plan/signs.hpp"

namespace bellows {

template <class Exec = cpu::executor>
class signsgd : public detail::scaled_codes<signsgd<Exec>, Exec, detail::signsgd_format, sign_arrays> {
  using base = detail::scaled_codes<signsgd<Exec>, Exec, detail::signsgd_format, sign_arrays>;
  friend base;

public:
  static constexpr const char* name = "signsgd";

  /// Raises bellows::error for a bucket of 2^32 elements or more.
  explicit signsgd(const signsgd_params& params = {}, Exec& exec = Exec::shared()) : base(params, exec) {}

private:
  /// The chunk sums of buckets too long for one task (none for short buckets).
  [[nodiscard]] std::size_t workspace_floats(const sign_layout& layout) const {
    return sign_workspace(*this->exec_, layout);
  }

  /// No randomness: `st` and `rank` are not used.
  void encode_arrays(const typename base::state& /*st*/, std::span<const float> in, const sign_layout& layout,
                     std::span<float> scales, std::span<std::uint8_t> signs, std::span<float> workspace,
                     unsigned* non_finite, std::size_t /*rank*/) const {
    sign_encode(*this->exec_, in, layout, scales, signs, workspace, non_finite);
  }
  void decode_arrays(std::span<const float> scales, std::span<const std::uint8_t> signs, const sign_layout& layout,
                     std::span<float> out, bool accumulate) const {
    sign_decode(*this->exec_, scales, signs, layout, out, accumulate);
  }
};

static_assert(Compressor<signsgd<>, archetypes::collective>, "signsgd must model Compressor");
static_assert(CheckpointedCompressor<signsgd<>>, "signsgd must model CheckpointedCompressor");
static_assert(PayloadCodec<signsgd<>>, "signsgd must model PayloadCodec");
static_assert(PhasedCompressor<signsgd<>>, "signsgd must model PhasedCompressor");

template <>
struct method_slot<signsgd_method::codec.id> {
  using type = signsgd_method;
};

}  // namespace bellows

#if defined(__CUDACC__)  // the device compressor, for device code that includes the list
#include "bellows/compressors/signsgd.cuh"
#endif
