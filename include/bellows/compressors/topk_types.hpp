// SPDX-License-Identifier: Apache-2.0
// Parameters of the top-k compressor (compressors/topk.hpp), and its method descriptor.
#pragma once

#include <algorithm>
#include <cstddef>
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

enum class topk_mode : std::uint8_t {
  exact,        ///< the k largest |x|; ties at the threshold go to the lower index (docs/spec.md#top-k)
  approximate,  ///< between k and ceil(1.25 k) of the largest |x|, when that saves work
};

[[nodiscard]] constexpr std::string_view to_string(topk_mode m) noexcept {
  return m == topk_mode::exact ? "exact" : "approximate";
}

/// The most entries a payload holds when k of a layer's n elements are kept: k in exact mode,
/// ceil(1.25 k) (at most n) in approximate mode. Every backend's payloads and plans use it.
[[nodiscard]] constexpr std::size_t topk_most(topk_mode m, std::size_t n, std::size_t k) noexcept {
  return m == topk_mode::exact ? k : std::min(n, k + (k + 3) / 4);
}

struct topk_params {
  /// k = clamp(ceil(ratio * n), 1, n) for a layer of n elements; ratio in (0, 1].
  double ratio = 0.01;
  /// When > 0, keep min(k, n) elements of every layer and ignore `ratio`; never negative.
  std::int64_t k = 0;
  topk_mode mode = topk_mode::exact;
  /// Error feedback fused into the selection pass: e = m - (the kept entries of m = g + e).
  bellows::feedback feedback = bellows::feedback::residual;
  /// Keys the sample that sets the selection threshold. Exact results do not depend on it; the
  /// kept set of approximate mode does.
  std::uint64_t seed = 0;
  /// Average by a dense allreduce instead of an allgather when docs/spec.md#top-k finds it cheaper:
  /// W * k * (index + value bytes) >= 4 n.
  bool dense_switch = true;
  /// How the ranks average (docs/spec.md#top-k-leader): gather (an allgather of every rank's
  /// payload), leader (the indices of rank step mod W used by every rank, the values at them
  /// allreduced) or scatter (each chunk's entries to its owner, selected again there, then
  /// gathered; docs/spec.md#scatter-exchange; exact mode). dense_switch applies to gather only.
  bellows::exchange exchange = bellows::exchange::gather;
  /// Under scatter: whether a chunk's owner keeps what its selection drops (on by default: top-k
  /// is biased, and what the owner drops would otherwise be lost).
  bool owner_memory = true;

  /// Raises bellows::error naming the first parameter out of range; both backends' constructors
  /// call it.
  void validate() const {
    detail::check_kept_params("topk", ratio, k);
    BELLOWS_EXPECTS(mode == topk_mode::exact || mode == topk_mode::approximate,
                    "topk: mode must be exact or approximate, got the value ", static_cast<unsigned>(mode));
    check_feedback("topk", feedback);
    check_exchange("topk", exchange, "gather|leader|scatter");
    BELLOWS_EXPECTS(exchange != bellows::exchange::scatter || mode == topk_mode::exact,
                    "topk: the scatter exchange keeps a fixed count per chunk: mode must be exact");
  }
};

template <class Exec>
class topk;

/// How tools and test suites name, configure and build top-k (core/method.hpp).
struct topk_method {
  using params = topk_params;
  template <class Exec>
  using compressor = topk<Exec>;

  static constexpr std::string_view name = "topk";
  static constexpr wire::codec codec{1, "topk"};
  static constexpr std::string_view summary = "the ceil(ratio n) largest |x|, as indices and values; allgather";
  static constexpr bool on_device = true;             ///< compressors/topk.cuh
  static constexpr bool exact_on_one_element = true;  ///< a layer of one element is averaged exactly
  static constexpr std::string_view level = "ratio";  ///< the option a level of Accordion sets
  static constexpr method_option options[] = {
      {"ratio", "fraction of the elements kept, in (0, 1]", "0.01"},
      {"approximate", "keep between k and 1.25 k of the largest, when cheaper", {}, {}, true},
      feedback_option(params{}.feedback),
      exchange_option("gather|leader|scatter"),
      owner_memory_option(params{}.owner_memory),
  };
  /// Configurations that reach every path: no memory, the dense average, the memory, a large k,
  /// and the leader's exchange with and without memory.
  static constexpr params examples[] = {
      {.ratio = 0.05, .feedback = feedback::none},
      {.ratio = 0.25, .mode = topk_mode::approximate, .feedback = feedback::none},
      {.ratio = 0.05},
      {.ratio = 0.9},
      {.ratio = 0.05, .exchange = exchange::leader},
      {.ratio = 0.25, .mode = topk_mode::approximate, .feedback = feedback::none, .exchange = exchange::leader},
  };

  [[nodiscard]] static params configure(const method_settings& s) {
    return with_exchange_settings(params{.ratio = s.number("ratio", params{}.ratio),
                                         .mode = s.flag("approximate") ? topk_mode::approximate : topk_mode::exact,
                                         .seed = s.whole("seed", params{}.seed)},
                                  s, "gather|leader|scatter", params{}.feedback, params{}.owner_memory);
  }
  [[nodiscard]] static std::vector<method_param> describe(const params& p) {
    return with_exchange_description({{"ratio", p.ratio}, {"mode", to_string(p.mode)}}, p);
  }
  template <class Exec>
  [[nodiscard]] static compressor<Exec> make(const params& p, Exec& exec) {
    return compressor<Exec>(p, exec);
  }
};

}  // namespace bellows
