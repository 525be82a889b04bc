// SPDX-License-Identifier: Apache-2.0
// What top-k and rand-k share: SPEC.md's rule for k, their payload (ascending indices, then
// values), its complete validation, and the per-layer state of a step whose error-memory update
// waits until every rank's input proved finite.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "bellows/concepts.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/gather_buffer.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/feedback/error_feedback.hpp"

namespace bellows::detail {

/// k for a layer (SPEC.md, shared rules): `count` when it is > 0 (at most n), else
/// clamp(ceil(ratio * n), 1, n) with ratio in (0, 1]; 0 for a layer with no elements. The
/// product is computed in double and reduced by a relative 2^-50 before the ceiling, so that a
/// ratio written in decimal gives the k of that decimal (0.07 of 100 elements is 7, though the
/// double nearest 0.07 exceeds it). Raises bellows::error naming the layer and the value for a
/// negative count or a ratio outside (0, 1].
[[nodiscard]] inline std::size_t kept_count(std::string_view who, const layer_info& layer,
                                            double ratio, std::int64_t count) {
  const std::size_t n = layer.size();
  BELLOWS_EXPECTS(count >= 0, who, ": layer '", layer.name, "': k must not be negative, got ", count);
  BELLOWS_EXPECTS(count > 0 || (ratio > 0 && ratio <= 1), who, ": layer '", layer.name,
                  "': ratio must be in (0, 1], got ", ratio);
  if (n == 0) return 0;
  if (count > 0) return std::min(n, static_cast<std::size_t>(count));
  const double product = ratio * static_cast<double>(n);
  const double k = std::ceil(product - product * 0x1p-50);
  return std::clamp(static_cast<std::size_t>(k), std::size_t{1}, n);
}

/// Sparse payloads carry 64-bit indices for layers of 2^32 elements or more.
[[nodiscard]] constexpr bool wide_indices(std::uint64_t n) noexcept { return (n >> 32) != 0; }

/// Bytes of a sparse payload of `count` entries for a layer of n elements.
[[nodiscard]] constexpr std::size_t sparse_payload_bytes(std::uint64_t n, std::size_t count) noexcept {
  const std::size_t indices = wide_indices(n) ? wire::array_end<std::uint64_t>(0, count)
                                              : wire::array_end<std::uint32_t>(0, count);
  return wire::header_bytes + wire::padded(wire::array_end<float>(indices, count));
}

/// Writes a sparse payload into `out`. `select(begin)` runs the selection; once it knows the
/// count it calls begin(count), which writes the header and returns Arrays<Index>{index, value}
/// over the payload's arrays for it to fill. `select` returns false for non-finite input
/// (whether or not it called begin), and the payload is then flagged non-finite with no entries.
template <template <class> class Arrays, class Select>
[[nodiscard]] std::span<std::byte> write_sparse(std::span<std::byte> out, wire::codec codec,
                                                std::uint64_t n, Select&& select) {
  wire::header h{};
  h.codec = codec;
  h.n = n;
  if (wide_indices(n)) h.flags |= wire::flag::index64;
  std::optional<wire::writer> w;
  auto begin = [&]<class Index>(std::size_t count, Index*) {
    h.count = count;
    w.emplace(out, h);
    const std::span<Index> index = w->template array<Index>(count);
    return Arrays<Index>{index, w->template array<float>(count)};
  };
  bool finite = true;
  if (wide_indices(n))
    finite = select([&](std::size_t count) { return begin(count, static_cast<std::uint64_t*>(nullptr)); });
  else
    finite = select([&](std::size_t count) { return begin(count, static_cast<std::uint32_t*>(nullptr)); });
  if (!finite) {
    h.count = 0;
    h.flags |= wire::flag::non_finite;
    w.emplace(out, h);
  }
  return w->finish();
}

/// A validated sparse payload: its status and, when ok, its entries.
struct sparse_entries {
  step_status status = step_status::ok;
  std::span<const std::uint32_t> index32;  ///< used when the layer has fewer than 2^32 elements
  std::span<const std::uint64_t> index64;  ///< used otherwise
  std::span<const float> value;
};

/// Reads a sparse payload of `codec` for `layer` and validates all of it before anything is
/// used: the header (layer size, index width, param 0), the count (in [min_count, max_count];
/// 0 for a payload flagged non-finite), the arrays against the body, indices strictly ascending
/// and below n, values finite. Raises bellows::wire_error naming the layer and the field.
[[nodiscard]] inline sparse_entries read_sparse(std::span<const std::byte> payload, wire::codec codec,
                                                const layer_info& layer, std::uint64_t min_count,
                                                std::uint64_t max_count) {
  wire::reader r(payload, codec);
  const wire::header& h = r.head();
  const char* name = wire::to_string(codec);
  const std::uint64_t n = layer.size();
  const bool wide = (h.flags & wire::flag::index64) != 0;
  if (h.n != n || h.param != 0 || wide != wide_indices(n))
    fail<wire_error>(name, ": payload for ", h.n, " elements (param ", h.param, ", ",
                     wide ? 64 : 32, "-bit indices) where layer '", layer.name, "' has ", n);
  if (h.flags & wire::flag::non_finite) {
    if (h.count != 0)
      fail<wire_error>(name, ": payload flagged non-finite carries ", h.count,
                       " entries for layer '", layer.name, "'");
    r.finish();
    return {step_status::non_finite, {}, {}, {}};
  }
  if (h.count < min_count || h.count > max_count) {
    if (min_count == max_count)
      fail<wire_error>(name, ": payload of ", h.count, " entries where layer '", layer.name,
                       "' expects ", min_count);
    fail<wire_error>(name, ": payload of ", h.count, " entries where layer '", layer.name,
                     "' expects ", min_count, " to ", max_count);
  }
  sparse_entries e;
  auto check = [&](auto index) {
    std::uint64_t next = 0;  // the smallest index allowed at this position
    for (std::size_t j = 0; j < index.size(); ++j) {
      if (index[j] < next || index[j] >= n)
        fail<wire_error>(name, ": entry ", j, " of layer '", layer.name, "' has index ", index[j],
                         " (indices must ascend strictly and stay below ", n, ")");
      next = std::uint64_t{index[j]} + 1;
    }
  };
  if (wide) {
    e.index64 = r.array<std::uint64_t>(h.count);
    e.value = r.array<float>(h.count);
    r.finish();
    check(e.index64);
  } else {
    e.index32 = r.array<std::uint32_t>(h.count);
    e.value = r.array<float>(h.count);
    r.finish();
    check(e.index32);
  }
  for (std::size_t j = 0; j < e.value.size(); ++j)
    if (!std::isfinite(e.value[j]))
      fail<wire_error>(name, ": entry ", j, " of layer '", layer.name, "' has the non-finite value ",
                       e.value[j], " in a payload not flagged non-finite");
  return e;
}

/// The header of a payload written here or validated before.
[[nodiscard]] inline wire::header header_of(std::span<const std::byte> payload) noexcept {
  wire::header h;
  std::memcpy(static_cast<void*>(&h), payload.data(), sizeof h);
  return h;
}

/// The per-layer state top-k and rand-k share. `memory` is e; a step writes its successor into
/// `staged_` and its payload into `payload_`, and commit_step makes them current once every
/// rank's input proved finite.
struct sparse_state {
  layer_info layer;
  std::uint64_t step = 0;
  error_memory memory;  ///< the error memory e (no values when feedback is none)

protected:
  error_memory staged_;
  std::vector<std::uint64_t> payload_;
  std::size_t payload_bytes_ = 0;
  bool pending_ = false;  ///< a step was staged with finite input and not yet committed
  gather_buffer gathered_;

