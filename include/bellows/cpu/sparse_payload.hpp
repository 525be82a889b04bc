// SPDX-License-Identifier: Apache-2.0
// The CPU's sparse payloads (plan/sparse.hpp: header, ascending indices, then their values) at the
// level the code written once over executors asks for (compressors/detail/sparse_codec.hpp):
// top-k's selection and rand-k's draw written into a payload's storage, top-k's selection written
// densely, the header, and the average of what a step gathered. cuda/sparse_payload.cuh is the
// device's. The words a selection reports in (plan/sparse.hpp) live in its workspace, on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "bellows/core/philox.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/cpu/payload_slots.hpp"
#include "bellows/cpu/sample.hpp"
#include "bellows/cpu/select.hpp"
#include "bellows/cpu/sparse.hpp"
#include "bellows/plan/payload_slots.hpp"
#include "bellows/plan/sample.hpp"
#include "bellows/plan/select.hpp"
#include "bellows/plan/sparse.hpp"

namespace bellows::cpu {

/// The payload slots of sparse payloads: cpu::payload_slots, sending each payload at its own
/// length, with every rank's count and entries for the average.
class sparse_slots : public payload_slots<sparse_view<std::uint32_t>> {
public:
  /// The step's allgather of this rank's payload, as long as its header says.
  template <class Coll>
  void gather(Coll& coll, std::size_t rank) {
    const std::span<std::byte> payload = mine(rank);
    coll.allgather(std::span<const std::byte>(payload.first(wire::header_bytes + header(payload).body_bytes)),
                   gathered());
  }
  /// Rank r's count as gathered (0 for a flagged payload).
  [[nodiscard]] std::size_t count(std::size_t r) const { return header(block(r)).count; }
  /// Keeps rank r's count for kept(), read now: a caller's gathered payloads (view) may be
  /// reused before the step concludes.
  void keep_count(std::size_t r) { kept_ = count(r); }
  [[nodiscard]] std::size_t kept() const noexcept { return kept_; }

