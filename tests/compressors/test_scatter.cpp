// SPDX-License-Identifier: Apache-2.0
// The scatter exchange of QSGD, EF-signSGD, top-k and per-rank rand-k (docs/spec.md#scatter-exchange)
// against a reference of both of its stages built by hand on seeded data, over W = 1, 2, 3, 5, 8
// ranks: the layer cut into W chunks of whole blocks (QSGD's and EF-signSGD's buckets, the sparse
// codecs' runs of four), owned by rank (c + id) mod W; each rank's chunk payloads encoded with the
// (chunk, rank) noise (the sparse codecs keeping ceil(k n_c / n) of the chunk); each owner's average
// of the W decoded payloads (0.0f + each in rank order, then / W), plus its memory, encoded once
// with the owner's noise (the sparse codecs keeping as many again); every rank's output the owners'
// decoded chunks (the reference's decoded values are 0.0f + each, so a zero's sign is not
// compared). The reference draws its payloads from the codec's own encode, on a layer of the
// chunk's size and the step's counter (the sparse codecs' from a gather compressor of that count;
// the PayloadCodec calls, checked against their own references elsewhere), and does the cutting,
// the averaging, the memories and the concatenation itself. Also: the same bits on every rank, the memories' telescoping sum, empty
// chunks and n < W, NaN on one rank, a corrupted chunk payload, a checkpoint round trip, a bucket
// of scatter and gather layers against each layer's reduce, the calls and bytes per rank, a
// collective without alltoall, level changes (the owner memory kept or started afresh), and the
// options.
#include <bellows/collectives/counting.hpp>
#include <bellows/collectives/local.hpp>
#include <bellows/compressors/qsgd.hpp>
#include <bellows/compressors/randk.hpp>
#include <bellows/compressors/signsgd.hpp>
#include <bellows/compressors/topk.hpp>
#include <bellows/core/checkpoint.hpp>
#include <bellows/plan/chunks.hpp>
#include <bellows/sync/bucket_exchange.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "../support/bits.hpp"
#include "../support/random.hpp"
#include "../support/resume.hpp"

