// SPDX-License-Identifier: Apache-2.0
// Top-k's cyclic leader (docs/spec.md#top-k-leader) against a brute-force reference of both of its
// rounds on seeded data, over W = 1, 2, 3, 5, 8 ranks summing in rank order: the leader of step t
// is rank t mod W, its top-k of m = g + e is every rank's index set, the values at it are summed
// in rank order and divided by W, and e = m with zeros there. Also: the same bits on every rank,
// the memory's telescoping sum, layers of no element, of one, of fewer elements than ranks and
// of 2^24 elements or more (two floats per index), NaN on one rank, a corrupted list, a
// checkpoint round trip, the rounds' bytes, and the options.
#include <bellows/collectives/counting.hpp>
#include <bellows/collectives/local.hpp>
#include <bellows/compressors/topk.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "../support/bits.hpp"
#include "../support/random.hpp"
#include "../support/resume.hpp"

namespace {

using bellows::collectives::local;
using bellows::collectives::local_group;
using bellows::testing::same_bits;

constexpr bellows::exchange leader = bellows::exchange::leader;

/// Rank r's gradient of a layer of n elements at step t: seeded normals, with runs of equal
/// magnitudes (ties) on every third step.
std::vector<float> gradient(std::size_t n, std::size_t rank, std::size_t step) {
  auto g = bellows::testing::normal_floats(n, 7919 * step + 31 * rank + n);
  if (step % 3 == 2)
    for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>(static_cast<int>(g[i] * 2.0f)) * 0.5f;
  return g;
}

/// The k largest |v|, ties to the lower index, as ascending indices.
std::vector<std::size_t> top_indices(const std::vector<float>& v, std::size_t k) {
  std::vector<std::size_t> order(v.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return std::fabs(v[a]) > std::fabs(v[b]); });
  order.resize(k);
  std::ranges::sort(order);
  return order;
}

/// The reference over every rank: outputs[t][r] and the memories after each step.
struct reference {
  std::vector<std::vector<std::vector<float>>> outputs, memories;
};

reference brute_force(std::size_t n, std::size_t k, std::size_t ranks, std::size_t steps) {
  reference ref;
  std::vector<std::vector<float>> e(ranks, std::vector<float>(n, 0.0f));
  for (std::size_t t = 0; t < steps; ++t) {
    std::vector<std::vector<float>> m(ranks);
    for (std::size_t r = 0; r < ranks; ++r) {
      const auto g = gradient(n, r, t);
      m[r].resize(n);
      for (std::size_t i = 0; i < n; ++i) m[r][i] = g[i] + e[r][i];
    }
    const auto index = top_indices(m[t % ranks], k);
    std::vector<float> out(n, 0.0f);
    for (const std::size_t i : index) {
      float sum = m[0][i];
      for (std::size_t r = 1; r < ranks; ++r) sum += m[r][i];
      out[i] = sum / static_cast<float>(ranks);
    }
    for (std::size_t r = 0; r < ranks; ++r) {
      e[r] = m[r];
      for (const std::size_t i : index) e[r][i] = 0.0f;
    }
    ref.outputs.emplace_back(ranks, out);
    ref.memories.push_back(e);
  }
  return ref;
}

}  // namespace

TEST_CASE("topk leader: outputs and memories equal the brute-force reference on every rank") {
  constexpr std::size_t steps = 5;
  for (const std::size_t ranks : {1u, 2u, 3u, 5u, 8u})
    for (const std::size_t n : {1u, 6u, 300u, 4099u}) {
      CAPTURE(ranks);
      CAPTURE(n);
      const bellows::topk_params params{.ratio = 0.05, .exchange = leader};
      const std::size_t k = bellows::detail::kept_count({0, "x", bellows::shape{n}}, params.ratio, 0);
      const reference ref = brute_force(n, k, ranks, steps);
      std::vector<std::vector<std::vector<float>>> outputs(steps, std::vector<std::vector<float>>(ranks));
      std::vector<std::vector<std::vector<float>>> memories = outputs;
      std::vector<std::size_t> kept(ranks);
      local_group(ranks).run([&](local& comm) {
        bellows::topk<> c(params);
        auto st = c.make_state({0, "layer", bellows::shape{n}});
        for (std::size_t t = 0; t < steps; ++t) {
          auto g = gradient(n, comm.rank(), t);
          const bellows::reduce_result res = c.reduce(st, g, comm);
          REQUIRE(res.status == bellows::step_status::ok);
          kept[comm.rank()] = res.sent.kept;
          outputs[t][comm.rank()] = g;
          const auto mem = st.memory.values();
          memories[t][comm.rank()].assign(mem.begin(), mem.end());
        }
        CHECK(st.step == steps);
      });
      for (std::size_t t = 0; t < steps; ++t)
        for (std::size_t r = 0; r < ranks; ++r) {
          CAPTURE(t);
          CAPTURE(r);
          CHECK(same_bits(outputs[t][r], ref.outputs[t][r]));
          CHECK(same_bits(memories[t][r], ref.memories[t][r]));
        }
      for (const std::size_t x : kept) CHECK(x == k);
    }
}

