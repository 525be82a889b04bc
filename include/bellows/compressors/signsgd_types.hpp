// SPDX-License-Identifier: Apache-2.0
// Parameters of EF-signSGD (compressors/signsgd.hpp), and its method descriptor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

#include "bellows/core/error.hpp"
#include "bellows/core/method.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/plan/exchange.hpp"
#include "bellows/plan/feedback.hpp"

namespace bellows {

struct signsgd_params {
  /// Elements per bucket (one float32 scale, the mean |x| of the bucket, each); 0: the whole
  /// layer is one bucket. Below 2^32 (the header's param field).
  std::size_t bucket = 0;
  /// Residual by default (Karimireddy et al.: the memory is what makes signSGD converge); none
  /// gives scaled sign SGD.
  bellows::feedback feedback = bellows::feedback::residual;
  /// How the ranks average: gather (every payload to every rank) or scatter (chunks to their
  /// owners, re-encoded there, then gathered; docs/spec.md#scatter-exchange).
  bellows::exchange exchange = bellows::exchange::gather;
  /// Under scatter: whether a chunk's owner keeps the error of its re-encoding. On by default: a
  /// sign's error is biased, and the owner's memory carries it to the next step, as the workers' do.
  bool owner_memory = true;

  /// Raises bellows::error naming the first parameter out of range (the header's param field
  /// holds the bucket in 32 bits); both backends' constructors call it.
  void validate() const {
    BELLOWS_EXPECTS(bucket <= std::numeric_limits<std::uint32_t>::max(),
                    "signsgd: bucket must be below 2^32 (0: the whole layer), got ", bucket);
    check_feedback("signsgd", feedback);
    check_exchange("signsgd", exchange, "gather|scatter");
  }
};

template <class Exec>
class signsgd;

/// How tools and test suites name, configure and build EF-signSGD (core/method.hpp).
struct signsgd_method {
  using params = signsgd_params;
  template <class Exec>
  using compressor = signsgd<Exec>;

  static constexpr std::string_view name = "signsgd";
  static constexpr wire::codec codec{5, "signsgd"};
  static constexpr std::string_view summary =
      "one sign bit per element and the mean |x| of each bucket, with error feedback; allgather";
  static constexpr bool on_device = true;              ///< compressors/signsgd.cuh
  static constexpr bool exact_on_one_element = true;   ///< a one-element bucket's mean |x| and sign are x
  static constexpr std::string_view level = "bucket";  ///< the option a level of Accordion sets
  static constexpr method_option options[] = {
      {"bucket", "elements per scale, 0 = the whole layer", "0"},
      feedback_option(params{}.feedback),
      exchange_option("gather|scatter"),
      owner_memory_option(params{}.owner_memory),
  };
  /// Configurations that reach every path: one bucket, short buckets, no memory, a scale each.
  static constexpr params examples[] = {
      {.bucket = 0, .feedback = feedback::residual},
      {.bucket = 64, .feedback = feedback::residual},
      {.bucket = 100, .feedback = feedback::none},
      {.bucket = 1},
  };

  [[nodiscard]] static params configure(const method_settings& s) {
    return with_exchange_settings(params{.bucket = static_cast<std::size_t>(s.whole("bucket", params{}.bucket))}, s,
                                  "gather|scatter", params{}.feedback, params{}.owner_memory);
  }
  [[nodiscard]] static std::vector<method_param> describe(const params& p) {
    return with_exchange_description({{"bucket", std::uint64_t{p.bucket}}}, p);
  }
  template <class Exec>
  [[nodiscard]] static compressor<Exec> make(const params& p, Exec& exec) {
    return compressor<Exec>(p, exec);
  }
};

}  // namespace bellows
