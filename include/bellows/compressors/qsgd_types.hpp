// SPDX-License-Identifier: Apache-2.0
// Parameters of QSGD (compressors/qsgd.hpp), and its method descriptor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "bellows/core/error.hpp"
#include "bellows/core/method.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/plan/codes.hpp"
#include "bellows/plan/exchange.hpp"
#include "bellows/plan/feedback.hpp"

namespace bellows {

/// How a bucket's scale is measured: its L2 norm (the paper's choice) or its largest magnitude.
using qsgd_norm = bucket_norm;

struct qsgd_params {
  /// b: bits per element, 2, 4 or 8 (sign-magnitude: s = 2^(b-1) - 1 levels above zero).
  unsigned bits = 8;
  /// d: elements per bucket (one float32 scale each), 1 .. 2^24 - 1.
  std::size_t bucket = 512;
  qsgd_norm norm = qsgd_norm::l2;
  /// Key of the rounding noise, drawn from (seed, step, layer, rank).
  std::uint64_t seed = 0;
  /// Off by default (QSGD is unbiased); when on, the contribution is the local decoded value.
  bellows::feedback feedback = bellows::feedback::none;
  /// How the ranks average: gather (every payload to every rank) or scatter (chunks to their
  /// owners, re-encoded there, then gathered; docs/spec.md#scatter-exchange).
  bellows::exchange exchange = bellows::exchange::gather;
  /// Under scatter: whether a chunk's owner keeps the error of its re-encoding. Off by default,
  /// as QSGD is unbiased.
  bool owner_memory = false;

  /// Raises bellows::error naming the first parameter out of range; both backends' constructors
  /// call it.
  void validate() const {
    BELLOWS_EXPECTS(code_layout::valid_bits(bits), "qsgd: bits must be 2, 4 or 8, got ", bits);
    BELLOWS_EXPECTS(bucket >= 1 && bucket < (std::size_t{1} << 24), "qsgd: bucket must be in [1, 2^24), got ", bucket);
    BELLOWS_EXPECTS(norm == qsgd_norm::l2 || norm == qsgd_norm::max_abs,
                    "qsgd: norm must be l2 or max_abs, got the value ", static_cast<unsigned>(norm));
    check_feedback("qsgd", feedback);
    check_exchange("qsgd", exchange, "gather|scatter");
  }
};

template <class Exec>
class qsgd;

/// How tools and test suites name, configure and build QSGD (core/method.hpp).
struct qsgd_method {
  using params = qsgd_params;
  template <class Exec>
  using compressor = qsgd<Exec>;

  static constexpr std::string_view name = "qsgd";
  static constexpr wire::codec codec{3, "qsgd"};
  static constexpr std::string_view summary =
      "stochastic rounding to 2^(bits-1) - 1 levels per bucket scale; allgather";
  static constexpr bool on_device = true;              ///< compressors/qsgd.cuh
  static constexpr bool exact_on_one_element = false;  ///< the scale of a one-element bucket is rounded
  static constexpr std::string_view level = "bits";
  static constexpr method_option options[] = {
      {"bits", "bits per element: 2, 4 or 8", "8"},
      {"bucket", "elements per bucket (one float scale each)", "512"},
      {"norm", "bucket scale: l2 or max-abs", "l2", "l2|max-abs"},
      feedback_option(params{}.feedback),
      exchange_option("gather|scatter"),
      owner_memory_option(params{}.owner_memory),
  };
  /// Configurations that reach every path: each width, short buckets, max-abs, the memory.
  static constexpr params examples[] = {
      {.bits = 4, .bucket = 100},
      {.bits = 8, .bucket = 4, .seed = 9},
      {.bits = 2, .bucket = 4},
      {.bits = 4, .bucket = 64, .norm = qsgd_norm::max_abs, .feedback = feedback::residual},
  };

  [[nodiscard]] static params configure(const method_settings& s) {
    return with_exchange_settings(
        params{.bits = static_cast<unsigned>(s.whole("bits", params{}.bits)),
               .bucket = static_cast<std::size_t>(s.whole("bucket", params{}.bucket)),
               .norm = s.choice("norm", "l2|max-abs", "l2") == "max-abs" ? qsgd_norm::max_abs : qsgd_norm::l2,
               .seed = s.whole("seed", params{}.seed)},
        s, "gather|scatter", params{}.feedback, params{}.owner_memory);
  }
  [[nodiscard]] static std::vector<method_param> describe(const params& p) {
    return with_exchange_description({{"bits", std::uint64_t{p.bits}},
                                      {"bucket", std::uint64_t{p.bucket}},
                                      {"norm", p.norm == qsgd_norm::max_abs ? "max-abs" : "l2"}},
                                     p);
  }
  template <class Exec>
  [[nodiscard]] static compressor<Exec> make(const params& p, Exec& exec) {
    return compressor<Exec>(p, exec);
  }
};

}  // namespace bellows