TEST_CASE("topk leader: the memory telescopes: the sum of the gradients is what was sent plus e") {
  constexpr std::size_t n = 2000, ranks = 3, steps = 12;
  std::vector<std::vector<double>> gap(ranks);
  local_group(ranks).run([&](local& comm) {
    bellows::topk<> c({.ratio = 0.01, .exchange = leader});
    auto st = c.make_state({0, "layer", bellows::shape{n}});
    std::vector<double> grads(n, 0.0), sent(n, 0.0);
    for (std::size_t t = 0; t < steps; ++t) {
      const auto g = gradient(n, comm.rank(), t);
      std::vector<float> m(n);
      for (std::size_t i = 0; i < n; ++i) m[i] = g[i] + st.memory.values()[i];
      auto out = g;
      REQUIRE(c.reduce(st, out, comm).status == bellows::step_status::ok);
      for (std::size_t i = 0; i < n; ++i) {
        grads[i] += g[i];
        sent[i] += m[i] - st.memory.values()[i];  // m where the leader's indices are, else 0
      }
    }
    auto& mine = gap[comm.rank()];
    for (std::size_t i = 0; i < n; ++i) mine.push_back(grads[i] - sent[i] - st.memory.values()[i]);
  });
  for (const auto& g : gap)
    for (const double x : g) CHECK(std::fabs(x) < 1e-4);
}

TEST_CASE("topk leader: layers of 2^24 elements or more carry each index in two floats") {
  const bellows::index_list_layout small((std::size_t{1} << 24) - 1, 4), large(std::size_t{1} << 24, 4);
  CHECK(small.words == 1);
  CHECK(large.words == 2);
  CHECK(large.floats() == 1 + 2 * 5);
  for (const std::uint64_t v : {std::uint64_t{0}, std::uint64_t{1} << 24, (std::uint64_t{1} << 40) + 12345u}) {
    float words[2]{};
    large.put(words, v);
    std::uint64_t back = 0;
    CHECK(large.get(words, back));
    CHECK(back == v);
  }
  float bad[2] = {0.5f, 0.0f};
  std::uint64_t v = 0;
  CHECK_FALSE(large.get(bad, v));
  bad[0] = std::numeric_limits<float>::quiet_NaN();
  CHECK_FALSE(large.get(bad, v));
  bad[0] = 16777216.0f;  // 2^24 is no word
  CHECK_FALSE(large.get(bad, v));

  // a step over 2^24 + 3 elements, the largest few at indices past 2^24
  constexpr std::size_t n = (std::size_t{1} << 24) + 3, ranks = 2;
  std::vector<std::vector<float>> out(ranks);
  local_group(ranks).run([&](local& comm) {
    bellows::topk<> c({.k = 3, .feedback = bellows::feedback::none, .exchange = leader});
    auto st = c.make_state({0, "embedding", bellows::shape{n}});
    std::vector<float> g(n, 0.0f);
    g[5] = 1.0f;
    g[n - 1] = -4.0f + static_cast<float>(comm.rank());
    g[n - 2] = 3.0f;
    REQUIRE(c.reduce(st, g, comm).status == bellows::step_status::ok);
    out[comm.rank()] = std::move(g);
  });
  for (const auto& g : out) {
    CHECK(g[5] == 1.0f);
    CHECK(g[n - 1] == -3.5f);
    CHECK(g[n - 2] == 3.0f);
    CHECK(std::count(g.begin(), g.end(), 0.0f) == static_cast<std::ptrdiff_t>(n - 3));
  }
}

TEST_CASE("topk leader: NaN on one rank gives non_finite everywhere and changes nothing") {
  constexpr std::size_t n = 500, ranks = 3;
  for (const std::size_t bad_rank : {0u, 2u}) {
    CAPTURE(bad_rank);
    local_group(ranks).run([&](local& comm) {
      bellows::topk<> c({.ratio = 0.02, .exchange = leader});
      auto st = c.make_state({0, "layer", bellows::shape{n}});
      auto g = gradient(n, comm.rank(), 0);
      REQUIRE(c.reduce(st, g, comm).status == bellows::step_status::ok);
      const std::vector<float> memory(st.memory.values().begin(), st.memory.values().end());
      auto h = gradient(n, comm.rank(), 1);
      if (comm.rank() == bad_rank) h[n / 3] = std::numeric_limits<float>::quiet_NaN();
      const auto before = h;
      const bellows::reduce_result res = c.reduce(st, h, comm);
      CHECK(res.status == bellows::step_status::non_finite);
      CHECK(res.sent.kept == 0);
      CHECK(same_bits(h, before));
      CHECK(same_bits(st.memory.values(), memory));
      CHECK(st.step == 1);
    });
  }
}

