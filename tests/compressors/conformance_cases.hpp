// SPDX-License-Identifier: Apache-2.0
// The cases the conformance suite runs: every example configuration of every compressor of
// compressors/list.hpp, each one type. A new compressor joins the suite by joining the list.
#pragma once

#include <bellows/compressors/list.hpp>
#include <bellows/cpu/executor.hpp>

#include <cstddef>
#include <type_traits>

#include "../support/examples.hpp"

namespace bellows::testing {

/// A compressor seen through the Compressor concept alone. For codecs with an error memory,
/// whose payloads depend on the memory that fresh states of the codec round-trip cases lack, and
/// for exchanges other than gather, whose steps average no payload of each rank.
template <class C>
struct compressor_only {
  using state = typename C::state;
  C inner;
  [[nodiscard]] state make_state(const layer_info& layer) const { return inner.make_state(layer); }
  [[nodiscard]] bellows::exchange_rounds rounds(const state& st, std::size_t ranks) const {
    return inner.rounds(st, ranks);
  }
  template <class Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    return inner.reduce(st, inout, coll);
  }
};

/// Whether a configuration keeps an error memory.
template <class Params>
constexpr bool keeps_memory(const Params& p) {
  if constexpr (requires { p.feedback; })
    return p.feedback != feedback::none;
  else
    return false;
}

/// Whether a configuration averages the payloads of every rank (its exchange is gather).
template <class Params>
constexpr bool gathers(const Params& p) {
  if constexpr (requires { p.exchange; })
    return p.exchange == exchange::gather;
  else
    return true;
}

/// Example I of method M, built with an executor.
template <class M, std::size_t I>
struct example_case {
  using method = M;
  static constexpr typename M::params params = M::examples[I];
  using codec = typename M::template compressor<cpu::executor>;
  static constexpr bool hidden = PayloadCodec<codec> && (keeps_memory(params) || !gathers(params));
  using compressor = std::conditional_t<hidden, compressor_only<codec>, codec>;
  static compressor make(cpu::executor& exec) {
    if constexpr (hidden)
      return {M::make(params, exec)};
    else
      return M::make(params, exec);
  }
};

/// Every example of every listed compressor.
using conformance_cases = every_example<example_case>;

}  // namespace bellows::testing
