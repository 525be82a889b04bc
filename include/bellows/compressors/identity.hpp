// SPDX-License-Identifier: Apache-2.0
// The identity compressor: plain averaging by allreduce, the baseline every other compressor is
// measured against, and the smallest model of Compressor and PayloadCodec. Written once over the
// executor: identity<cuda::executor> (compressors/identity.cuh brings its kernels) averages
// device memory through a DeviceCollective with the CPU's bits; the PayloadCodec members are
// the CPU's only (its payload is the floats themselves, in host memory).
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "bellows/compressors/detail/step_checks.hpp"
#include "bellows/concepts.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/method.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/cpu/float_array.hpp"
#include "bellows/plan/float_array.hpp"

namespace bellows {

template <class Exec>
class identity;

/// The identity compressor has no parameters.
struct identity_params {};

/// How tools and test suites name, configure and build the identity compressor (core/method.hpp).
struct identity_method {
  using params = identity_params;
  template <class Exec>
  using compressor = identity<Exec>;

  static constexpr std::string_view name = "identity";
  static constexpr wire::codec codec{0, "identity"};
  static constexpr std::string_view summary = "plain averaging by allreduce: the uncompressed baseline";
  static constexpr bool on_device = true;  ///< compressors/identity.cuh
  static constexpr bool exact_on_one_element = true;
  static constexpr std::string_view level = {};  ///< no level: both levels are the same
  static constexpr std::span<const method_option> options = {};
  static constexpr params examples[] = {{}};

  [[nodiscard]] static params configure(const method_settings&) { return {}; }
  [[nodiscard]] static std::vector<method_param> describe(const params&) { return {}; }
  template <class Exec>
  [[nodiscard]] static compressor<Exec> make(const params&, Exec& exec) {
    return compressor<Exec>(exec);
  }
};

/// Averages a layer uncompressed. Agreement on non-finite input takes one extra allreduce of a
/// single float before the data (the data allreduce itself cannot tell NaN input from overflow).
template <class Exec = cpu::executor>
class identity {
  static_assert(Executor<Exec>, "identity<Exec>: Exec must model Executor");

public:
  /// One layer: its step counter and the verdict's float in the backend's memory.
  struct state {
    layer_info layer;
    std::uint64_t step = 0;
    float_array_for<Exec> flag;  ///< workspace: each rank's verdict, then their sum
    std::vector<float> staging;  ///< the flag read back, where the backend's memory is not the host's
  };

  explicit identity(Exec& exec = Exec::shared()) : exec_(&exec) {}
  /// As every compressor is made: from its (empty) parameters and an executor.
  identity(const identity_params& /*params*/, Exec& exec) : exec_(&exec) {}

  [[nodiscard]] state make_state(const layer_info& layer) const {
    return {layer, 0, float_array_for<Exec>(*exec_, 1), {}};
  }
  /// The allreduce of the verdict (one float), then the allreduce of the data.
  [[nodiscard]] exchange_rounds rounds(const state& st, std::size_t /*ranks*/) const {
    return {{collective_op::allreduce_sum, sizeof(float)},
            {collective_op::allreduce_sum, st.layer.size() * sizeof(float)}};
  }

  /// One step: an allreduce of each rank's verdict on its input (1 if it holds NaN or Inf), read
  /// on the host (the one wait), then the allreduce of the data and the division by W.
  template <CollectiveFor<Exec> Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    detail::check_buffer("identity", st.layer, inout.size());
    detail::check_stream("identity", st.layer, coll, *exec_);
    fill(*exec_, st.flag.span(), 0.0f);
    flag_non_finite(*exec_, std::span<const float>(inout), st.flag.span().data());
    coll.allreduce_sum(st.flag.span());
    traffic sent{sizeof(float), 1, 0};
    if (st.flag.host(*exec_, st.staging)[0] != 0.0f) return {step_status::non_finite, sent};
    coll.allreduce_sum(inout);
    divide(*exec_, inout, static_cast<float>(coll.size()));
    ++st.step;
    sent += traffic{inout.size_bytes(), inout.size(), inout.size()};
    return {step_status::ok, sent};
  }

  [[nodiscard]] std::size_t max_payload_bytes(const state& st) const {
    return wire::payload_bytes(wire::array_end<float>(0, st.layer.size()));
  }

  [[nodiscard]] std::span<std::byte> encode(const state& st, std::span<const float> in, std::span<std::byte> out,
                                            std::size_t /*rank*/ = 0) const requires std::same_as<Exec, cpu::executor> {
    detail::check_buffer("identity", st.layer, in.size());
    wire::header h{};
    h.codec = identity_method::codec.id;
    h.n = in.size();
    h.count = in.size();
    if (!all_finite(*exec_, in)) h.flags |= wire::flag::non_finite;
    wire::writer w(out, h);
    std::ranges::copy(in, w.array<float>(in.size()).begin());
    return w.finish();
  }

  [[nodiscard]] step_status validate(
      const state& st, std::span<const std::byte> payload) const requires std::same_as<Exec, cpu::executor> {
    return read(st, payload).first;
  }

  [[nodiscard]] step_status decode_add(const state& st, std::span<const std::byte> payload,
                                       std::span<float> acc) const requires std::same_as<Exec, cpu::executor> {
    detail::check_buffer("identity", st.layer, acc.size());
    const auto [status, values] = read(st, payload);
    if (status == step_status::ok)
      for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += values[i];
    return status;
  }

  /// Checkpoint of a layer's state: its step counter.
  void save(const state& st, checkpoint_writer& out) const { out.put(st.step); }
  void load(state& st, checkpoint_reader& in) const { st.step = in.get<std::uint64_t>("identity step"); }

private:
  /// Validates a payload completely; its values, unless the sender flagged non-finite input.
  static std::pair<step_status, std::span<const float>> read(const state& st, std::span<const std::byte> payload) {
    wire::reader r(payload, identity_method::codec);
    const wire::header& h = r.head();
    if (h.n != st.layer.size() || h.count != h.n || h.param != 0 || (h.flags & wire::flag::index64))
      fail<wire_error>("identity: payload for ", h.n, " elements (count ", h.count, ", param ", h.param,
                       ") where layer '", st.layer.name, "' has ", st.layer.size());
    const std::span<const float> values = r.array<float>(h.count);
    r.finish();
    if (h.flags & wire::flag::non_finite) return {step_status::non_finite, {}};
    for (float v : values)
      if (!std::isfinite(v)) fail<wire_error>("identity: payload holds a non-finite value without the non-finite flag");
    return {step_status::ok, values};
  }

  Exec* exec_;
};

static_assert(Compressor<identity<>, archetypes::collective>, "identity must model Compressor");
static_assert(CheckpointedCompressor<identity<>>, "identity must model CheckpointedCompressor");
static_assert(PayloadCodec<identity<>>, "identity must model PayloadCodec");

template <>
struct method_slot<identity_method::codec.id> {
  using type = identity_method;
};

}  // namespace bellows

#if defined(__CUDACC__)  // the device compressor, for device code that includes the list
#include "bellows/compressors/identity.cuh"
#endif
