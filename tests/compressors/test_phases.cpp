// SPDX-License-Identifier: Apache-2.0
// The phases of a step (concepts.hpp, PhasedCompressor) run for many layers around one call per
// round and operation (tests/support/phased_layers.hpp) give every output, result, memory and
// query that each layer's own reduce gives, bit for bit, over W = 1, 2, 3, 5 ranks summing in
// rank order, with a non-finite input on one rank skipping its layer alone, for every compressor
// of the list; and they refuse parts that do not fit the rounds.
#include <bellows/collectives/counting.hpp>
#include <bellows/collectives/local.hpp>
#include <bellows/compressors/identity.hpp>
#include <bellows/compressors/powersgd.hpp>
#include <bellows/compressors/qsgd.hpp>
#include <bellows/compressors/randk.hpp>
#include <bellows/compressors/signsgd.hpp>
#include <bellows/compressors/topk.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <utility>
#include <cstddef>
#include <span>
#include <vector>

#include "../support/phased_layers.hpp"

namespace {

using bellows::collectives::local;
using bellows::collectives::local_group;

/// A host vector as the runs' Array.
struct host_array {
  explicit host_array(std::vector<float> v) : values(std::move(v)) {}
  [[nodiscard]] std::span<float> span() noexcept { return values; }
  [[nodiscard]] std::vector<float> host() const { return values; }
  std::vector<float> values;
};

/// Both ways on every rank of W = 1, 2, 3, 5: the same runs, one skipped layer, and the phased
/// way's collective calls, one per round and operation that some layer makes.
template <class Make>
void check_phases(Make make) {
  constexpr std::size_t steps = 4;
  const std::span<const bellows::layer_info> layers = bellows::test::phased_layers;
  for (const std::size_t ranks : {1u, 2u, 3u, 5u}) {
    CAPTURE(ranks);
    std::vector<bellows::test::layered_run> want(ranks), got(ranks);
    std::vector<std::size_t> calls(ranks);
    local_group group(ranks);
    group.run([&](local& comm) {
      bellows::cpu::executor exec(1);
      auto c = make(exec);
      want[comm.rank()] = bellows::test::run_layers<host_array>(c, exec, comm, layers, false, steps);
      bellows::collectives::counting<local> counted(comm);
      got[comm.rank()] = bellows::test::run_layers<host_array>(c, exec, counted, layers, true, steps);
      calls[comm.rank()] = counted.total().calls;
    });
    std::set<std::pair<std::size_t, bellows::collective_op>> rounds;
    {
      bellows::cpu::executor exec(1);
      auto c = make(exec);
      for (const auto& layer : layers) {
        const auto rs = c.rounds(c.make_state(layer), ranks);
        for (std::size_t r = 0; r < rs.size(); ++r) rounds.insert({r, rs[r].op});
      }
    }
    for (std::size_t rank = 0; rank < ranks; ++rank) {
      CAPTURE(rank);
      CHECK(bellows::test::same_runs(got[rank], want[rank]));
      CHECK(bellows::test::skipped(got[rank]) == 1);
      CHECK(calls[rank] == steps * rounds.size());
    }
  }
}

}  // namespace

TEST_CASE("phases: identity over one bucket equals each layer's reduce, bit for bit") {
  check_phases([](bellows::cpu::executor& exec) { return bellows::identity<>(exec); });
}

TEST_CASE("phases: powersgd over one bucket equals each layer's reduce, bit for bit") {
  for (const bellows::feedback f : {bellows::feedback::residual, bellows::feedback::none})
    for (const bool warm : {true, false})
      for (const std::size_t rank : {1u, 4u}) {
        CAPTURE(rank);
        CAPTURE(warm);
        check_phases([&](bellows::cpu::executor& exec) {
          return bellows::powersgd<>({.rank = rank, .warm_start = warm, .feedback = f, .seed = 9}, exec);
        });
      }
}

TEST_CASE("phases: top-k averaged densely over one bucket equals each layer's reduce, bit for bit") {
  // at ratio 0.5 the dense switch holds from W = 1: W k (4 + 4) >= 4 n
  for (const bellows::topk_mode mode : {bellows::topk_mode::exact, bellows::topk_mode::approximate})
    for (const bellows::feedback f : {bellows::feedback::residual, bellows::feedback::none}) {
      CAPTURE(static_cast<int>(mode));
      check_phases([&](bellows::cpu::executor& exec) {
        return bellows::topk<>({.ratio = 0.5, .mode = mode, .feedback = f}, exec);
      });
    }
}

TEST_CASE("phases: top-k's leader over one bucket equals each layer's reduce, bit for bit") {
  for (const bellows::topk_mode mode : {bellows::topk_mode::exact, bellows::topk_mode::approximate})
    for (const bellows::feedback f : {bellows::feedback::residual, bellows::feedback::none}) {
      CAPTURE(static_cast<int>(mode));
      check_phases([&](bellows::cpu::executor& exec) {
        return bellows::topk<>({.ratio = 0.1, .mode = mode, .feedback = f, .exchange = bellows::exchange::leader},
                               exec);
      });
    }
}

TEST_CASE("phases: rand-k with shared indices over one bucket equals each layer's reduce, bit for bit") {
  for (const bool unbiased : {false, true})
    for (const bellows::feedback f : {bellows::feedback::residual, bellows::feedback::none}) {
      if (unbiased && f != bellows::feedback::none) continue;  // unbiased scaling has no memory
      CAPTURE(unbiased);
      check_phases([&](bellows::cpu::executor& exec) {
        return bellows::randk<>(
            {.ratio = 0.2, .mode = bellows::randk_mode::shared, .unbiased = unbiased, .feedback = f}, exec);
      });
    }
}