namespace {

using bellows::collectives::local;
using bellows::collectives::local_group;
using bellows::testing::same_bits;

constexpr bellows::exchange scatter = bellows::exchange::scatter;
using vec = std::vector<float>;

/// Rank r's gradient of a layer of n elements at step t: seeded normals of mixed scales.
vec gradient(std::size_t n, std::size_t rank, std::size_t step) {
  auto g = bellows::testing::normal_floats(n, 104729 * step + 53 * rank + n);
  for (std::size_t i = 0; i < n; ++i) g[i] *= static_cast<float>(1 + (i / 7) % 5);
  return g;
}

template <class P>
std::size_t block_of(const P& p) {
  if constexpr (std::is_same_v<P, bellows::topk_params> || std::is_same_v<P, bellows::randk_params>)
    return 4;
  else if constexpr (requires { p.bits; })
    return p.bucket;
  else
    return p.bucket == 0 ? 1 : p.bucket;
}

/// What the codec's own encode and decode give for a chunk of `in` at step t with Philox rank
/// word `word`: the decoded values (0.0f + each).
template <class C>
vec round_trip(const C& codec, std::uint32_t id, std::uint64_t step, std::span<const float> in, std::uint32_t word) {
  auto st = codec.make_state({id, "chunk", bellows::shape{in.size()}});
  st.step = step;
  std::vector<std::uint64_t> storage((codec.max_payload_bytes(st) + 7) / 8);
  const auto payload = codec.encode(st, in, std::as_writable_bytes(std::span(storage)), word);
  vec out(in.size(), 0.0f);
  REQUIRE(codec.decode_add(st, payload, out) == bellows::step_status::ok);
  return out;
}

/// trip(t, chunk, word): the decoded payload of a chunk of a layer of n elements, at step t, with
/// Philox rank word `word`, from a gather-mode compressor C of `params` (the sparse codecs' of
/// the count ceil(k n_c / n), k the layer's).
template <class C, class P>
auto chunk_trip(const P& params, std::uint32_t id, std::size_t n) {
  if constexpr (std::is_same_v<P, bellows::topk_params> || std::is_same_v<P, bellows::randk_params>) {
    const std::size_t k = bellows::detail::kept_count({id, "layer", bellows::shape{n}}, params.ratio, params.k);
    return [k, n, id, params](std::uint64_t t, std::span<const float> part, std::uint32_t word) {
      P chunk = params;
      chunk.k = static_cast<std::int64_t>(part.empty() ? 0 : (k * part.size() + n - 1) / n);
      chunk.feedback = bellows::feedback::none;
      chunk.exchange = bellows::exchange::gather;
      return round_trip(C(chunk), id, t, part, word);
    };
  } else {
    return [codec = C(params), id](std::uint64_t t, std::span<const float> part, std::uint32_t word) {
      return round_trip(codec, id, t, part, word);
    };
  }
}

struct reference {
  std::vector<vec> outputs;                // [t]: every rank's output at step t
  std::vector<std::vector<vec>> memories;  // [t][r]: rank r's memory after step t
  std::vector<std::vector<vec>> owners;    // [t][r]: rank r's owner memory after step t
};

/// Both stages by hand, with chunks of `block` and the chunks' round trip `trip` (chunk_trip).
template <class Trip>
reference brute_force(const Trip& trip, std::size_t block, std::uint32_t id, std::size_t n, std::size_t ranks,
                      std::size_t steps, bool worker_memory, bool owner_memory) {
  const bellows::chunk_plan plan("test", n, ranks, block, id);
  reference ref;
  std::vector<vec> e(ranks, vec(n, 0.0f)), owner(ranks);
  for (std::size_t r = 0; r < ranks; ++r) owner[r].assign(plan.size(plan.owned_by(r)), 0.0f);
  for (std::size_t t = 0; t < steps; ++t) {
    vec out(n, 0.0f);
    // decoded[c][r]: rank r's decoded payload of chunk c
    std::vector<std::vector<vec>> decoded(ranks, std::vector<vec>(ranks));
    for (std::size_t r = 0; r < ranks; ++r) {
      const vec g = gradient(n, r, t);
      vec m(n);
      for (std::size_t i = 0; i < n; ++i) m[i] = worker_memory ? g[i] + e[r][i] : g[i];
      for (std::size_t c = 0; c < ranks; ++c) {
        const std::span<const float> part = std::span<const float>(m).subspan(plan.begin(c), plan.size(c));
        decoded[c][r] = trip(t, part, bellows::chunk_plan::worker_stream(c, r));
        for (std::size_t i = 0; i < part.size(); ++i) m[plan.begin(c) + i] = part[i] - decoded[c][r][i];
      }
      if (worker_memory) e[r] = m;
    }
    for (std::size_t c = 0; c < ranks; ++c) {
      const std::size_t o = plan.owner(c), len = plan.size(c);
      vec u(len, 0.0f);
      for (std::size_t r = 0; r < ranks; ++r)
        for (std::size_t i = 0; i < len; ++i) u[i] += decoded[c][r][i];
      for (std::size_t i = 0; i < len; ++i) u[i] /= static_cast<float>(ranks);
      if (owner_memory)
        for (std::size_t i = 0; i < len; ++i) u[i] += owner[o][i];
      const vec v = trip(t, u, bellows::chunk_plan::owner_stream(c));
      for (std::size_t i = 0; i < len; ++i) {
        out[plan.begin(c) + i] = v[i];
        if (owner_memory) owner[o][i] = u[i] - v[i];
      }
    }
    ref.outputs.push_back(out);
    ref.memories.push_back(e);
    ref.owners.push_back(owner);
  }
  return ref;
}

/// Equal bits, but for zeros of either sign (the reference's 0.0f + x and a decoder's x).
bool same_values(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == 0.0f && b[i] == 0.0f) && !same_bits(a.subspan(i, 1), b.subspan(i, 1))) return false;
  return true;
}

template <class C, class P>
void check_against_reference(const P& gather_params, bool worker_memory) {
  constexpr std::size_t steps = 4;
  constexpr std::uint32_t id = 3;
  P params = gather_params;
  params.exchange = scatter;
  for (const std::size_t ranks : {1u, 2u, 3u, 5u, 8u})
    for (const std::size_t n : {0u, 1u, 4u, 37u, 1000u}) {
      CAPTURE(ranks);
      CAPTURE(n);
      const reference ref = brute_force(chunk_trip<C>(gather_params, id, n), block_of(params), id, n, ranks, steps,
                                        worker_memory, params.owner_memory);
      std::vector<std::vector<vec>> outputs(steps, std::vector<vec>(ranks)), memories = outputs, owners = outputs;
      local_group(ranks).run([&](local& comm) {
        C c(params);
        auto st = c.make_state({id, "layer", bellows::shape{n}});
        for (std::size_t t = 0; t < steps; ++t) {
          auto g = gradient(n, comm.rank(), t);
          REQUIRE(c.reduce(st, g, comm).status == bellows::step_status::ok);
          outputs[t][comm.rank()] = g;
          memories[t][comm.rank()].assign(st.memory.values().begin(), st.memory.values().end());
          owners[t][comm.rank()].assign(st.owner.values().begin(), st.owner.values().end());
        }
        CHECK(st.step == steps);
      });
      for (std::size_t t = 0; t < steps; ++t)
        for (std::size_t r = 0; r < ranks; ++r) {
          CAPTURE(t);
          CAPTURE(r);
          CHECK(same_bits(outputs[t][r], outputs[t][0]));
          CHECK(same_values(outputs[t][r], ref.outputs[t]));
          if (worker_memory) CHECK(same_values(memories[t][r], ref.memories[t][r]));
          if (params.owner_memory) CHECK(same_values(owners[t][r], ref.owners[t][r]));
          if (!params.owner_memory) CHECK(owners[t][r].empty());
        }
    }
}

}  // namespace

