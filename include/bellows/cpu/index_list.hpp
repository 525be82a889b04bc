// SPDX-License-Identifier: Apache-2.0
// Top-k's cyclic leader on the CPU (plan/index_list.hpp lays out its list): the leader's
// selection written as a list, the summed list checked, the values at its indices taken from
// every rank's compensated gradient, and the average scattered back. cuda/index_list.cuh is the
// device's, with the same arguments and bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "bellows/core/philox.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/cpu/select.hpp"
#include "bellows/cpu/sparse_payload.hpp"
#include "bellows/plan/index_list.hpp"
#include "bellows/plan/select.hpp"
#include "bellows/plan/sparse.hpp"

namespace bellows::cpu {

/// The leader's top plan.k (to plan.max_count) of |m|, m as it is, selected into `scratch` (a
/// payload body's storage) and written into `list` as its count and indices; `list` holds zeros
/// past its verdict before. Nothing when m is not finite: the verdict says so.
inline void select_index_list(executor& exec, const select_plan& plan, const philox::stream& draw,
                              std::span<const float> m, select_workspace& ws, std::span<std::byte> scratch,
                              std::span<float> list) {
  const auto words = select_into_payload(exec, plan, draw, m, {}, {}, ws, scratch);
  if (*words.non_finite != 0) return;
  const index_list_layout at(plan.n, plan.max_count);
  const std::size_t count = *words.count;
  at.put(list.data() + at.count_at(), count);
  const auto write = [&]<class Index>(Index) {
    const auto index = payload_entries<Index>(scratch.data(), count).first;
    for (std::size_t j = 0; j < count; ++j) at.put(list.data() + at.entry_at(j), index[j]);
  };
  if (wide_indices(plan.n))
    write(std::uint64_t{});
  else
    write(std::uint32_t{});
}

/// After the allreduce of the lists: the verdict into `verdict`, and when it is 0 the count that
/// `check(list)` (the host's validation, which raises bellows::wire_error) returns into `count`.
/// `malformed` stays 0: the CPU raises at once.
template <class Slots, class Check>
[[nodiscard]] index_list_words<std::uint64_t> check_index_list(executor& /*exec*/, Slots& /*slots*/,
                                                               std::span<const float> list,
                                                               const index_list_layout& /*at*/, std::uint64_t /*n*/,
                                                               std::size_t /*least*/, float& verdict,
                                                               unsigned& malformed, std::uint64_t& count,
                                                               Check&& check) {
  verdict = list[0];
  malformed = 0;
  count = verdict == 0.0f ? check(list) : 0;
  return {&verdict, &count};
}

/// A list the device found malformed, after the wait: the CPU raised in check_index_list already.
template <class Check>
void report_index_list(executor& /*exec*/, std::span<const float> /*list*/, unsigned /*malformed*/,
                       Check&& /*check*/) noexcept {}

/// values[j] = from[index j] for the list's entries j < count, then zeroed[index j] = 0 where
/// `zeroed` is not empty (it may be `from`); values[j] = 0 past the count, and everywhere when
/// *skip is not 0.
inline void take_at_list(executor& exec, std::span<float> values, std::span<const float> from, std::span<float> zeroed,
                         std::span<const float> list, const index_list_layout& at, index_list_words<std::uint64_t> w) {
  fill(exec, values, 0.0f);
  if (*w.skip != 0.0f) return;
  for (std::size_t j = 0; j < *w.count; ++j) {
    std::uint64_t i = 0;
    (void)at.get(list.data() + at.entry_at(j), i);  // checked
    values[j] = from[i];
    if (!zeroed.empty()) zeroed[i] = 0.0f;
  }
}

/// out = 0 but out[index j] = sums[j] / d for the entries j < count; nothing when *skip is not 0.
inline void scatter_list(executor& exec, std::span<float> out, std::span<const float> list, const index_list_layout& at,
                         std::span<const float> sums, float d, index_list_words<std::uint64_t> w) {
  if (*w.skip != 0.0f) return;
  fill(exec, out, 0.0f);
  for (std::size_t j = 0; j < *w.count; ++j) {
    std::uint64_t i = 0;
    (void)at.get(list.data() + at.entry_at(j), i);  // checked
    out[i] = sums[j] / d;
  }
}

}  // namespace bellows::cpu
