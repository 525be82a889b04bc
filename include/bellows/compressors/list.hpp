// SPDX-License-Identifier: Apache-2.0
// The list of compressors: one #include line each. Including a compressor's header registers its
// method descriptor under its wire codec id (core/method.hpp), and `compressor_methods` holds
// every registered descriptor in the order of their ids. bellows-bench, the Python hook, the test
// suites and the fuzz target read this list; a new compressor joins them all by its line here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "bellows/core/method.hpp"

#include "bellows/compressors/identity.hpp"
#include "bellows/compressors/topk.hpp"
#include "bellows/compressors/randk.hpp"
#include "bellows/compressors/qsgd.hpp"
#include "bellows/compressors/powersgd.hpp"
#include "bellows/compressors/signsgd.hpp"

namespace bellows {

/// A list of method descriptors.
template <class... Methods>
struct method_list {
  static constexpr std::size_t size = sizeof...(Methods);
};

namespace detail {

template <std::uint8_t Id>
concept filled_slot = requires {
  typename method_slot<Id>::type;
};

template <class List, std::uint8_t Id>
struct append_slot {
  using type = List;
};
template <class... Methods, std::uint8_t Id>
  requires filled_slot<Id>
struct append_slot<method_list<Methods...>, Id> {
  using type = method_list<Methods..., typename method_slot<Id>::type>;
};

template <class List, std::size_t Id, std::size_t End>
struct collect_slots {
  using type =
      typename collect_slots<typename append_slot<List, static_cast<std::uint8_t>(Id)>::type, Id + 1, End>::type;
};
template <class List, std::size_t End>
struct collect_slots<List, End, End> {
  using type = List;
};

}  // namespace detail

/// Every compressor included above, by codec id (ids 0 to 31; a compressor of a larger id must raise the bound).
using compressor_methods = detail::collect_slots<method_list<>, 0, 32>::type;

/// Calls f(std::type_identity<M>{}) for each method M of the list, in order.
template <class... Methods, class F>
void for_each_method(method_list<Methods...>, F&& f) {
  (f(std::type_identity<Methods>{}), ...);
}

/// Calls f(std::type_identity<M>{}) for the method of the list called `name` and returns true, or
/// returns false when none is.
template <class... Methods, class F>
bool visit_method(method_list<Methods...>, std::string_view name, F&& f) {
  return ((Methods::name == name ? (f(std::type_identity<Methods>{}), true) : false) || ...);
}

/// The names of the list's methods, separated by ", " (for messages and help).
template <class... Methods>
[[nodiscard]] std::string method_names(method_list<Methods...>) {
  std::string out;
  ((out += (out.empty() ? "" : ", ") + std::string(Methods::name)), ...);
  return out;
}

}  // namespace bellows