TEST_CASE("scatter: the chunks are whole blocks, balanced, and the owners a rotation") {
  const bellows::chunk_plan p("test", 1037, 5, 100, 7);  // 11 blocks: 3, 2, 2, 2, 2
  CHECK(p.begin(0) == 0);
  CHECK(p.end(0) == 300);
  CHECK(p.end(1) == 500);
  CHECK(p.end(4) == 1037);
  CHECK(p.size(4) == 137);
  CHECK(p.largest() == 300);
  for (std::size_t c = 0; c < 5; ++c) CHECK(p.owned_by(p.owner(c)) == c);
  CHECK(p.owner(0) == 2);
  const bellows::chunk_plan few("test", 3, 8, 1, 0);  // n < W: five empty chunks
  CHECK(few.size(2) == 1);
  CHECK(few.size(3) == 0);
  CHECK(few.end(7) == 3);
  const bellows::chunk_plan none("test", 0, 3, 512, 1);
  CHECK(none.largest() == 0);
  CHECK_THROWS_AS(bellows::chunk_plan("test", 10, 0, 1, 0), bellows::error);
  CHECK_THROWS_AS(bellows::chunk_plan("test", 10, bellows::chunk_plan::max_ranks + 1, 1, 0), bellows::error);
  // no two streams meet: workers' words have bit 30 clear, owners' set, and neither is shared
  CHECK(bellows::chunk_plan::worker_stream(3, 5) != bellows::chunk_plan::worker_stream(5, 3));
  CHECK((bellows::chunk_plan::worker_stream(32767, 32767) & 0x4000'0000u) == 0);
  CHECK(bellows::chunk_plan::owner_stream(32767) != bellows::philox::stream::shared);
  CHECK(bellows::chunk_plan::owner_stream(0) != bellows::chunk_plan::worker_stream(0, 0));
}

TEST_CASE("scatter: QSGD equals the reference of both stages on every rank") {
  SUBCASE("4 bits, buckets of 8") {
    check_against_reference<bellows::qsgd<>>(bellows::qsgd_params{.bits = 4, .bucket = 8}, false);
  }
  SUBCASE("8 bits, buckets of 100, owner memory, a worker memory") {
    check_against_reference<bellows::qsgd<>>(bellows::qsgd_params{.bits = 8,
                                                                  .bucket = 100,
                                                                  .seed = 5,
                                                                  .feedback = bellows::feedback::residual,
                                                                  .owner_memory = true},
                                             true);
  }
  SUBCASE("2 bits, buckets of 3, max-abs") {
    check_against_reference<bellows::qsgd<>>(
        bellows::qsgd_params{.bits = 2, .bucket = 3, .norm = bellows::qsgd_norm::max_abs}, false);
  }
}

TEST_CASE("scatter: EF-signSGD equals the reference of both stages on every rank") {
  SUBCASE("one scale per chunk") { check_against_reference<bellows::signsgd<>>(bellows::signsgd_params{}, true); }
  SUBCASE("buckets of 16") { check_against_reference<bellows::signsgd<>>(bellows::signsgd_params{.bucket = 16}, true); }
  SUBCASE("no memories") {
    check_against_reference<bellows::signsgd<>>(
        bellows::signsgd_params{.bucket = 5, .feedback = bellows::feedback::none, .owner_memory = false}, false);
  }
}

TEST_CASE("scatter: top-k equals the reference of both stages on every rank") {
  SUBCASE("5%, both memories") { check_against_reference<bellows::topk<>>(bellows::topk_params{.ratio = 0.05}, true); }
  SUBCASE("25%, no memories") {
    check_against_reference<bellows::topk<>>(
        bellows::topk_params{.ratio = 0.25, .feedback = bellows::feedback::none, .owner_memory = false}, false);
  }
  SUBCASE("every element, the owner memory alone") {
    check_against_reference<bellows::topk<>>(bellows::topk_params{.ratio = 1.0, .feedback = bellows::feedback::none},
                                             false);
  }
  SUBCASE("a count of 3 elements of a layer") {
    check_against_reference<bellows::topk<>>(bellows::topk_params{.k = 3, .seed = 4}, true);
  }
}

TEST_CASE("scatter: per-rank rand-k equals the reference of both stages on every rank") {
  constexpr bellows::randk_mode per_rank = bellows::randk_mode::per_rank;
  SUBCASE("10%, both memories") {
    check_against_reference<bellows::randk<>>(bellows::randk_params{.ratio = 0.1, .mode = per_rank, .seed = 3}, true);
  }
  SUBCASE("unbiased, no memories") {
    check_against_reference<bellows::randk<>>(bellows::randk_params{.ratio = 0.3,
                                                                    .mode = per_rank,
                                                                    .unbiased = true,
                                                                    .feedback = bellows::feedback::none,
                                                                    .owner_memory = false},
                                              false);
  }
}

TEST_CASE("scatter: the memories telescope: the mean gradient's sum is the outputs' plus mean e plus E") {
  constexpr std::size_t n = 3000, ranks = 3, steps = 10;
  std::vector<std::vector<double>> sums(ranks), rest(ranks);
  std::vector<double> mean_grads(n, 0.0);
  for (std::size_t t = 0; t < steps; ++t)
    for (std::size_t r = 0; r < ranks; ++r) {
      const vec g = gradient(n, r, t);
      for (std::size_t i = 0; i < n; ++i) mean_grads[i] += g[i] / static_cast<double>(ranks);
    }
  local_group(ranks).run([&](local& comm) {
    bellows::signsgd<> c({.bucket = 64, .exchange = scatter});
    auto st = c.make_state({1, "layer", bellows::shape{n}});
    std::vector<double> sent(n, 0.0);
    for (std::size_t t = 0; t < steps; ++t) {
      auto g = gradient(n, comm.rank(), t);
      REQUIRE(c.reduce(st, g, comm).status == bellows::step_status::ok);
      for (std::size_t i = 0; i < n; ++i) sent[i] += g[i];
    }
    sums[comm.rank()] = sent;
    rest[comm.rank()].assign(n, 0.0);
    for (std::size_t i = 0; i < n; ++i) rest[comm.rank()][i] = st.memory.values()[i] / static_cast<double>(ranks);
    const std::size_t c0 = st.chunks.owned_by(comm.rank()), at = st.chunks.begin(c0);
    for (std::size_t i = 0; i < st.chunks.size(c0); ++i) rest[comm.rank()][at + i] += st.owner.values()[i];
  });
  for (std::size_t r = 0; r < ranks; ++r) CHECK(sums[r] == sums[0]);
  double worst = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    double held = 0.0;
    for (std::size_t r = 0; r < ranks; ++r) held += rest[r][i];
    worst = std::max(worst, std::fabs(mean_grads[i] - sums[0][i] - held));
  }
  CHECK(worst < 1e-3);
}

TEST_CASE("scatter: NaN on one rank gives non_finite everywhere and changes nothing, owner memories included") {
  constexpr std::size_t n = 900, ranks = 3;
  const auto check = [&](auto c, std::size_t bad_rank) {
    CAPTURE(bad_rank);
    local_group(ranks).run([&](local& comm) {
      auto st = c.make_state({0, "layer", bellows::shape{n}});
      auto g = gradient(n, comm.rank(), 0);
      REQUIRE(c.reduce(st, g, comm).status == bellows::step_status::ok);
      const vec memory(st.memory.values().begin(), st.memory.values().end());
      const vec owner(st.owner.values().begin(), st.owner.values().end());
      auto h = gradient(n, comm.rank(), 1);
      if (comm.rank() == bad_rank) h[n - 1] = std::numeric_limits<float>::quiet_NaN();
      const auto before = h;
      CHECK(c.reduce(st, h, comm).status == bellows::step_status::non_finite);
      CHECK(same_bits(h, before));
      CHECK(same_bits(st.memory.values(), memory));
      CHECK(same_bits(st.owner.values(), owner));
      CHECK(st.step == 1);
    });
  };
  for (const std::size_t bad_rank : {0u, 2u}) {
    check(bellows::signsgd<>({.bucket = 32, .exchange = scatter}), bad_rank);
    check(bellows::topk<>({.ratio = 0.05, .exchange = scatter}), bad_rank);
  }
}

namespace {

/// A collective that sets one byte of what rank `victim` receives from itself in an alltoall to
/// 0xFF, as a faulty link would.
struct spoiling {
  local* inner;
  std::size_t victim;
  std::size_t at;
  [[nodiscard]] std::size_t rank() const { return inner->rank(); }
  [[nodiscard]] std::size_t size() const { return inner->size(); }
  void allreduce_sum(std::span<float> v) { inner->allreduce_sum(v); }
  void allgather(std::span<const std::byte> mine, bellows::gather_buffer& out) { inner->allgather(mine, out); }
  void alltoall(std::span<const std::byte> blocks, std::span<const std::size_t> sizes, bellows::gather_buffer& out) {
    inner->alltoall(blocks, sizes, out);
    if (rank() == victim) out.block(victim)[at] = std::byte{0xFF};
  }
};

/// The same, without alltoall.
struct no_alltoall {
  local* inner;
  [[nodiscard]] std::size_t rank() const { return inner->rank(); }
  [[nodiscard]] std::size_t size() const { return inner->size(); }
  void allreduce_sum(std::span<float> v) { inner->allreduce_sum(v); }
  void allgather(std::span<const std::byte> mine, bellows::gather_buffer& out) { inner->allgather(mine, out); }
};

}  // namespace

TEST_CASE("scatter: a corrupted chunk payload, seen by its owner alone, raises one wire_error on every rank") {
  constexpr std::size_t n = 1000, ranks = 3;
  // the magic, the element count, and the sign of the first scale (of QSGD) or the high byte of
  // the first index (of top-k)
  const auto check = [&](auto c, std::size_t at) {
    CAPTURE(at);
    std::vector<std::string> messages(ranks);
    local_group(ranks).run([&](local& comm) {
      auto st = c.make_state({0, "fc.weight", bellows::shape{n}});
      auto g = gradient(n, comm.rank(), 0);
      spoiling coll{&comm, 1, at};
      const auto before = g;
      try {
        (void)c.reduce(st, g, coll);
      } catch (const bellows::wire_error& e) {
        messages[comm.rank()] = e.what();
      }
      CHECK(same_bits(g, before));
      CHECK(st.step == 0);
      for (const float e : st.owner.values()) CHECK(e == 0.0f);
    });
    CHECK(messages[0].find("layer 'fc.weight'") != std::string::npos);
    CHECK(messages[0].find("chunk payload of rank 1") != std::string::npos);
    CHECK(messages[0].find("owner") != std::string::npos);
    for (const std::string& m : messages) CHECK(m == messages[0]);
  };
  for (const std::size_t at : {std::size_t{0}, std::size_t{9}, bellows::wire::header_bytes + 3}) {
    check(bellows::qsgd<>({.bits = 4, .bucket = 50, .exchange = scatter, .owner_memory = true}), at);
    check(bellows::topk<>({.ratio = 0.05, .exchange = scatter}), at);
  }
}

TEST_CASE("scatter: a collective without alltoall is refused by name before anything changes") {
  local_group(2).run([&](local& comm) {
    bellows::qsgd<> c({.exchange = scatter});
    auto st = c.make_state({0, "layer", bellows::shape{100}});
    auto g = gradient(100, comm.rank(), 0);
    const auto before = g;
    no_alltoall coll{&comm};
    CHECK_THROWS_WITH_AS((void)c.reduce(st, g, coll), doctest::Contains("AlltoallCollective"), bellows::error);
    CHECK(same_bits(g, before));
    CHECK(st.step == 0);
  });
}

TEST_CASE("scatter: a checkpoint round trip continues with the same bits, the owner memory included") {
  constexpr std::size_t n = 700, ranks = 3;
  const auto check = [&](auto& c) {
    local_group(ranks).run([&](local& comm) {
      bellows::testing::check_resume(
          c, {2, "layer", bellows::shape{n}}, comm, gradient, 3, 3, [](const auto& x, const auto& y) {
            return same_bits(x.memory.values(), y.memory.values()) && same_bits(x.owner.values(), y.owner.values()) &&
                   x.step == y.step && !x.owner.values().empty();
          });
    });
  };
  bellows::signsgd<> sign({.bucket = 20, .exchange = scatter});
  bellows::topk<> top({.ratio = 0.05, .exchange = scatter});
  check(sign);
  check(top);
}

TEST_CASE("scatter: a checkpoint of another world size or rank is refused at the next step") {
  constexpr std::size_t n = 300;
  std::vector<std::byte> saved;
  local_group(3).run([&](local& comm) {
    bellows::signsgd<> c({.exchange = scatter});
    auto st = c.make_state({0, "layer", bellows::shape{n}});
    auto g = gradient(n, comm.rank(), 0);
    REQUIRE(c.reduce(st, g, comm).status == bellows::step_status::ok);
    bellows::checkpoint_writer w;
    c.save(st, w);
    if (comm.rank() == 0) saved.assign(w.bytes().begin(), w.bytes().end());
  });
  local_group(2).run([&](local& comm) {
    bellows::signsgd<> c({.exchange = scatter});
    auto st = c.make_state({0, "layer", bellows::shape{n}});
    bellows::checkpoint_reader in(saved);
    c.load(st, in);
    auto g = gradient(n, comm.rank(), 1);
    const auto before = g;
    CHECK_THROWS_WITH_AS((void)c.reduce(st, g, comm), doctest::Contains("3 ranks"), bellows::error);
    CHECK(same_bits(g, before));
    CHECK(st.step == 1);
  });
}

namespace {

/// A bucket of layers of these sizes, layer l's compressor C of params_of(l), against each layer's
/// reduce, over 1, 2, 3 and 5 ranks.
template <class C, class ParamsOf>
void check_bucket(ParamsOf params_of) {
  const std::size_t sizes[] = {1000, 3, 257, 0, 4096};
  for (const std::size_t ranks : {1u, 2u, 3u, 5u}) {
    CAPTURE(ranks);
    std::vector<std::vector<vec>> by_reduce(ranks), by_bucket(ranks);
    local_group(ranks).run([&](local& comm) {
      std::vector<C> codecs;
      for (std::size_t l = 0; l < std::size(sizes); ++l) codecs.emplace_back(params_of(l));
      std::vector<typename C::state> a, b;
      std::vector<vec> ga, gb;
      for (std::size_t l = 0; l < std::size(sizes); ++l) {
        const bellows::layer_info layer{static_cast<std::uint32_t>(l), "l" + std::to_string(l),
                                        bellows::shape{sizes[l]}};
        a.push_back(codecs[l].make_state(layer));
        b.push_back(codecs[l].make_state(layer));
      }
      bellows::bucket_exchange<bellows::cpu::executor> bucket(bellows::cpu::executor::shared());
      for (std::size_t t = 0; t < 3; ++t) {
        std::vector<bellows::bucket_layer<C>> layers;
        ga.clear();
        gb.clear();
        for (std::size_t l = 0; l < std::size(sizes); ++l) {
          ga.push_back(gradient(sizes[l], comm.rank(), t + l));
          gb.push_back(ga.back());
        }
        for (std::size_t l = 0; l < std::size(sizes); ++l) {
          REQUIRE(codecs[l].reduce(a[l], ga[l], comm).status == bellows::step_status::ok);
          layers.push_back({&codecs[l], &b[l], gb[l]});
        }
        std::vector<bellows::reduce_result> results(layers.size());
        bucket.template run<C>(layers, results, comm);
        for (const auto& res : results) REQUIRE(res.status == bellows::step_status::ok);
      }
      by_reduce[comm.rank()] = ga;
      by_bucket[comm.rank()] = gb;
      for (std::size_t l = 0; l < std::size(sizes); ++l) {
        CHECK(same_bits(a[l].memory.values(), b[l].memory.values()));
        CHECK(same_bits(a[l].owner.values(), b[l].owner.values()));
      }
    });
    for (std::size_t r = 0; r < ranks; ++r)
      for (std::size_t l = 0; l < std::size(sizes); ++l) {
        CAPTURE(r);
        CAPTURE(l);
        CHECK(same_bits(by_bucket[r][l], by_reduce[r][l]));
      }
  }
}

}  // namespace

TEST_CASE("scatter: a bucket of scatter and gather layers equals each layer's reduce") {
  const auto exchange_of = [](std::size_t l) { return l % 2 == 0 ? scatter : bellows::exchange::gather; };
  SUBCASE("QSGD") {
    check_bucket<bellows::qsgd<>>([&](std::size_t l) {
      return bellows::qsgd_params{.bits = 4, .bucket = 64, .exchange = exchange_of(l), .owner_memory = l == 0};
    });
  }
  SUBCASE("top-k") {
    check_bucket<bellows::topk<>>([&](std::size_t l) {
      return bellows::topk_params{.ratio = 0.05, .exchange = exchange_of(l), .owner_memory = l != 2};
    });
  }
}

namespace {

/// One scatter step of compressor `c` on a layer of 2^16 elements over W = 2, 4 and 8, counted:
/// its rounds an alltoall and an allgather, one call of each, and each rank receiving 2 (W - 1)
/// chunk payloads of chunk_bytes(W) bytes to 64 more (a header and padding); then
/// check(result, output) on every rank.
template <class C, class ChunkBytes, class Check>
void check_received(const C& c, ChunkBytes chunk_bytes, Check check) {
  constexpr std::size_t n = 1 << 16;
  for (const std::size_t ranks : {2u, 4u, 8u}) {
    CAPTURE(ranks);
    std::vector<std::uint64_t> received(ranks);
    local_group(ranks).run([&](local& comm) {
      bellows::collectives::counting<local> counted(comm);
      C mine = c;
      auto st = mine.make_state({0, "layer", bellows::shape{n}});
      const bellows::exchange_rounds rounds = mine.rounds(st, ranks);
      REQUIRE(rounds.size() == 2);
      CHECK(rounds[0].op == bellows::collective_op::alltoall);
      CHECK(rounds[1].op == bellows::collective_op::allgather);
      auto g = gradient(n, comm.rank(), 0);
      const bellows::reduce_result result = mine.reduce(st, g, counted);
      REQUIRE(result.status == bellows::step_status::ok);
      CHECK(counted.alltoall().calls == 1);
      CHECK(counted.allgather().calls == 1);
      CHECK(counted.allreduce().calls == 0);
      check(result, std::span<const float>(g), ranks);
      received[comm.rank()] = counted.alltoall().bytes_received + counted.allgather().bytes_received;
    });
    const double chunk = chunk_bytes(static_cast<double>(ranks));
    for (const std::uint64_t bytes : received) {
      CHECK(static_cast<double>(bytes) >= 2.0 * static_cast<double>(ranks - 1) * chunk);
      CHECK(static_cast<double>(bytes) <= 2.0 * static_cast<double>(ranks - 1) * (chunk + 64.0));
    }
  }
}

}  // namespace

TEST_CASE("scatter: one alltoall and one allgather, each rank receiving about two chunks' payloads per rank") {
  constexpr double n = 1 << 16;
  SUBCASE("QSGD: a chunk's payload is n / W codes and n / (512 W) scales") {
    check_received(
        bellows::qsgd<>({.bits = 8, .bucket = 512, .exchange = scatter}),
        [&](double w) { return n / w * (1.0 + 4.0 / 512.0); }, [](const auto&, std::span<const float>, std::size_t) {});
  }
  SUBCASE("top-k: a chunk's payload is about 656 / W entries of 8 bytes; 656 to 655 + W kept") {
    check_received(
        bellows::topk<>({.ratio = 0.01, .exchange = scatter}), [](double w) { return 656.0 / w * 8.0; },
        [](const bellows::reduce_result& result, std::span<const float> g, std::size_t ranks) {
          std::size_t nonzero = 0;
          for (const float x : g) nonzero += x != 0.0f;
          CHECK(nonzero == result.sent.kept);
          CHECK(result.sent.kept >= 656);  // ceil(0.01 n), each chunk's count rounded up
          CHECK(result.sent.kept <= 655 + ranks);
        });
  }
}

TEST_CASE("scatter: the options, the owner memory's defaults, and the codecs' refusals") {
  bellows::method_settings s;
  s.set("exchange", "scatter");
  CHECK(bellows::qsgd_method::configure(s).exchange == scatter);
  CHECK_FALSE(bellows::qsgd_method::configure(s).owner_memory);
  CHECK(bellows::signsgd_method::configure(s).exchange == scatter);
  CHECK(bellows::signsgd_method::configure(s).owner_memory);
  s.set("owner-memory", "on");
  CHECK(bellows::qsgd_method::configure(s).owner_memory);
  s.set("owner-memory", "off");
  CHECK_FALSE(bellows::signsgd_method::configure(s).owner_memory);
  s.set("exchange", "leader");
  CHECK_THROWS_WITH_AS((void)bellows::qsgd_method::configure(s), doctest::Contains("gather|scatter"), bellows::error);
  bellows::qsgd_params q{.exchange = bellows::exchange::leader};
  CHECK_THROWS_WITH_AS(q.validate(), doctest::Contains("leader"), bellows::error);
  CHECK(bellows::topk_method::configure(s).exchange == bellows::exchange::leader);
  s.set("exchange", "scatter");
  s.set("owner-memory", "on");
  CHECK(bellows::topk_method::configure(s).owner_memory);
  s.set("approximate", "");
  CHECK_THROWS_WITH_AS((void)bellows::topk<>(bellows::topk_method::configure(s)),
                       doctest::Contains("mode must be exact"), bellows::error);
  CHECK(bellows::topk_params{}.owner_memory);
  // rand-k: per rank only, its owner memory off with unbiased scaling by default
  bellows::method_settings r;
  r.set("exchange", "scatter");
  CHECK_THROWS_WITH_AS((void)bellows::randk<>(bellows::randk_method::configure(r)), doctest::Contains("per_rank"),
                       bellows::error);
  r.set("per-rank", "");
  CHECK(bellows::randk_method::configure(r).owner_memory);
  r.set("unbiased", "");
  CHECK_FALSE(bellows::randk_method::configure(r).owner_memory);
  CHECK_NOTHROW((void)bellows::randk<>(bellows::randk_method::configure(r)));
  r.set("owner-memory", "on");
  CHECK_THROWS_WITH_AS((void)bellows::randk<>(bellows::randk_method::configure(r)), doctest::Contains("owner_memory"),
                       bellows::error);
  bellows::signsgd_params p{.exchange = static_cast<bellows::exchange>(9)};
  CHECK_THROWS_WITH_AS(p.validate(), doctest::Contains("exchange"), bellows::error);
}

TEST_CASE("scatter: a level change keeps the owner memory where the chunks stay, and starts it afresh where not") {
  constexpr std::size_t n = 1000, ranks = 3;
  local_group(ranks).run([&](local& comm) {
    // QSGD at 8 and 2 bits, buckets of 64 both: the same chunks, the memory kept
    bellows::qsgd<> eight({.bits = 8, .bucket = 64, .exchange = scatter, .owner_memory = true});
    bellows::qsgd<> two({.bits = 2, .bucket = 64, .exchange = scatter, .owner_memory = true});
    auto st = eight.make_state({4, "layer", bellows::shape{n}});
    auto g = gradient(n, comm.rank(), 0);
    REQUIRE(eight.reduce(st, g, comm).status == bellows::step_status::ok);
    REQUIRE(!st.owner.values().empty());
    // against a state at the same step whose owner memory starts at zero: the kept one shows
    auto zero = two.make_state({4, "layer", bellows::shape{n}});
    zero.step = st.step;
    g = gradient(n, comm.rank(), 1);
    auto g0 = g;
    REQUIRE(two.reduce(st, g, comm).status == bellows::step_status::ok);
    REQUIRE(two.reduce(zero, g0, comm).status == bellows::step_status::ok);
    CHECK(st.chunks == bellows::chunk_plan("test", n, ranks, 64, 4));
    CHECK_FALSE(same_bits(g, g0));
    // EF-signSGD with one scale per chunk, then buckets of 16: other chunks, the memory afresh
    bellows::signsgd<> whole({.bucket = 0, .exchange = scatter});
    bellows::signsgd<> sixteen({.bucket = 16, .exchange = scatter});
    auto s = whole.make_state({5, "other", bellows::shape{n}});
    auto h = gradient(n, comm.rank(), 0);
    REQUIRE(whole.reduce(s, h, comm).status == bellows::step_status::ok);
    const bellows::chunk_plan before = s.chunks;
    CHECK(before == bellows::chunk_plan("test", n, ranks, 1, 5));
    bool nonzero = false;
    for (const float e : s.owner.values()) nonzero = nonzero || e != 0.0f;
    CHECK(nonzero);
    h = gradient(n, comm.rank(), 1);
    auto fresh = sixteen.make_state({5, "other", bellows::shape{n}});
    fresh.step = s.step;
    fresh.memory.assign(bellows::cpu::executor::shared(), s.memory.values());
    auto h2 = h;
    REQUIRE(sixteen.reduce(s, h, comm).status == bellows::step_status::ok);
    REQUIRE(sixteen.reduce(fresh, h2, comm).status == bellows::step_status::ok);
    CHECK(s.chunks == bellows::chunk_plan("test", n, ranks, 16, 5));
    CHECK(same_bits(h, h2));  // as a state whose owner memory starts at zero
    CHECK(same_bits(s.owner.values(), fresh.owner.values()));
    // a compressor of the other exchange is refused by the state
    bellows::signsgd<> gather({.bucket = 16});
    auto k = gradient(n, comm.rank(), 2);
    CHECK_THROWS_WITH_AS((void)gather.reduce(s, k, comm), doctest::Contains("one exchange"), bellows::error);
  });
}