namespace {

/// A collective that spoils the result of its first allreduce on every rank, as a faulty
/// transport would: `spoil` edits the summed list.
template <class Spoil>
struct spoiling {
  local* inner;
  Spoil spoil;
  std::size_t calls = 0;
  [[nodiscard]] std::size_t rank() const { return inner->rank(); }
  [[nodiscard]] std::size_t size() const { return inner->size(); }
  void allreduce_sum(std::span<float> v) {
    inner->allreduce_sum(v);
    if (calls++ == 0) spoil(v);
  }
  void allgather(std::span<const std::byte> mine, bellows::gather_buffer& out) { inner->allgather(mine, out); }
};

}  // namespace

TEST_CASE("topk leader: a corrupted list raises the same wire_error on every rank and changes nothing") {
  constexpr std::size_t n = 400, ranks = 3;
  const bellows::index_list_layout at(n, 8);
  struct spoil_case {
    const char* what;
    std::size_t at;
    float value;  // NaN: the float before it, which makes two indices equal
    const char* message;
  };
  const float previous = std::numeric_limits<float>::quiet_NaN();
  const spoil_case cases[] = {
      {"a count past the most", at.count_at(), 9.0f, "count from 8 to 8"},
      {"a fractional count", at.count_at(), 7.5f, "count from 8 to 8"},
      {"an index past n", at.entry_at(7), 400.0f, "entry 7"},
      {"indices out of order", at.entry_at(1), previous, "entry 1"},
      {"a negative index", at.entry_at(3), -2.0f, "entry 3"},
  };
  for (const spoil_case& sc : cases) {
    CAPTURE(sc.what);
    local_group(ranks).run([&](local& comm) {
      bellows::topk<> c({.k = 8, .exchange = leader});
      auto st = c.make_state({0, "fc.weight", bellows::shape{n}});
      auto g = gradient(n, comm.rank(), 0);
      auto spoil = [&](std::span<float> v) { v[sc.at] = std::isnan(sc.value) ? v[sc.at - 1] : sc.value; };
      spoiling<decltype(spoil)> coll{&comm, spoil};
      const auto before = g;
      std::string message;
      try {
        (void)c.reduce(st, g, coll);
      } catch (const bellows::wire_error& e) {
        message = e.what();
      }
      CHECK(message.find("layer 'fc.weight'") != std::string::npos);
      CHECK(message.find(sc.message) != std::string::npos);
      CHECK(same_bits(g, before));
      CHECK(st.step == 0);
      for (const float e : st.memory.values()) CHECK(e == 0.0f);
    });
  }
}

TEST_CASE("topk leader: a checkpoint round trip continues with the same bits, the leader included") {
  constexpr std::size_t n = 700, ranks = 3;
  local_group(ranks).run([&](local& comm) {
    bellows::topk<> c({.ratio = 0.03, .mode = bellows::topk_mode::approximate, .exchange = leader});
    bellows::testing::check_resume(c, {0, "layer", bellows::shape{n}}, comm, gradient, 4, 4,
                                   [](const auto& x, const auto& y) {
                                     return same_bits(x.memory.values(), y.memory.values()) && x.step == y.step;
                                   });
  });
}

TEST_CASE("topk leader: two allreduces of the list and the values, whatever W, and what they carry") {
  constexpr std::size_t n = 10000;
  for (const std::size_t ranks : {2u, 5u}) {
    CAPTURE(ranks);
    local_group(ranks).run([&](local& comm) {
      bellows::collectives::counting<local> counted(comm);
      bellows::topk<> c({.ratio = 0.01, .exchange = leader});
      auto st = c.make_state({0, "layer", bellows::shape{n}});
      const bellows::exchange_rounds rounds = c.rounds(st, ranks);
      REQUIRE(rounds.size() == 2);
      CHECK(rounds[0] == bellows::exchange_round{bellows::collective_op::allreduce_sum, (1 + 101) * 4});
      CHECK(rounds[1] == bellows::exchange_round{bellows::collective_op::allreduce_sum, 100 * 4});
      auto g = gradient(n, comm.rank(), 0);
      const auto res = c.reduce(st, g, counted);
      CHECK(res.sent.bytes == (102 + 100) * 4);
      CHECK(counted.allreduce().calls == 2);
      CHECK(counted.allreduce().bytes_sent == (102 + 100) * 4);
      CHECK(counted.allgather().calls == 0);
    });
  }
}

TEST_CASE("topk leader: the exchange option, and codecs without a leader refuse it") {
  bellows::method_settings s;
  s.set("exchange", "leader");
  CHECK(bellows::topk_method::configure(s).exchange == leader);
  const auto described = bellows::topk_method::describe(bellows::topk_method::configure(s));
  CHECK(std::ranges::count_if(described, [](const bellows::method_param& p) {
          return p.name == "exchange" && p.value == decltype(p.value)(std::string_view("leader"));
        }) == 1);
  s.set("exchange", "ring");
  CHECK_THROWS_WITH_AS((void)bellows::topk_method::configure(s), doctest::Contains("gather|leader|scatter"),
                       bellows::error);
  bellows::topk_params p;
  CHECK(p.exchange == bellows::exchange::gather);
  p.exchange = static_cast<bellows::exchange>(7);
  CHECK_THROWS_WITH_AS(p.validate(), doctest::Contains("exchange"), bellows::error);
}