TEST_CASE("phases: the allgather codecs over one bucket equal each layer's reduce, bit for bit") {
  SUBCASE("qsgd") {
    for (const unsigned bits : {8u, 2u})
      for (const bellows::feedback f : {bellows::feedback::none, bellows::feedback::residual}) {
        CAPTURE(bits);
        check_phases([&](bellows::cpu::executor& exec) {
          return bellows::qsgd<>({.bits = bits, .bucket = 64, .feedback = f}, exec);
        });
      }
  }
  SUBCASE("signsgd") {
    check_phases([](bellows::cpu::executor& exec) { return bellows::signsgd<>({}, exec); });
  }
  SUBCASE("qsgd and signsgd by the scatter exchange") {
    for (const bool owner : {false, true}) {
      CAPTURE(owner);
      check_phases([&](bellows::cpu::executor& exec) {
        return bellows::qsgd<>({.bits = 4, .bucket = 64, .exchange = bellows::exchange::scatter, .owner_memory = owner},
                               exec);
      });
    }
    check_phases([](bellows::cpu::executor& exec) {
      return bellows::signsgd<>({.bucket = 16, .exchange = bellows::exchange::scatter}, exec);
    });
  }
  SUBCASE("top-k and per-rank rand-k by the scatter exchange") {
    for (const bool owner : {false, true}) {
      CAPTURE(owner);
      check_phases([&](bellows::cpu::executor& exec) {
        return bellows::topk<>({.ratio = 0.05, .exchange = bellows::exchange::scatter, .owner_memory = owner}, exec);
      });
    }
    check_phases([](bellows::cpu::executor& exec) {
      return bellows::randk<>(
          {.ratio = 0.1, .mode = bellows::randk_mode::per_rank, .seed = 2, .exchange = bellows::exchange::scatter},
          exec);
    });
  }
  SUBCASE("top-k: small layers switch to an allreduce beside the others' allgather") {
    for (const bellows::topk_mode mode : {bellows::topk_mode::exact, bellows::topk_mode::approximate}) {
      CAPTURE(static_cast<int>(mode));
      check_phases([&](bellows::cpu::executor& exec) { return bellows::topk<>({.ratio = 0.05, .mode = mode}, exec); });
    }
  }
  SUBCASE("rand-k per rank") {
    check_phases([](bellows::cpu::executor& exec) {
      return bellows::randk<>({.ratio = 0.1, .mode = bellows::randk_mode::per_rank}, exec);
    });
  }
}

TEST_CASE("phases: parts that do not fit the rounds are refused before anything changes") {
  bellows::powersgd<> c({.rank = 2});
  auto st = c.make_state({0, "fc", bellows::shape{24, 20}});
  std::vector<float> g(480, 1.0f), p(24 * 2 + 1), q(20 * 2), wrong(5), short_grad(479);
  const bellows::round_part too_few[] = {{p}};
  const bellows::round_part too_small[] = {{p}, {wrong}};
  const bellows::round_part fit[] = {{p}, {q}};
  CHECK_THROWS_WITH_AS(c.begin(st, g, too_few, 0, 1), doctest::Contains("1 parts for a step of 2 rounds"),
                       bellows::error);
  CHECK_THROWS_WITH_AS(c.begin(st, g, too_small, 0, 1), doctest::Contains("part 1 holds 20 bytes, round 1 takes 160"),
                       bellows::error);
  CHECK_THROWS_AS(c.begin(st, short_grad, fit, 0, 1), bellows::error);
  std::vector<float> room(24 * 2 + 2);
  const bellows::round_part shifted[] = {{std::span<float>(room).subspan(1)}, {q}};
  CHECK_THROWS_WITH_AS(c.begin(st, g, shifted, 0, 1), doctest::Contains("does not start at a multiple of 16 bytes"),
                       bellows::error);
  CHECK(st.step == 0);
  CHECK_THROWS_AS(c.next(st, g, 2, fit), bellows::error);
  bellows::identity<> id;
  auto ist = id.make_state({0, "bias", bellows::shape{4}});
  std::vector<float> v(1), data(3), x(4, 1.0f);
  const bellows::round_part bad[] = {{v}, {data}};
  CHECK_THROWS_AS(id.begin(ist, x, bad, 0, 1), bellows::error);
  // an allgather's payload starts at a multiple of 8 bytes, and its gathered copies lie as far
  // apart as a payload is long at least
  bellows::topk<> sparse({.ratio = 0.01});
  auto sst = sparse.make_state({0, "fc", bellows::shape{24, 20}});
  const std::size_t floats = sparse.rounds(sst, 2)[0].bytes / sizeof(float);
  std::vector<float> payloads(2 * floats + 2);
  const bellows::round_part odd[] = {{std::span<float>(payloads).subspan(1, floats)}};
  CHECK_THROWS_WITH_AS(sparse.begin(sst, g, odd, 0, 2), doctest::Contains("multiple of 8 bytes"), bellows::error);
  const bellows::round_part mine[] = {{std::span<float>(payloads).first(floats)}};
  sparse.begin(sst, g, mine, 0, 2);
  const bellows::round_part close[] = {{std::span<float>(payloads).first(floats), floats - 2}};
  CHECK_THROWS_WITH_AS(sparse.finish(sst, g, close, 0, 2), doctest::Contains("bytes apart"), bellows::error);
}