  friend struct sparse_steps;
};

/// The steps of sparse_state, written once for both compressors.
struct sparse_steps {
  /// Sizes the memories for `kind` on a fresh state; on a used one, checks that the kind is the
  /// one it was made with (a state keeps its memory across compressors of other ratios).
  static void fit_memory(sparse_state& st, feedback kind, std::string_view who) {
    const std::size_t n = st.layer.size();
    if (st.memory.kind() == kind && st.memory.values().size() == (kind == feedback::none ? 0 : n)) return;
    BELLOWS_EXPECTS(st.step == 0 && st.memory.kind() == feedback::none && st.memory.values().empty(),
                    who, ": layer '", st.layer.name, "' has a state made with feedback ",
                    to_string(st.memory.kind()), ", used by a compressor with feedback ",
                    to_string(kind));
    st.memory = error_memory(kind, n);
    st.staged_ = error_memory(kind, n);
  }

  /// The memory e and the buffer its successor goes to; both empty without feedback.
  struct compensation {
    std::span<const float> memory;
    std::span<float> staged;
  };
  [[nodiscard]] static compensation compensation_of(sparse_state& st) noexcept {
    if (!st.memory.enabled()) return {};
    return {st.memory.values(), st.staged_.values()};
  }

  /// Stages a step: write(compensation, out) writes this rank's payload, of at most `bytes`,
  /// into `out`; it is kept in the state until the next stage. The step may be committed unless
  /// the payload is flagged non-finite.
  template <class Write>
  static std::span<const std::byte> stage(sparse_state& st, std::size_t bytes, Write&& write) {
    st.payload_.resize((bytes + 7) / 8);
    const std::span<const std::byte> payload =
        write(compensation_of(st), std::as_writable_bytes(std::span(st.payload_)));
    st.payload_bytes_ = payload.size();
    st.pending_ = (header_of(payload).flags & wire::flag::non_finite) == 0;
    return payload;
  }

  /// Records a step staged without a payload (its values went to an allreduce buffer).
  static void staged_without_payload(sparse_state& st, bool finite) noexcept {
    st.payload_bytes_ = 0;
    st.pending_ = finite;
  }

  [[nodiscard]] static gather_buffer& gathered(sparse_state& st) noexcept { return st.gathered_; }

  /// The error-memory update of the staged step becomes current and the step counter advances.
  static void commit(sparse_state& st, std::string_view who) {
    BELLOWS_EXPECTS(st.pending_, who, ": layer '", st.layer.name,
                    "' has no staged step with finite input to commit");
    if (st.memory.enabled()) std::swap(st.memory, st.staged_);
    ++st.step;
    st.pending_ = false;
  }

  /// Forgets the staged step (some rank's input was non-finite).
  static void discard(sparse_state& st) noexcept { st.pending_ = false; }

  /// Checkpoint: the step counter and the error memory.
  static void save(const sparse_state& st, checkpoint_writer& out) {
    out.put(st.step);
    out.put_array(std::span<const float>(st.memory.values()));
  }
  static void load(sparse_state& st, checkpoint_reader& in, std::string_view who) {
    const auto step = in.get<std::uint64_t>(who);
    in.get_array(st.memory.values(), who);
    st.step = step;
    st.pending_ = false;
  }
};

}  // namespace bellows::detail
