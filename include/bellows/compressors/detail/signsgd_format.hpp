// SPDX-License-Identifier: Apache-2.0
// What EF-signSGD is on every backend: its checked parameters, a layer's sign layout, the payload
// (header, scales, sign bits, padding) with its complete validation, and its traffic.
// compressors/signsgd.hpp builds its step on it, on every backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>

#include "bellows/compressors/signsgd_types.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/plan/payload_slots.hpp"
#include "bellows/plan/signs.hpp"

namespace bellows::detail {

class signsgd_format {
public:
  /// Raises bellows::error naming a parameter out of range (signsgd_params::validate).
  explicit signsgd_format(const signsgd_params& params) : params_(params) { params.validate(); }

  [[nodiscard]] const signsgd_params& params() const noexcept { return params_; }

  /// Every layer fits (no randomness, no stream to overrun): nothing to check.
  static void check_layer(const layer_info& /*layer*/) noexcept {}

  [[nodiscard]] sign_layout layout(std::size_t n) const noexcept { return {params_.bucket, n}; }
  /// The elements a scatter exchange's chunk holds a multiple of: a bucket, or any count when the
  /// bucket is the whole layer (each chunk then has a scale of its own).
  [[nodiscard]] std::size_t block() const noexcept { return params_.bucket == 0 ? 1 : params_.bucket; }
  /// The header's param field: the bucket parameter as given (0: the whole layer).
  [[nodiscard]] std::uint32_t param() const noexcept { return static_cast<std::uint32_t>(params_.bucket); }

  /// Where the parts of a payload for n elements lie: every payload of a layer has its size.
  [[nodiscard]] scaled_payload shape(std::size_t n) const {
    const sign_layout l = layout(n);
    return scaled_payload_of(signsgd_method::codec.id, n, l.buckets(), l.sign_bytes(), param(),
                             static_cast<unsigned>(n % 8));
  }

  /// What one rank sends for a layer of n elements: the payload's bytes, its B scales and n
  /// signs as values, and n elements kept (a dense method), as QSGD reports.
  [[nodiscard]] traffic sent(std::size_t n) const { return {shape(n).bytes, layout(n).buckets() + n, n}; }

  /// Validates a payload completely (header against the layer and these parameters, array
  /// sizes, padding, the unused bits of the last sign byte, and, unless flagged, every scale
  /// finite and >= 0); raises wire_error naming what is wrong. Returns its reader, positioned
  /// after the arrays.
  /// `n` is the layer's size, or a scatter exchange's chunk's; `name` the layer's, for messages.
  [[nodiscard]] wire::reader check(std::string_view name, std::size_t n, std::span<const std::byte> payload) const {
    const sign_layout l = layout(n);
    wire::reader r(payload, signsgd_method::codec);
    const wire::header& h = r.head();
    if (h.n != l.n || h.count != l.buckets() || h.param != param() || (h.flags & wire::flag::index64))
      fail<wire_error>("signsgd: payload for ", h.n, " elements in ", h.count, " buckets (bucket parameter ", h.param,
                       ", flags ", unsigned{h.flags}, ") where layer '", name, "' has ", l.n, " in ", l.buckets(),
                       " (bucket parameter ", param(), ")");
    const std::span<const float> scales = r.array<float>(h.count);
    const std::span<const std::uint8_t> signs = r.array<std::uint8_t>(l.sign_bytes());
    r.finish();
    if (const std::size_t used = l.n % 8; used != 0 && (signs.back() >> used) != 0)
      fail<wire_error>("signsgd: unused bits of the last sign byte are not zero");
    if (!(h.flags & wire::flag::non_finite))
      for (std::size_t b = 0; b < scales.size(); ++b)
        if (!(scales[b] >= 0.0f && scales[b] <= std::numeric_limits<float>::max()))
          fail<wire_error>("signsgd: scale ", scales[b], " of bucket ", b, " is not a finite number >= 0");
    return r;
  }

private:
  signsgd_params params_;
};

}  // namespace bellows::detail
