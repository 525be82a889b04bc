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

/// Averages a layer uncompressed, in two rounds: an allreduce of each rank's verdict on its input
/// (one float: 1 when it holds NaN or Inf), then the allreduce of the data (the data's own sum
/// cannot tell NaN input from overflow). reduce skips the second when the first found one.
template <class Exec = cpu::executor>
class identity {
  static_assert(Executor<Exec>, "identity<Exec>: Exec must model Executor");

public:
  /// One layer: its step counter, the verdict's float in the backend's memory (round 0 of
  /// reduce), and the summed verdict read back.
  struct state {
    layer_info layer;
    std::uint64_t step = 0;
    float_array_for<Exec> flag;            ///< workspace: each rank's verdict, then their sum
    host_values_for<Exec, float> verdict;  ///< the sum, on the host (next copies it)
  };

  explicit identity(Exec& exec = Exec::shared()) : exec_(&exec) {}
  /// As every compressor is made: from its (empty) parameters and an executor.
  identity(const identity_params& /*params*/, Exec& exec) : exec_(&exec) {}

  [[nodiscard]] state make_state(const layer_info& layer) const {
    return {layer, 0, float_array_for<Exec>(*exec_, 1), host_values_for<Exec, float>(*exec_, 1)};
  }
  /// The allreduce of the verdict (one float), then the allreduce of the data.
  [[nodiscard]] exchange_rounds rounds(const state& st, std::size_t /*ranks*/) const {
    return {{collective_op::allreduce_sum, sizeof(float)},
            {collective_op::allreduce_sum, st.layer.size() * sizeof(float)}};
  }

  /// One step, the phases below on the state's verdict float and on `inout` itself: the
  /// verdicts' allreduce, the summed verdict read on the host (the one wait), then, unless some
  /// rank's input was not finite, the allreduce of the data and the division by W.
  template <CollectiveFor<Exec> Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    detail::check_stream("identity", st.layer, coll, *exec_);
    const round_part parts[] = {{st.flag.span()}, {inout}};
    begin(st, inout, parts, coll.rank(), coll.size());
    coll.allreduce_sum(parts[0].values);
    next(st, inout, 1, parts);
    exec_->synchronize();
    if (st.verdict[0] != 0.0f) return conclude(st);  // no rank sends its data
    coll.allreduce_sum(parts[1].values);
    finish(st, inout, parts, coll.rank(), coll.size());
    return conclude(st);  // finish copies nothing back: the verdict read above is the step's
  }

  // Phases (concepts.hpp, PhasedCompressor): parts[0] is the verdict, parts[1] the data.

  /// parts[0] = 1 when grad holds NaN or Inf, else 0.
  void begin(state& st, std::span<const float> grad, round_parts parts, std::size_t /*rank*/, std::size_t ranks) {
    detail::check_buffer("identity", st.layer, grad.size());
    detail::check_parts("identity", st.layer, rounds(st, ranks), parts);
    fill(*exec_, parts[0].values, 0.0f);
    flag_non_finite(*exec_, grad, parts[0].values.data());
  }
  /// The summed verdict copied to the host, and grad into parts[1] (nothing to copy when
  /// parts[1] is grad).
  void next(state& st, std::span<const float> grad, std::size_t /*round*/, round_parts parts) {
    copy_word(*exec_, st.verdict[0], parts[0].values.data());
    if (parts[1].values.data() != grad.data()) copy(*exec_, parts[1].values, grad);
  }
  /// grad = the sums / W, unless the summed verdict is not 0.
  void finish(state& /*st*/, std::span<float> grad, round_parts parts, std::size_t /*rank*/, std::size_t ranks) {
    divide(*exec_, grad, parts[1].values, static_cast<float>(ranks), parts[0].values.data());
  }
  /// The status and traffic; the counter advances when every rank's input was finite.
  reduce_result conclude(state& st) {
    const traffic verdicts{sizeof(float), 1, 0};
    if (st.verdict[0] != 0.0f) return {step_status::non_finite, verdicts};
    ++st.step;
    const std::size_t n = st.layer.size();
    return {step_status::ok, verdicts + traffic{n * sizeof(float), n, n}};
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
static_assert(PhasedCompressor<identity<>>, "identity must model PhasedCompressor");

template <>
struct method_slot<identity_method::codec.id> {
  using type = identity_method;
};

}  // namespace bellows

#if defined(__CUDACC__)  // the device compressor, for device code that includes the list
#include "bellows/compressors/identity.cuh"
#endif
