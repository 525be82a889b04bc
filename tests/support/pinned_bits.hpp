// SPDX-License-Identifier: Apache-2.0
// Today's bits of every compressor, pinned (issue #30): for each example configuration of each
// method of compressors/list.hpp, on three seeded layers and on W = 1, 2 and 3 ranks, one 64-bit
// FNV-1a digest of everything a few steps leave behind on every rank, held to a table written
// in the test. tests/compressors/test_pinned_bits.cpp pins the CPU compressors and
// tests/cuda/test_pinned_bits.cu the device ones; this file holds what both use: the digest,
// a collective that digests what each rank sends, the layers and their inputs, the lookup of a
// table (and the mode that prints one), and the run on the CPU.
#pragma once

#include <bellows/collectives/local.hpp>
#include <bellows/compressors/list.hpp>
#include <bellows/concepts.hpp>
#include <bellows/core/checkpoint.hpp>
#include <bellows/core/gather_buffer.hpp>
#include <bellows/core/shape.hpp>
#include <bellows/core/traffic.hpp>
#include <bellows/core/wire.hpp>
#include <bellows/cpu/executor.hpp>

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "random.hpp"

namespace bellows::testing {

/// 64-bit FNV-1a over the bytes added, in the order they are added.
class fnv1a {
public:
  void add(std::span<const std::byte> bytes) noexcept {
    for (const std::byte b : bytes) {
      h_ ^= std::to_integer<std::uint64_t>(b);
      h_ *= 0x100000001b3;
    }
  }
  void add(std::uint64_t v) noexcept { add(std::as_bytes(std::span(&v, 1))); }
  /// The element count, then the elements' bytes: where one array ends and the next begins
  /// counts too.
  template <class T>
  void add_array(std::span<const T> values) noexcept {
    add(std::uint64_t{values.size()});
    add(std::as_bytes(values));
  }
  [[nodiscard]] std::uint64_t value() const noexcept { return h_; }

private:
  std::uint64_t h_ = 0xcbf29ce484222325;
};

/// The part of a gathered block that is sent: a block that starts with a payload header
/// (core/wire.hpp) up to the end of the body the header counts, any other block whole. A device
/// compressor gathers whole slots of its largest payload; the bytes of a slot past its payload
/// are no part of it (nobody reads them, and nothing writes them).
[[nodiscard]] inline std::span<const std::byte> sent_part(std::span<const std::byte> block) noexcept {
  if (block.size() < wire::header_bytes) return block;
  wire::header h;
  std::memcpy(static_cast<void*>(&h), block.data(), sizeof h);
  if (h.magic != wire::magic || h.body_bytes > block.size() - wire::header_bytes) return block;
  return block.first(wire::header_bytes + h.body_bytes);
}

/// A Collective over `inner` that digests everything this rank hands it before passing it on:
/// the values of each allreduce_sum before the sum, and this rank's block of each allgather
/// (sent_part). One per rank, as the collective it wraps; the digest is the rank's own, so it
/// does not depend on the order in which the ranks arrive.
template <Collective Inner>
class recording {
public:
  recording(Inner& inner, fnv1a& sent) : inner_(&inner), sent_(&sent) {}

  [[nodiscard]] std::size_t rank() const { return inner_->rank(); }
  [[nodiscard]] std::size_t size() const { return inner_->size(); }

  void allreduce_sum(std::span<float> v) {
    sent_->add(std::uint64_t{'r'});
    sent_->add_array(std::span<const float>(v));
    inner_->allreduce_sum(v);
  }
  void allgather(std::span<const std::byte> mine, gather_buffer& out) {
    sent_->add(std::uint64_t{'g'});
    sent_->add_array(sent_part(mine));
    inner_->allgather(mine, out);
  }

private:
  Inner* inner_;
  fnv1a* sent_;
};
static_assert(Collective<recording<archetypes::collective>>);

/// What one rank's run is digested into: `sent`, by the recording collective during the steps;
/// `kept`, each step's status, traffic and output, then the error memory and the checkpoint
/// record after the last step.
struct rank_digest {
  fnv1a sent, kept;

