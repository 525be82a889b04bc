// SPDX-License-Identifier: Apache-2.0
// The test cases of every compressor of compressors/list.hpp: one case type per example
// configuration of each method (M::examples), as a std::tuple for doctest's
// TEST_CASE_TEMPLATE_APPLY.
#pragma once

#include <bellows/compressors/list.hpp>

#include <cstddef>
#include <iterator>
#include <tuple>
#include <utility>

namespace bellows::testing {

template <template <class, std::size_t> class Case, class M, std::size_t... I>
std::tuple<Case<M, I>...> cases_of_method(std::index_sequence<I...>);

template <template <class, std::size_t> class Case, class... Methods>
auto cases_of(method_list<Methods...>) -> decltype(std::tuple_cat(
    cases_of_method<Case, Methods>(std::make_index_sequence<std::size(Methods::examples)>{})...));

/// Case<M, I> for example I of every listed method M, in the list's order.
template <template <class, std::size_t> class Case>
using every_example = decltype(cases_of<Case>(compressor_methods{}));

}  // namespace bellows::testing
