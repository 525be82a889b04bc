// SPDX-License-Identifier: Apache-2.0
// The compressors the conformance suite runs, one case type each: how to build it with an
// executor. A new compressor joins the suite with a case here and a name in test_conformance.cpp.
#pragma once

#include <bellows/compressors/identity.hpp>
#include <bellows/compressors/powersgd.hpp>
#include <bellows/compressors/qsgd.hpp>
#include <bellows/compressors/randk.hpp>
#include <bellows/compressors/topk.hpp>
#include <bellows/cpu/executor.hpp>

namespace bellows::testing {

struct identity_case {
  using compressor = bellows::identity<>;
  static compressor make(cpu::executor& exec) { return compressor(exec); }
};

struct powersgd_case {
  using compressor = bellows::powersgd<>;
  static compressor make(cpu::executor& exec) { return compressor({.rank = 2}, exec); }
};

struct qsgd_case {
  using compressor = bellows::qsgd<>;
  static compressor make(cpu::executor& exec) { return compressor({.bits = 4, .bucket = 100}, exec); }
};

/// A compressor seen through the Compressor concept alone. For codecs with an error memory,
/// whose payloads depend on the memory that fresh states of the codec round-trip cases lack.
template <class C>
struct compressor_only {
  using state = typename C::state;
  C inner;
  [[nodiscard]] state make_state(const layer_info& layer) const { return inner.make_state(layer); }
  [[nodiscard]] bellows::aggregation aggregation() const { return inner.aggregation(); }
  template <class Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    return inner.reduce(st, inout, coll);
  }
};

struct topk_case {
  using compressor = bellows::topk<>;
  static compressor make(cpu::executor& exec) { return compressor({.ratio = 0.05, .feedback = feedback::none}, exec); }
};

struct topk_dense_case {  // W * k * 8 >= 4 n from W = 2: the dense allreduce
  using compressor = bellows::topk<>;
  static compressor make(cpu::executor& exec) {
    return compressor({.ratio = 0.25, .mode = topk_mode::approximate, .feedback = feedback::none}, exec);
  }
};

struct topk_residual_case {
  using compressor = compressor_only<bellows::topk<>>;
  static compressor make(cpu::executor& exec) { return {bellows::topk<>({.ratio = 0.05}, exec)}; }
};

struct randk_case {
  using compressor = bellows::randk<>;
  static compressor make(cpu::executor& exec) { return compressor({.ratio = 0.05, .feedback = feedback::none}, exec); }
};

struct randk_per_rank_case {
  using compressor = bellows::randk<>;
  static compressor make(cpu::executor& exec) {
    return compressor({.ratio = 0.05, .mode = randk_mode::per_rank, .feedback = feedback::none}, exec);
  }
};

struct randk_residual_case {
  using compressor = compressor_only<bellows::randk<>>;
  static compressor make(cpu::executor& exec) { return {bellows::randk<>({.ratio = 0.05}, exec)}; }
};

}  // namespace bellows::testing
