// SPDX-License-Identifier: Apache-2.0
// The methods bellows-bench can measure: one per compressor of compressors/list.hpp, whose method
// descriptor gives its name, a line of help, its command-line options, and how their values
// become the library's parameter struct. The compressor is built from that struct, and the
// parameters reported are read back from it.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "bellows-bench/measure.hpp"
#include "bellows/compressors/list.hpp"
#include "bellows/core/method.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/cpu/executor.hpp"

namespace bellows::tool {

/// The option values of one `--method NAME ...` group, as text, by option name.
struct method_args {
  std::vector<std::pair<std::string, std::string>> values;  ///< options given a value
  std::vector<std::pair<std::string, bool>> flags;          ///< every flag option, on or off
  std::uint64_t seed = 0;                                   ///< keys the method's random choices (the global --seed)
  std::string feedback;  ///< the global --error-feedback, for methods whose group gives none

  /// The settings a method descriptor's configure() reads.
  [[nodiscard]] method_settings settings() const {
    method_settings s;
    s.set("seed", std::to_string(seed));
    if (!feedback.empty()) s.set("error-feedback", feedback);
    for (const auto& [name, text] : values)
      if (!text.empty()) s.set(name, text);
    for (const auto& [name, on] : flags)
      if (on) s.set(name, "true");
    return s;
  }
};

/// One measurable method: a compressor of compressors/list.hpp.
struct method {
  std::string_view name;
  std::string_view summary;
  void (*add_options)(CLI::App&, method_args&);
  nlohmann::ordered_json (*params)(const method_args&);
  void (*check)(const method_args&, const layer_info&, cpu::executor&);
  method_result (*run)(const method_args&, const run_request&);
  /// Per layer, the rounds of a step over `ranks` ranks (Compressor 4), from a fresh state.
  std::vector<exchange_rounds> (*rounds)(const method_args&, std::span<const layer_info>, std::size_t ranks);
};

namespace detail {

/// The options of descriptor M as CLI11 options bound to `a`.
template <class M>
void add_options(CLI::App& app, method_args& a) {
  a.values.reserve(std::size(M::options));  // the options bind to elements that must not move
  a.flags.reserve(std::size(M::options));
  for (const method_option& o : M::options) {
    const std::string name = "--" + std::string(o.name);
    if (o.flag) {
      app.add_flag(name, a.flags.emplace_back(std::string(o.name), false).second, std::string(o.help));
      continue;
    }
    CLI::Option* opt = app.add_option(name, a.values.emplace_back(std::string(o.name), "").second, std::string(o.help));
    opt->default_str(std::string(o.fallback));
    if (!o.choices.empty()) {
      const std::vector<std::string_view> choices = split_choices(o.choices);
      opt->check(CLI::IsMember(std::vector<std::string>(choices.begin(), choices.end())));
    }
  }
}

/// The parameters a user chose or may want to know, as reported.
template <class M>
nlohmann::ordered_json params(const method_args& a) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const method_param& p : M::describe(M::configure(a.settings())))
    std::visit([&](const auto& v) { out[std::string(p.name)] = v; }, p.value);
  return out;
}

template <class M>
void check(const method_args& a, const layer_info& layer, cpu::executor& exec) {
  const typename M::params p = M::configure(a.settings());
  tool::check(layer, exec, [&](cpu::executor& e) { return M::make(p, e); });
}

template <class M>
method_result run(const method_args& a, const run_request& req) {
  const typename M::params p = M::configure(a.settings());
  return tool::measure(req, [&](cpu::executor& e) { return M::make(p, e); });
}

template <class M>
std::vector<exchange_rounds> rounds(const method_args& a, std::span<const layer_info> layers, std::size_t ranks) {
  const typename M::params p = M::configure(a.settings());
  auto c = M::make(p, cpu::executor::shared());
  std::vector<exchange_rounds> out;
  out.reserve(layers.size());
  for (const layer_info& l : layers) out.push_back(c.rounds(c.make_state(l), ranks));
  return out;
}

template <class... Methods>
std::vector<method> entries(method_list<Methods...>) {
  return {method{Methods::name, Methods::summary, &add_options<Methods>, &params<Methods>, &check<Methods>,
                 &run<Methods>, &rounds<Methods>}...};
}

}  // namespace detail

/// Every method, in the order of compressors/list.hpp (the order `--help` lists them).
[[nodiscard]] inline std::span<const method> methods() {
  static const std::vector<method> all = detail::entries(compressor_methods{});
  return all;
}

/// The method called `name`, or nullptr.
[[nodiscard]] inline const method* find_method(std::string_view name) {
  for (const method& m : methods())
    if (m.name == name) return &m;
  return nullptr;
}

}  // namespace bellows::tool
