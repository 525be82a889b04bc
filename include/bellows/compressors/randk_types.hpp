// SPDX-License-Identifier: Apache-2.0
// Parameters of the rand-k compressor (compressors/randk.hpp), and its method descriptor.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "bellows/core/error.hpp"
#include "bellows/core/method.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/plan/exchange.hpp"
#include "bellows/plan/feedback.hpp"
#include "bellows/plan/kept.hpp"

namespace bellows {

enum class randk_mode : std::uint8_t {
  shared,    ///< every rank keeps the same indices; the values are averaged by one allreduce
  per_rank,  ///< each rank draws its own indices; payloads are averaged by allgather
};

[[nodiscard]] constexpr std::string_view to_string(randk_mode m) noexcept {
  return m == randk_mode::shared ? "shared" : "per_rank";
}

struct randk_params {
  /// k = clamp(ceil(ratio * n), 1, n) for a layer of n elements; ratio in (0, 1].
  double ratio = 0.01;
  /// When > 0, keep min(k, n) elements of every layer and ignore `ratio`; never negative.
  std::int64_t k = 0;
  randk_mode mode = randk_mode::shared;
  /// Multiply the kept values by n / k, so that the compressed vector is unbiased. Only without
  /// error feedback: the scaled compressor is no contraction, and its memory would grow.
  bool unbiased = false;
  /// Error feedback, fused into the gathering pass. On by default: unscaled rand-k keeps k / n of
  /// the gradient in expectation, and the memory returns the rest in later steps.
  bellows::feedback feedback = bellows::feedback::residual;
  /// Keys the index draw, with the step, the layer and (per-rank mode) the rank.
  std::uint64_t seed = 0;
  /// How the ranks of per-rank mode average: gather (an allgather of every rank's payload) or
  /// scatter (each chunk's draw to its owner, drawn again there, then gathered;
  /// docs/spec.md#scatter-exchange). Shared mode's one allreduce is flat in W already: it takes
  /// gather only.
  bellows::exchange exchange = bellows::exchange::gather;
  /// Under scatter: whether a chunk's owner keeps what its draw leaves (on by default, as the
  /// worker memory is; off with unbiased scaling, which no memory may follow).
  bool owner_memory = true;

  /// Raises bellows::error naming the first parameter out of range, or unbiased scaling with an
  /// error memory; both backends' constructors call it.
  void validate() const {
    detail::check_kept_params("randk", ratio, k);
    BELLOWS_EXPECTS(mode == randk_mode::shared || mode == randk_mode::per_rank,
                    "randk: mode must be shared or per_rank, got the value ", static_cast<unsigned>(mode));
    check_feedback("randk", feedback);
    BELLOWS_EXPECTS(!unbiased || feedback == bellows::feedback::none,
                    "randk: unbiased scaling needs feedback none, got feedback ", to_string(feedback));
    check_exchange("randk", exchange, "gather|scatter");
    if (exchange != bellows::exchange::scatter) return;
    BELLOWS_EXPECTS(mode == randk_mode::per_rank,
                    "randk: the scatter exchange takes per_rank mode (shared mode's one allreduce of k values is "
                    "flat in W already)");
    BELLOWS_EXPECTS(!unbiased || !owner_memory, "randk: unbiased scaling needs owner_memory off under scatter");
  }
};

template <class Exec>
class randk;

/// How tools and test suites name, configure and build rand-k (core/method.hpp).
struct randk_method {
  using params = randk_params;
  template <class Exec>
  using compressor = randk<Exec>;

  static constexpr std::string_view name = "randk";
  static constexpr wire::codec codec{2, "randk"};
  static constexpr std::string_view summary =
      "ceil(ratio n) elements drawn uniformly; shared: allreduce, per-rank: allgather";
  static constexpr bool on_device = true;  ///< compressors/randk.cuh (the shared mode)
  static constexpr bool exact_on_one_element = true;
  static constexpr std::string_view level = "ratio";
  static constexpr method_option options[] = {
      {"ratio", "fraction of the elements kept, in (0, 1]", "0.01"},
      {"per-rank", "each rank draws its own indices (default: shared)", {}, {}, true},
      {"unbiased", "scale the kept values by n / k; the default memory becomes none, as it must", {}, {}, true},
      feedback_option(params{}.feedback),
      exchange_option("gather|scatter"),
      owner_memory_option(params{}.owner_memory),
  };
  /// Configurations that reach every path: both modes with and without the memory.
  static constexpr params examples[] = {
      {.ratio = 0.05, .feedback = feedback::none},
      {.ratio = 0.05, .mode = randk_mode::per_rank, .feedback = feedback::none},
      {.ratio = 0.1, .seed = 5},
      {.ratio = 0.1, .mode = randk_mode::per_rank, .seed = 5},
  };

  [[nodiscard]] static params configure(const method_settings& s) {
    const bool unbiased = s.flag("unbiased");
    return with_exchange_settings(params{.ratio = s.number("ratio", params{}.ratio),
                                         .mode = s.flag("per-rank") ? randk_mode::per_rank : randk_mode::shared,
                                         .unbiased = unbiased,
                                         .seed = s.whole("seed", params{}.seed)},
                                  s, "gather|scatter", unbiased ? feedback::none : params{}.feedback,
                                  !unbiased && params{}.owner_memory);
  }
  [[nodiscard]] static std::vector<method_param> describe(const params& p) {
    return with_exchange_description({{"ratio", p.ratio}, {"mode", to_string(p.mode)}, {"unbiased", p.unbiased}}, p);
  }
  template <class Exec>
  [[nodiscard]] static compressor<Exec> make(const params& p, Exec& exec) {
    return compressor<Exec>(p, exec);
  }
};

}  // namespace bellows
