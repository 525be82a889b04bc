// SPDX-License-Identifier: Apache-2.0
// How a compressor describes itself to whatever lists every compressor (bellows-bench, the
// Python hook, the test suites, the fuzz target): the vocabulary of a method descriptor. Each
// compressor declares its descriptor beside its parameters (`topk_method` in topk_types.hpp) and
// registers it in its own header; compressors/list.hpp gathers the registered ones. docs/compressors.md#the-list
// says what a descriptor holds.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <variant>
#include <vector>

#include "bellows/core/error.hpp"

namespace bellows {

/// One option of a method, spelled as on a command line (`--ratio 0.1`, `--approximate`).
struct method_option {
  std::string_view name;
  std::string_view help;
  std::string_view fallback = {};  ///< the library's default as text; empty for a flag (off)
  std::string_view choices = {};   ///< the values allowed, separated by '|'; empty: any
  bool flag = false;               ///< takes no value: present means on
};

/// The values of a '|'-separated list of choices, in order.
[[nodiscard]] inline std::vector<std::string_view> split_choices(std::string_view choices) {
  std::vector<std::string_view> out;
  for (std::size_t at = 0; at <= choices.size();) {
    const std::size_t bar = std::min(choices.find('|', at), choices.size());
    out.push_back(choices.substr(at, bar - at));
    at = bar + 1;
  }
  return out;
}

/// Option values by name, as text: what a tool or binding read, for a descriptor's configure().
/// Besides a method's own options, "seed" keys every random choice (the tools' global seed).
class method_settings {
public:
  method_settings& set(std::string_view name, std::string value) {
    for (auto& [key, text] : values_)
      if (key == name) {
        text = std::move(value);
        return *this;
      }
    values_.emplace_back(std::string(name), std::move(value));
    return *this;
  }

  [[nodiscard]] bool has(std::string_view name) const { return find(name) != nullptr; }

  [[nodiscard]] std::string_view text(std::string_view name, std::string_view fallback) const {
    const std::string* v = find(name);
    return v ? std::string_view(*v) : fallback;
  }

  /// A real number; raises bellows::error naming the option when the text is not one.
  [[nodiscard]] double number(std::string_view name, double fallback) const {
    const std::string* v = find(name);
    if (!v) return fallback;
    double x = 0;
    const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), x);
    if (ec != std::errc{} || end != v->data() + v->size() || v->empty())
      fail("option ", name, ": '", *v, "' is not a number");
    return x;
  }

  /// A whole number >= 0; raises bellows::error naming the option when the text is not one.
  [[nodiscard]] std::uint64_t whole(std::string_view name, std::uint64_t fallback) const {
    const std::string* v = find(name);
    if (!v) return fallback;
    std::uint64_t x = 0;
    const auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), x);
    if (ec != std::errc{} || end != v->data() + v->size() || v->empty())
      fail("option ", name, ": '", *v, "' is not a whole number >= 0");
    return x;
  }

  /// A flag: absent, "0" or "false" is off; "", "1" or "true" is on; anything else raises.
  [[nodiscard]] bool flag(std::string_view name) const {
    const std::string* v = find(name);
    if (!v || *v == "0" || *v == "false") return false;
    if (v->empty() || *v == "1" || *v == "true") return true;
    fail("option ", name, ": '", *v, "' is not a flag value (true, false, 1 or 0)");
  }

  /// One of `choices` ('|'-separated), or `fallback` when absent; raises naming the choices.
  [[nodiscard]] std::string_view choice(std::string_view name, std::string_view choices,
                                        std::string_view fallback) const {
    const std::string_view v = text(name, fallback);
    for (const std::string_view c : split_choices(choices))
      if (c == v) return v;
    fail("option ", name, ": '", v, "' is not one of ", choices);
  }

private:
  [[nodiscard]] const std::string* find(std::string_view name) const {
    for (const auto& [key, text] : values_)
      if (key == name) return &text;
    return nullptr;
  }

  std::vector<std::pair<std::string, std::string>> values_;
};

/// One parameter of a configured method, as tools report it.
struct method_param {
  std::string_view name;
  std::variant<bool, std::uint64_t, double, std::string_view> value;
};

/// Where a compressor's header registers its descriptor: `method_slot<id>::type` for the
/// descriptor whose codec id is `id`. compressors/list.hpp collects the slots that are filled; a
/// second compressor claiming an id fails to compile as a redefinition.
template <std::uint8_t Id>
struct method_slot {};

}  // namespace bellows
