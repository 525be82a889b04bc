// SPDX-License-Identifier: Apache-2.0
// The methods bellows-bench can measure. Each is one entry of `methods()`: its name, a line of
// help, its command-line options, and how they become the library's parameter struct. The
// compressor is built from that struct, and the parameters reported are read back from it.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "bellows-bench/measure.hpp"
#include "bellows/compressors/identity.hpp"
#include "bellows/compressors/powersgd.hpp"
#include "bellows/compressors/qsgd.hpp"
#include "bellows/compressors/randk.hpp"
#include "bellows/compressors/topk.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/feedback/error_feedback.hpp"

namespace bellows::tool {

/// The parameters of one `--method NAME ...` group; each method reads the fields it has options for.
/// Defaults are the library's own.
struct method_args {
  std::string feedback;    ///< "residual", "none", or empty for the method's own default
  std::uint64_t seed = 0;  ///< keys the method's random choices (the global --seed)
  double ratio = topk_params{}.ratio;
  bool approximate = false;  ///< top-k's approximate mode
  bool per_rank = false;     ///< rand-k's per-rank mode
  bool unbiased = false;     ///< rand-k's n / k scaling
  std::size_t rank = powersgd_params{}.rank;
  unsigned bits = qsgd_params{}.bits;
  std::size_t bucket = qsgd_params{}.bucket;
  std::string norm = "l2";
};

/// One measurable method.
struct method {
  std::string_view name;
  std::string_view summary;
  void (*add_options)(CLI::App&, method_args&);
  nlohmann::ordered_json (*params)(const method_args&);
  void (*check)(const method_args&, const layer_info&, cpu::executor&);
  method_result (*run)(const method_args&, const run_request&);
};

/// The identity compressor has no parameters.
struct identity_params {};

namespace detail {

/// The compressor of each parameter struct.
inline bellows::identity<> make(const identity_params&, cpu::executor& e) { return bellows::identity<>(e); }
inline bellows::topk<> make(const topk_params& p, cpu::executor& e) { return bellows::topk<>(p, e); }
inline bellows::randk<> make(const randk_params& p, cpu::executor& e) { return bellows::randk<>(p, e); }
inline bellows::powersgd<> make(const powersgd_params& p, cpu::executor& e) { return bellows::powersgd<>(p, e); }
inline bellows::qsgd<> make(const qsgd_params& p, cpu::executor& e) { return bellows::qsgd<>(p, e); }

/// The parameters a user chose or may want to know, as reported.
inline nlohmann::ordered_json describe(const identity_params&) { return nlohmann::ordered_json::object(); }
inline nlohmann::ordered_json describe(const topk_params& p) {
  return {{"ratio", p.ratio}, {"mode", to_string(p.mode)}, {"error_feedback", to_string(p.feedback)}};
}
inline nlohmann::ordered_json describe(const randk_params& p) {
  return {{"ratio", p.ratio},
          {"mode", to_string(p.mode)},
          {"unbiased", p.unbiased},
          {"error_feedback", to_string(p.feedback)}};
}
inline nlohmann::ordered_json describe(const powersgd_params& p) {
  return {{"rank", p.rank}, {"error_feedback", to_string(p.feedback)}};
}
inline nlohmann::ordered_json describe(const qsgd_params& p) {
  return {{"bits", p.bits},
          {"bucket", p.bucket},
          {"norm", p.norm == qsgd_norm::max_abs ? "max-abs" : "l2"},
          {"error_feedback", to_string(p.feedback)}};
}

/// The functions of a method whose parameter struct `Configure{}(args)` builds.
template <class Configure>
nlohmann::ordered_json params_with(const method_args& a) {
  return describe(Configure{}(a));
}
template <class Configure>
void check_with(const method_args& a, const layer_info& layer, cpu::executor& exec) {
  tool::check(layer, exec, [&](cpu::executor& e) { return make(Configure{}(a), e); });
}
template <class Configure>
method_result run_with(const method_args& a, const run_request& req) {
  return tool::measure(req, [&](cpu::executor& e) { return make(Configure{}(a), e); });
}

template <class Options, class Configure>
constexpr method entry(std::string_view name, std::string_view summary, Options, Configure) {
  return {name, summary, +Options{}, &params_with<Configure>, &check_with<Configure>, &run_with<Configure>};
}

/// The memory a method runs with: --error-feedback if given, else the method's default.
[[nodiscard]] inline bellows::feedback feedback_or(const method_args& a, bellows::feedback fallback) {
  return a.feedback.empty() ? fallback : a.feedback == "none" ? bellows::feedback::none : bellows::feedback::residual;
}

/// The --error-feedback option of a method whose default memory is `fallback`.
inline void add_feedback(CLI::App& app, method_args& a, bellows::feedback fallback) {
  app.add_option("--error-feedback", a.feedback,
                 "memory of what compression left out (default " + std::string(to_string(fallback)) + ")")
      ->check(CLI::IsMember({"residual", "none"}));
}

inline void add_ratio(CLI::App& app, method_args& a) {
  app.add_option("--ratio", a.ratio, "fraction of the elements kept, in (0, 1]")->capture_default_str();
}

}  // namespace detail

/// Every method, in the order `--help` lists them.
[[nodiscard]] inline std::span<const method> methods() {
  static const method all[] = {
      detail::entry(
          "identity", "plain averaging by allreduce: the uncompressed baseline", [](CLI::App&, method_args&) {},
          [](const method_args&) { return identity_params{}; }),
      detail::entry(
          "topk", "the ceil(ratio n) largest |x|, as indices and values; allgather",
          [](CLI::App& app, method_args& a) {
            detail::add_ratio(app, a);
            app.add_flag("--approximate", a.approximate, "keep between k and 1.25 k of the largest, when cheaper");
            detail::add_feedback(app, a, topk_params{}.feedback);
          },
          [](const method_args& a) {
            return topk_params{.ratio = a.ratio,
                               .mode = a.approximate ? topk_mode::approximate : topk_mode::exact,
                               .feedback = detail::feedback_or(a, topk_params{}.feedback),
                               .seed = a.seed};
          }),
      detail::entry(
          "randk", "ceil(ratio n) elements drawn uniformly; shared: allreduce, per-rank: allgather",
          [](CLI::App& app, method_args& a) {
            detail::add_ratio(app, a);
            app.add_flag("--per-rank", a.per_rank, "each rank draws its own indices (default: shared)");
            app.add_flag("--unbiased", a.unbiased,
                         "scale the kept values by n / k; the default memory becomes none, as it must");
            detail::add_feedback(app, a, randk_params{}.feedback);
          },
          [](const method_args& a) {
            return randk_params{.ratio = a.ratio,
                                .mode = a.per_rank ? randk_mode::per_rank : randk_mode::shared,
                                .unbiased = a.unbiased,
                                .feedback =
                                    detail::feedback_or(a, a.unbiased ? feedback::none : randk_params{}.feedback),
                                .seed = a.seed};
          }),
      detail::entry(
          "powersgd", "rank-r factors P, Q of the n x m matrix (n = first axis); two allreduces",
          [](CLI::App& app, method_args& a) {
            app.add_option("--rank", a.rank, "columns of the factors")->capture_default_str();
            detail::add_feedback(app, a, powersgd_params{}.feedback);
          },
          [](const method_args& a) {
            return powersgd_params{.rank = a.rank,
                                   .feedback = detail::feedback_or(a, powersgd_params{}.feedback),
                                   .seed = a.seed};
          }),
      detail::entry(
          "qsgd", "stochastic rounding to 2^(bits-1) - 1 levels per bucket scale; allgather",
          [](CLI::App& app, method_args& a) {
            app.add_option("--bits", a.bits, "bits per element: 2, 4 or 8")->capture_default_str();
            app.add_option("--bucket", a.bucket, "elements per bucket (one float scale each)")->capture_default_str();
            app.add_option("--norm", a.norm, "bucket scale: l2 or max-abs")
                ->check(CLI::IsMember({"l2", "max-abs"}))
                ->capture_default_str();
            detail::add_feedback(app, a, qsgd_params{}.feedback);
          },
          [](const method_args& a) {
            return qsgd_params{.bits = a.bits,
                               .bucket = a.bucket,
                               .norm = a.norm == "max-abs" ? qsgd_norm::max_abs : qsgd_norm::l2,
                               .seed = a.seed,
                               .feedback = detail::feedback_or(a, qsgd_params{}.feedback)};
          }),
  };
  return all;
}

/// The method called `name`, or nullptr.
[[nodiscard]] inline const method* find_method(std::string_view name) {
  for (const method& m : methods())
    if (m.name == name) return &m;
  return nullptr;
}

}  // namespace bellows::tool
