// SPDX-License-Identifier: Apache-2.0
// Parameters of PowerSGD (compressors/powersgd.hpp), and its method descriptor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

#include "bellows/core/error.hpp"
#include "bellows/core/method.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/plan/feedback.hpp"

namespace bellows {

/// How PowerSGD compresses. The defaults are those of PyTorch's PowerSGDState, except the rank
/// (PyTorch's default is 1 too) and the seed, which every rank must share.
struct powersgd_params {
  /// r: columns of the factors P (n x r) and Q (m x r); r' = min(r, n, m) is used. >= 1.
  std::size_t rank = 1;
  /// A layer is compressed only when (n + m) * r' * min_compression_rate < n * m. > 0.
  float min_compression_rate = 2.0f;
  /// Reuse the previous step's Q (orthogonalised again) instead of drawing a new one each step.
  bool warm_start = true;
  /// eps of the orthogonalisation: column j is divided by (||column j|| + eps). >= 0.
  float orthogonalization_eps = 0.0f;
  /// The error memory e = M - out (residual by default; none turns error feedback off).
  bellows::feedback feedback = bellows::feedback::residual;
  /// Key of the shared query's random stream; the same on every rank.
  std::uint64_t seed = 0;

  /// Raises bellows::error naming the first parameter out of range; both backends' constructors
  /// call it.
  void validate() const {
    BELLOWS_EXPECTS(rank >= 1, "powersgd: rank must be >= 1, got ", rank);
    BELLOWS_EXPECTS(min_compression_rate > 0.0f && min_compression_rate <= std::numeric_limits<float>::max(),
                    "powersgd: min_compression_rate must be a finite number > 0, got ", min_compression_rate);
    BELLOWS_EXPECTS(orthogonalization_eps >= 0.0f && orthogonalization_eps <= std::numeric_limits<float>::max(),
                    "powersgd: orthogonalization_eps must be a finite number >= 0, got ", orthogonalization_eps);
    check_feedback("powersgd", feedback);
  }
};

template <class Exec>
class powersgd;

/// How tools and test suites name, configure and build PowerSGD (core/method.hpp). It sends no
/// payload (two allreduces of factors): its codec id is only reserved.
struct powersgd_method {
  using params = powersgd_params;
  template <class Exec>
  using compressor = powersgd<Exec>;

  static constexpr std::string_view name = "powersgd";
  static constexpr wire::codec codec{4, "powersgd"};
  static constexpr std::string_view summary =
      "rank-r factors P, Q of the n x m matrix (n = first axis); two allreduces";
  static constexpr bool on_device = true;  ///< compressors/powersgd.cuh
  static constexpr bool exact_on_one_element = true;
  static constexpr std::string_view level = "rank";
  static constexpr method_option options[] = {
      {"rank", "columns of the factors", "1"},
      {"min-compression-rate", "compress a layer only when (n + m) r min-compression-rate < n m", "2"},
      {"warm-start", "reuse the previous step's query", "true", "true|false"},
      feedback_option(params{}.feedback),
  };
  /// Configurations that reach every path: ranks 1, 2 and 4 (2 with its own seed).
  static constexpr params examples[] = {{.rank = 2, .seed = 3}, {.rank = 4}, {.rank = 1}};

  [[nodiscard]] static params configure(const method_settings& s) {
    return {.rank = static_cast<std::size_t>(s.whole("rank", params{}.rank)),
            .min_compression_rate = static_cast<float>(s.number("min-compression-rate", params{}.min_compression_rate)),
            .warm_start = s.choice("warm-start", "true|false", "true") == "true",
            .feedback = feedback_setting(s, params{}.feedback),
            .seed = s.whole("seed", params{}.seed)};
  }
  [[nodiscard]] static std::vector<method_param> describe(const params& p) {
    return {{"rank", std::uint64_t{p.rank}}, {"error_feedback", to_string(p.feedback)}};
  }
  template <class Exec>
  [[nodiscard]] static compressor<Exec> make(const params& p, Exec& exec) {
    return compressor<Exec>(p, exec);
  }
};

}  // namespace bellows
