// SPDX-License-Identifier: Apache-2.0
// The methods bellows-bench can measure. Each is one entry of `methods()`: its name, a line of
// help, its command-line options, its parameters as reported, and how to build the compressor.
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
#include "bellows/core/shape.hpp"
#include "bellows/cpu/executor.hpp"

namespace bellows::tool {

/// The parameters of one `--method NAME ...` group; each method reads the fields it has options for.
struct method_args {
  std::string feedback;     ///< "residual", "none", or empty for the method's own default
  std::uint64_t seed = 0;   ///< keys the method's random choices (the global --seed)
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

namespace detail {

/// The check and run functions of a method whose compressor `Make{}(args, exec)` builds.
template <class Make>
void check_with(const method_args& a, const layer_info& layer, cpu::executor& exec) {
  tool::check(layer, exec, [&](cpu::executor& e) { return Make{}(a, e); });
}
template <class Make>
method_result run_with(const method_args& a, const run_request& req) {
  return tool::measure(req, [&](cpu::executor& e) { return Make{}(a, e); });
}

template <class Options, class Params, class Make>
constexpr method entry(std::string_view name, std::string_view summary, Options, Params, Make) {
  return {name, summary, +Options{}, +Params{}, &check_with<Make>, &run_with<Make>};
}

}  // namespace detail

/// Every method, in the order `--help` lists them.
[[nodiscard]] inline std::span<const method> methods() {
  static const method all[] = {
      detail::entry(
          "identity", "plain averaging by allreduce: the uncompressed baseline",
          [](CLI::App&, method_args&) {}, [](const method_args&) { return nlohmann::ordered_json::object(); },
          [](const method_args&, cpu::executor& e) { return bellows::identity<>(e); }),
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