  void step(const reduce_result& r, std::span<const float> out) {
    kept.add(std::uint64_t{static_cast<std::uint8_t>(r.status)});
    kept.add(r.sent.bytes);
    kept.add(r.sent.elements);
    kept.add(r.sent.kept);
    kept.add_array(out);
  }
  void finish(std::span<const float> memory, std::span<const std::byte> record) {
    kept.add_array(memory);
    kept.add_array(record);
  }
};

/// The digest of a run: each rank's two digests, in rank order.
[[nodiscard]] inline std::uint64_t digest_of(std::span<const rank_digest> ranks) {
  fnv1a all;
  for (const rank_digest& r : ranks) {
    all.add(r.sent.value());
    all.add(r.kept.value());
  }
  return all.value();
}

/// The steps of every run.
inline constexpr std::size_t pinned_steps = 4;
/// The rank counts of every run; a table row holds one digest for each, in this order.
inline constexpr std::size_t pinned_ranks[] = {1, 2, 3};

/// The layers: a vector, a matrix, and a matrix of 111 elements, which 2 does not divide. Each
/// compressor compresses one at least: PowerSGD averages 1-D layers uncompressed, and at rank 2
/// or 4 the 37 x 3 matrix too (its factors would not be smaller), but compresses 40 x 25 at
/// every rank of its examples.
inline const std::array<layer_info, 3> pinned_layers = {
    layer_info{0, "vector", shape{1000}},
    layer_info{1, "matrix", shape{40, 25}},
    layer_info{2, "odd", shape{37, 3}},
};

/// The input of `rank` at `step` on a layer: seeded normals, different per layer, rank and step.
[[nodiscard]] inline std::vector<float> pinned_gradient(const layer_info& layer, std::size_t rank, std::size_t step) {
  return normal_floats(layer.size(), 1'000'003 * std::uint64_t{layer.id} + 7'919 * step + rank + 1);
}

/// A row of a table of pinned digests: example `example` of method `method` on layer `layer`,
/// the digest for each of pinned_ranks.
/// Example I of method M, a case of the pinned tests.
template <class M, std::size_t I>
struct pinned_case {
  using method = M;
  static constexpr typename M::params params = M::examples[I];
  static constexpr std::size_t example = I;
};

struct pinned_row {
  std::string_view method;
  std::size_t example;
  std::string_view layer;
  std::uint64_t digest[std::size(pinned_ranks)];
};

/// True when the environment sets BELLOWS_PRINT_DIGESTS (to anything but "0"): the tests then
/// print each row of their table as it is computed, instead of checking it, for pasting in after
/// a deliberate change of the bits.
[[nodiscard]] inline bool printing_digests() {
  const char* v = std::getenv("BELLOWS_PRINT_DIGESTS");
  return v != nullptr && std::string_view(v) != "0" && !std::string_view(v).empty();
}

/// Checks the digests of example `example` of `method` on `layer` (one per rank count of
/// pinned_ranks) against `table`, naming what differs; prints the row instead in printing mode.
inline void check_pinned(std::span<const pinned_row> table, std::string_view method, std::size_t example,
                         std::string_view layer, std::span<const std::uint64_t, std::size(pinned_ranks)> got) {
  if (printing_digests()) {
    std::printf("    {\"%.*s\", %zu, \"%.*s\", {", static_cast<int>(method.size()), method.data(), example,
                static_cast<int>(layer.size()), layer.data());
    for (std::size_t i = 0; i < got.size(); ++i)
      std::printf("%s0x%016llxu", i == 0 ? "" : ", ", static_cast<unsigned long long>(got[i]));
    std::printf("}},\n");
    return;
  }
  const std::string where =
      std::string(method) + " example " + std::to_string(example) + ", layer " + std::string(layer);
  const pinned_row* row = nullptr;
  for (const pinned_row& r : table)
    if (r.method == method && r.example == example && r.layer == layer) row = &r;
  if (row == nullptr) {
    FAIL_CHECK("no pinned digests for ", where, " (BELLOWS_PRINT_DIGESTS=1 prints them)");
    return;
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    char want[24], have[24];
    std::snprintf(want, sizeof want, "0x%016llx", static_cast<unsigned long long>(row->digest[i]));
    std::snprintf(have, sizeof have, "0x%016llx", static_cast<unsigned long long>(got[i]));
    CHECK_MESSAGE(got[i] == row->digest[i], where, ", W = ", pinned_ranks[i], ": digest ", have,
                  " where the table pins ", want);
  }
}

/// Checks that `table` holds exactly one row for each example of each method of the list for
/// which pinned(std::type_identity<M>{}) is true, and each pinned layer, and no other row.
template <class... Methods, class Pinned>
void check_rows(std::span<const pinned_row> table, method_list<Methods...> methods, Pinned pinned) {
  std::size_t expected = 0;
  for_each_method(methods, [&]<class M>(std::type_identity<M> m) {
    if (!pinned(m)) return;
    for (std::size_t i = 0; i < std::size(M::examples); ++i)
      for (const layer_info& layer : pinned_layers) {
        std::size_t rows = 0;
        for (const pinned_row& r : table) rows += r.method == M::name && r.example == i && r.layer == layer.name;
        CHECK_MESSAGE(rows == 1, M::name, " example ", i, ", layer ", layer.name, ": ", rows, " rows");
        ++expected;
      }
  });
  CHECK_MESSAGE(table.size() == expected, "the table has ", table.size(), " rows for ", expected,
                " examples and layers: some row names none");
}

/// The digest of `pinned_steps` steps of M's compressor with `params` on the CPU, one executor
/// thread per rank, on `ranks` ranks of the local collective.
template <class M>
[[nodiscard]] std::uint64_t digest_on_cpu(const typename M::params& params, const layer_info& layer,
                                          std::size_t ranks) {
  std::vector<rank_digest> digests(ranks);
  collectives::local_group group(ranks);
  group.run([&](collectives::local& comm) {
    rank_digest& d = digests[comm.rank()];
    cpu::executor exec(1);
    auto c = M::make(params, exec);
    auto st = c.make_state(layer);
    recording<collectives::local> coll(comm, d.sent);
    for (std::size_t s = 0; s < pinned_steps; ++s) {
      std::vector<float> g = pinned_gradient(layer, comm.rank(), s);
      const reduce_result r = c.reduce(st, std::span<float>(g), coll);
      d.step(r, g);
    }
    std::span<const float> memory;
    if constexpr (requires { st.memory.values(); })
      memory = st.memory.values();  // an error_memory
    else if constexpr (requires { st.memory.span(); })
      memory = std::as_const(st.memory).span();  // a host float_array (PowerSGD)
    checkpoint_writer record;
    if constexpr (CheckpointedCompressor<decltype(c)>) c.save(st, record);
    d.finish(memory, record.bytes());
  });
  return digest_of(digests);
}

}  // namespace bellows::testing