  /// Every rank's entries, read from validated payloads with Index-wide indices, and the cursors
  /// scatter_average needs for n elements (no allocation once the slots have held as many ranks).
  template <class Index>
  [[nodiscard]] std::span<const sparse_view<Index>> entries(std::size_t n) {
    std::vector<sparse_view<Index>>& views = views_of<Index>();
    views.resize(ranks());
    for (std::size_t r = 0; r < ranks(); ++r) {
      const auto [index, value] = payload_entries<Index>(block(r).data() + wire::header_bytes, count(r));
      views[r] = {index, value};
    }
    cursors_.resize(scatter_average_cursors(ranks(), n));
    return views;
  }
  [[nodiscard]] std::span<std::size_t> cursors() noexcept { return cursors_; }

private:
  /// The views of 32-bit payloads live in the base's parts, those of 64-bit ones here.
  template <class Index>
  [[nodiscard]] std::vector<sparse_view<Index>>& views_of() noexcept {
    if constexpr (sizeof(Index) == 4)
      return parts_storage();
    else
      return wide_;
  }
  [[nodiscard]] static wire::header header(std::span<const std::byte> payload) noexcept {
    wire::header h;
    std::memcpy(static_cast<void*>(&h), payload.data(), sizeof h);
    return h;
  }
  std::vector<sparse_view<std::uint64_t>> wide_;
  std::vector<std::size_t> cursors_;
  std::size_t kept_ = 0;
};

/// Sizes a layer's workspace for the plan of its selection or its draw.
template <class Workspace, class Plan>
void fit_workspace(executor& /*exec*/, Workspace& ws, const Plan& plan) {
  ws.fit(plan);
}

/// The k = plan.k entries of largest magnitude of v = g (or g + e; see select_top), written into
/// `body`, a payload's storage after its header, with room for plan.max_count entries; with `e`,
/// the residual into `staged`. Reports the count and whether v was finite.
inline sparse_words<std::uint64_t> select_into_payload(executor& exec, const select_plan& plan,
                                                       const philox::stream& draw, std::span<const float> g,
                                                       std::span<const float> e, std::span<float> staged,
                                                       select_workspace& ws, std::span<std::byte> body) {
  const auto select = [&]<class Index>(Index) {
    return select_top(exec, plan, draw, g, e, staged, ws, [&](std::size_t count) {
      ws.selected = count;
      const auto [index, value] = payload_entries<Index>(body.data(), count);
      return sparse_arrays<Index>{index, value};
    });
  };
  ws.selected = 0;
  const bool finite = wide_indices(plan.n) ? select(std::uint64_t{}) : select(std::uint32_t{});
  ws.non_finite = finite ? 0 : 1;
  return {&ws.non_finite, &ws.selected};
}

/// The same selection written densely into `dense` (n floats: v where kept, else 0) by
/// select_top_dense's one pass; `body` is the device's scratch and unused here.
inline sparse_words<std::uint64_t> select_into_dense(executor& exec, const select_plan& plan,
                                                     const philox::stream& draw, std::span<const float> g,
                                                     std::span<const float> e, std::span<float> staged,
                                                     select_workspace& ws, std::span<std::byte> /*body*/,
                                                     std::span<float> dense) {
  const std::optional<std::size_t> kept = select_top_dense(exec, plan, draw, g, e, staged, ws, dense);
  ws.selected = kept.value_or(0);
  ws.non_finite = kept ? 0 : 1;
  return {&ws.non_finite, &ws.selected};
}

/// Rand-k's draw of `draw`'s stream (draw_sample), then its k entries of scale * v, v = g (or
/// g + e, the residual into `staged`), written into `body` (gather_sample). Reports whether v
/// was finite.
inline sparse_words<std::uint64_t> draw_into_payload(executor& exec, const sample_plan& plan,
                                                     const philox::stream& draw, sample_workspace& ws,
                                                     std::span<const float> g, std::span<const float> e,
                                                     std::span<float> staged, std::span<std::byte> body, float scale) {
  draw_sample(exec, plan, draw, ws);
  const auto gather = [&]<class Index>(Index) {
    const auto [index, value] = payload_entries<Index>(body.data(), plan.k);
    return gather_sample(exec, plan, ws, g, e, staged, sparse_arrays<Index>{index, value}, scale);
  };
  const bool finite = wide_indices(plan.n) ? gather(std::uint64_t{}) : gather(std::uint32_t{});
  ws.non_finite = finite ? 0 : 1;
  return {&ws.non_finite};
}

/// Writes the header of the payload a selection reported in `words` (shape.header with its
/// count, or the empty header flagged non-finite) and zeroes the padding after the entries:
/// what wire::writer::finish writes.
inline void finish_payload(executor& /*exec*/, std::span<std::byte> payload, const sparse_payload& shape,
                           sparse_words<std::uint64_t> words) {
  wire::header h = shape.header;
  if (words.count != nullptr) h.count = *words.count;
  if (*words.non_finite != 0) {
    h.flags |= wire::flag::non_finite;
    h.count = 0;
  }
  const std::size_t bytes = sparse_payload_bytes(h.n, h.count);
  h.body_bytes = bytes - wire::header_bytes;
  std::memcpy(payload.data(), &h, wire::header_bytes);
  const std::size_t end = wire::header_bytes + entry_bytes(h.n) * h.count;
  std::memset(payload.data() + end, 0, bytes - end);
}

/// After check_payloads found every gathered payload good and finite: out = (1/W) * the sum in
/// rank order of their entries scattered into zeros (scatter_average).
inline void average_payloads(executor& exec, sparse_slots& slots, const sparse_payload& shape, std::span<float> out) {
  const auto average = [&]<class Index>(Index) {
    const std::span<const sparse_view<Index>> parts = slots.entries<Index>(out.size());
    scatter_average(exec, out, parts, slots.cursors());
  };
  if (wide_indices(shape.header.n))
    average(std::uint64_t{});
  else
    average(std::uint32_t{});
}

}  // namespace bellows::cpu

namespace bellows {
template <>
struct payload_slots_of<cpu::executor, sparse_payload> {
  using type = cpu::sparse_slots;
};
template <>
struct sparse_count_of<cpu::executor> {
  using type = std::uint64_t;
};
template <>
struct select_workspace_of<cpu::executor> {
  using type = cpu::select_workspace;
};
template <>
struct sample_workspace_of<cpu::executor> {
  using type = cpu::sample_workspace;
};
}  // namespace bellows
