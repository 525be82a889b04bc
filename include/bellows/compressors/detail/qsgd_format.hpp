// SPDX-License-Identifier: Apache-2.0
// What QSGD is on every backend: its checked parameters, a layer's code layout, the payload
// (header, scales, codes, padding) with its complete validation, and the Philox stream of a step.
// compressors/qsgd.hpp builds its step on it, on every backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ios>
#include <limits>
#include <span>
#include <string_view>

#include "bellows/compressors/qsgd_types.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/philox.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/plan/codes.hpp"
#include "bellows/plan/payload_slots.hpp"

namespace bellows::detail {

class qsgd_format {
public:
  /// Raises bellows::error naming a parameter out of range (qsgd_params::validate).
  explicit qsgd_format(const qsgd_params& params) : params_(params) { params.validate(); }

  [[nodiscard]] const qsgd_params& params() const noexcept { return params_; }

  /// Raises bellows::error when the layer is too large for one Philox stream.
  static void check_layer(const layer_info& layer) {
    BELLOWS_EXPECTS(layer.size() / 4 < (std::size_t{1} << 32), "qsgd: layer '", layer.name, "' of ", layer.size(),
                    " elements overruns the 2^34 words of a Philox stream");
  }

  [[nodiscard]] code_layout layout(std::size_t n) const noexcept { return {params_.bits, params_.bucket, n}; }
  /// The elements a scatter exchange's chunk holds a multiple of: a bucket.
  [[nodiscard]] std::size_t block() const noexcept { return params_.bucket; }
  /// The header's param field: bits | bucket << 8.
  [[nodiscard]] std::uint32_t param() const noexcept {
    return params_.bits | static_cast<std::uint32_t>(params_.bucket << 8);
  }

  /// Where the parts of a payload for n elements lie: every payload of a layer has its size.
  [[nodiscard]] scaled_payload shape(std::size_t n) const {
    const code_layout l = layout(n);
    return scaled_payload_of(qsgd_method::codec.id, n, l.buckets(), l.code_bytes(), param(),
                             static_cast<unsigned>(n * l.bits % 8));
  }

  /// The noise of one step: the layer's Philox stream for this rank (layer_info::stream).
  [[nodiscard]] philox::stream stream(std::uint64_t step, const layer_info& layer, std::size_t rank) const noexcept {
    return layer.stream(params_.seed, step, static_cast<std::uint32_t>(rank));
  }

  /// What one rank sends for a layer of n elements.
  [[nodiscard]] traffic sent(std::size_t n) const { return {shape(n).bytes, layout(n).buckets() + n, n}; }

  /// Validates a payload completely (header against the layer and these parameters, array
  /// sizes, padding, the unused bits of the last code byte, and, unless flagged, every scale
  /// finite and >= 0); raises wire_error naming what is wrong. Returns its reader.
  /// `n` is the layer's size, or a scatter exchange's chunk's; `name` the layer's, for messages.
  [[nodiscard]] wire::reader check(std::string_view name, std::size_t n, std::span<const std::byte> payload) const {
    const code_layout l = layout(n);
    wire::reader r(payload, qsgd_method::codec);
    const wire::header& h = r.head();
    if (h.n != l.n || h.count != l.buckets() || h.param != param() || (h.flags & wire::flag::index64))
      fail<wire_error>("qsgd: payload for ", h.n, " elements in ", h.count, " buckets (param 0x", std::hex, h.param,
                       std::dec, ") where layer '", name, "' has ", l.n, " in ", l.buckets(), " (param 0x", std::hex,
                       param(), ")");
    const std::span<const float> scales = r.array<float>(h.count);
    const std::span<const std::uint8_t> codes = r.array<std::uint8_t>(l.code_bytes());
    r.finish();
    if (const std::size_t used = l.n * l.bits % 8; used != 0 && (codes.back() >> used) != 0)
      fail<wire_error>("qsgd: unused bits of the last code byte are not zero");
    if (!(h.flags & wire::flag::non_finite))
      for (std::size_t b = 0; b < scales.size(); ++b)
        if (!(scales[b] >= 0.0f && scales[b] <= std::numeric_limits<float>::max()))
          fail<wire_error>("qsgd: scale ", scales[b], " of bucket ", b, " is not a finite number >= 0");
    return r;
  }

private:
  qsgd_params params_;
};

}  // namespace bellows::detail
