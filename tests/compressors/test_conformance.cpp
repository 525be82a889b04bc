// SPDX-License-Identifier: Apache-2.0
// The conformance suite of the Compressor concept (and of PayloadCodec where a compressor models
// it), written once and run for every example configuration of every compressor of the list
// (conformance_cases.hpp).
#include <bellows/collectives/counting.hpp>
#include <bellows/collectives/local.hpp>
#include <bellows/cpu/elementwise.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "../support/allocation_counter.hpp"
#include "../support/random.hpp"
#include "conformance_cases.hpp"

namespace {

using bellows::collectives::local;
using bellows::collectives::local_group;

const bellows::shape test_shapes[] = {bellows::shape{1}, bellows::shape{1000}, bellows::shape{64, 48},
                                      bellows::shape{16, 4, 3, 3}};

/// Gradient of `rank` at `step` for a layer: seeded normal data, different per rank and step.
std::vector<float> gradient(std::size_t n, std::size_t rank, int step) {
  return bellows::testing::normal_floats(n, 7919 * static_cast<std::uint64_t>(step) + rank);
}

struct step_record {
  std::vector<float> out;
  bellows::reduce_result result;
};

/// Runs `steps` reduce calls on W ranks; grad_of(rank, step) gives each input. Returns
/// record[rank][step].
template <class Case, class GradOf>
std::vector<std::vector<step_record>> run(std::size_t w, const bellows::shape& shp, int steps, GradOf&& grad_of,
                                          unsigned threads = 1) {
  std::vector<std::vector<step_record>> rec(w, std::vector<step_record>(static_cast<std::size_t>(steps)));
  bellows::cpu::executor exec(threads);
  local_group group(w);
  group.run([&](local& comm) {
    auto c = Case::make(exec);
    auto st = c.make_state({3, "conv.weight", shp});
    for (int s = 0; s < steps; ++s) {
      std::vector<float> x = grad_of(comm.rank(), s);
      const auto r = c.reduce(st, x, comm);
      rec[comm.rank()][static_cast<std::size_t>(s)] = {x, r};
    }
  });
  return rec;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("conformance: every rank gets the same bits, run after run, for any thread count", Case,
                          conformance_1) {
  for (const bellows::shape& shp : test_shapes) {
    for (std::size_t w : {1u, 2u, 3u}) {
      CAPTURE(shp.to_string());
      CAPTURE(w);
      auto grads = [&](std::size_t r, int s) { return gradient(shp.size(), r, s); };
      const auto a = run<Case>(w, shp, 3, grads);
      const auto b = run<Case>(w, shp, 3, grads, 3);
      for (std::size_t r = 0; r < w; ++r) {
        for (std::size_t s = 0; s < 3; ++s) {
          CHECK(a[r][s].result.status == bellows::step_status::ok);
          CHECK(same_bits(a[r][s].out, a[0][s].out));
          CHECK(same_bits(a[r][s].out, b[r][s].out));
          if (w > 1) CHECK(a[r][s].out != gradient(shp.size(), r, static_cast<int>(s)));
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE_DEFINE("conformance: NaN or Inf on one rank gives non_finite everywhere and changes nothing", Case,
                          conformance_2) {
  const bellows::shape shp{64, 48};
  const std::size_t n = shp.size(), w = 3;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    CAPTURE(bad);
    // Run A: steps 0, poisoned, 1. Run B: steps 0, 1. Step 1 must match bit for bit.
    const auto with_bad = run<Case>(w, shp, 3, [&](std::size_t r, int s) {
      if (s == 1) {
        auto g = gradient(n, r, 99);
        if (r == 1) g[n / 2 + 7] = bad;
        return g;
      }
      return gradient(n, r, s == 0 ? 0 : 1);
    });
    const auto without = run<Case>(w, shp, 2, [&](std::size_t r, int s) { return gradient(n, r, s); });
    for (std::size_t r = 0; r < w; ++r) {
      CHECK(with_bad[r][1].result.status == bellows::step_status::non_finite);
      auto expected_untouched = gradient(n, r, 99);
      if (r == 1) expected_untouched[n / 2 + 7] = bad;
      CHECK(same_bits(with_bad[r][1].out, expected_untouched));
      CHECK(same_bits(with_bad[r][0].out, without[r][0].out));
      CHECK(same_bits(with_bad[r][2].out, without[r][1].out));
    }
  }
}

TEST_CASE_TEMPLATE_DEFINE("conformance: the traffic reported is the traffic the collective carried", Case,
                          conformance_3) {
  for (std::size_t w : {1u, 3u}) {
    bellows::cpu::executor exec(1);
    local_group group(w);
    std::atomic<int> right{0};
    group.run([&](local& inner) {
      bellows::collectives::counting<local> comm(inner);
      auto c = Case::make(exec);
      auto st = c.make_state({0, "fc", bellows::shape{100, 30}});
      std::uint64_t reported = 0;
      for (int s = 0; s < 4; ++s) {
        auto x = gradient(3000, comm.rank(), s);
        reported += c.reduce(st, x, comm).sent.bytes;
      }
      if (reported == comm.total().bytes_sent && reported > 0) ++right;
    });
    CHECK(right == static_cast<int>(w));
  }
}

TEST_CASE_TEMPLATE_DEFINE("conformance: the rounds a state states are the calls and bytes the collective carried", Case,
                          conformance_10) {
  for (const bellows::shape& shp : test_shapes) {
    for (std::size_t w : {1u, 2u, 3u}) {
      CAPTURE(shp.to_string());
      CAPTURE(w);
      bellows::cpu::executor exec(1);
      local_group group(w);
      std::atomic<int> right{0};
      group.run([&](local& inner) {
        bellows::collectives::counting<local> comm(inner);
        auto c = Case::make(exec);
        auto st = c.make_state({5, "conv.weight", shp});
        bool ok = true;
        for (int s = 0; s < 3; ++s) {
          const bellows::exchange_rounds rounds = c.rounds(std::as_const(st), w);
          const bellows::collectives::op_counts reduced = comm.allreduce(), gathered = comm.allgather();
          auto x = gradient(shp.size(), comm.rank(), s);
          ok &= c.reduce(st, x, comm).status == bellows::step_status::ok;
          std::uint64_t calls[2] = {}, most[2] = {};
          bool exact[2] = {true, true};
          for (const bellows::exchange_round& r : rounds) {
            const auto op = static_cast<std::size_t>(r.op);
            ++calls[op];
            most[op] += r.bytes;
            exact[op] = exact[op] && r.exact;
          }
          const std::uint64_t sent[2] = {comm.allreduce().bytes_sent - reduced.bytes_sent,
                                         comm.allgather().bytes_sent - gathered.bytes_sent};
          ok &= rounds.size() >= 1 && rounds.size() <= bellows::exchange_rounds::capacity;
          ok &=
              comm.allreduce().calls - reduced.calls == calls[0] && comm.allgather().calls - gathered.calls == calls[1];
          for (std::size_t op = 0; op < 2; ++op) ok &= exact[op] ? sent[op] == most[op] : sent[op] <= most[op];
        }
        if (ok) ++right;
      });
      CHECK(right == static_cast<int>(w));
    }
  }
}

TEST_CASE_TEMPLATE_DEFINE("conformance: zeros in, zeros out", Case, conformance_4) {
  for (const bellows::shape& shp : test_shapes) {
    const auto rec = run<Case>(2, shp, 2, [&](std::size_t, int) { return std::vector<float>(shp.size(), 0.0f); });
    for (const auto& rank : rec)
      for (const auto& step : rank) {
        CHECK(step.result.status == bellows::step_status::ok);
        for (float v : step.out) CHECK(v == 0.0f);
      }
  }
}

TEST_CASE_TEMPLATE_DEFINE("conformance: a buffer of the wrong length is refused, naming the layer", Case,
                          conformance_5) {
  bellows::cpu::executor exec(1);
  auto c = Case::make(exec);
  auto st = c.make_state({0, "head.bias", bellows::shape{10}});
  std::vector<float> x(11, 1.0f);
  bellows::archetypes::collective solo;
  CHECK_THROWS_WITH_AS(c.reduce(st, x, solo), doctest::Contains("head.bias"), bellows::error);
  CHECK(x == std::vector<float>(11, 1.0f));
}

TEST_CASE_TEMPLATE_DEFINE("conformance: steady-state steps allocate nothing", Case, conformance_6) {
  bellows::cpu::executor exec(1);
  local_group group(2);
  std::atomic<int> clean{0};
  group.run([&](local& comm) {
    auto c = Case::make(exec);
    auto st = c.make_state({0, "fc", bellows::shape{256, 64}});
    std::vector<float> x = gradient(256 * 64, comm.rank(), 0);
    for (int s = 0; s < 3; ++s) (void)c.reduce(st, x, comm);  // warm-up grows the buffers
    const std::size_t before = bellows::testing::allocations;
    for (int s = 0; s < 5; ++s) (void)c.reduce(st, x, comm);
    if (bellows::testing::allocations == before) ++clean;
  });
  CHECK(clean == 2);
}

namespace {
// For PayloadCodec models: an 8-byte aligned buffer of the codec's maximum payload size.
struct payload_storage {
  std::vector<std::uint64_t> words;
  explicit payload_storage(std::size_t bytes) : words((bytes + 7) / 8) {}
  std::span<std::byte> bytes() { return std::as_writable_bytes(std::span(words)); }
};
}  // namespace

TEST_CASE_TEMPLATE_DEFINE("conformance: reduce equals the average of each rank's decoded payload", Case,
                          conformance_7) {
  using C = typename Case::compressor;
  if constexpr (bellows::PayloadCodec<C>) {
    const bellows::shape shp{40, 25};
    const std::size_t n = shp.size();
    for (std::size_t w : {1u, 2u, 3u, 8u}) {
      CAPTURE(w);
      auto grads = [&](std::size_t r, int s) { return gradient(n, r, s); };
      const auto rec = run<Case>(w, shp, 2, grads);
      bellows::cpu::executor exec(1);
      const C c = Case::make(exec);
      for (int s = 0; s < 2; ++s) {
        auto st = c.make_state({3, "conv.weight", shp});
        st.step = static_cast<std::uint64_t>(s);
        // Reference in double: sum of decoded payloads over ranks, divided by W.
        std::vector<double> ref(n, 0.0);
        for (std::size_t r = 0; r < w; ++r) {
          payload_storage buf(c.max_payload_bytes(st));
          const auto x = grads(r, s);
          const auto payload = c.encode(st, x, buf.bytes(), r);
          std::vector<float> dec(n, 0.0f);
          REQUIRE(c.decode_add(st, payload, dec) == bellows::step_status::ok);
          for (std::size_t i = 0; i < n; ++i) ref[i] += dec[i];
        }
        double scale = 0;
        for (double v : ref) scale = std::max(scale, std::abs(v));
        for (std::size_t i = 0; i < n; ++i)
          CHECK(std::abs(rec[0][static_cast<std::size_t>(s)].out[i] - ref[i] / static_cast<double>(w)) <= 1e-6 * scale);
      }
    }
  }
}

TEST_CASE_TEMPLATE_DEFINE("conformance: malformed payloads raise wire_error and leave the output untouched", Case,
                          conformance_8) {
  using C = typename Case::compressor;
  if constexpr (bellows::PayloadCodec<C>) {
    bellows::cpu::executor exec(1);
    const C c = Case::make(exec);
    auto st = c.make_state({0, "fc", bellows::shape{50, 20}});
    payload_storage buf(c.max_payload_bytes(st));
    const auto x = gradient(1000, 0, 0);
    const auto payload = c.encode(st, x, buf.bytes(), 0);
    const std::vector<float> before(1000, 0.5f);
    std::vector<float> acc = before;

    // Truncated anywhere (a multiple of 8 keeps alignment; any cut must be caught).
    for (std::size_t cut : {std::size_t{0}, std::size_t{8}, bellows::wire::header_bytes, payload.size() - 8}) {
      CAPTURE(cut);
      CHECK_THROWS_AS((void)c.decode_add(st, payload.first(cut), acc), bellows::wire_error);
    }
    // Another codec, another version, a layer of another size.
    auto corrupted = [&](std::size_t offset, std::byte value) {
      payload_storage copy(payload.size());
      std::memcpy(copy.bytes().data(), payload.data(), payload.size());
      copy.bytes()[offset] = value;
      return copy;
    };
    for (auto [offset, value] : {std::pair{std::size_t{6}, std::byte{0x7f}}, std::pair{std::size_t{4}, std::byte{9}},
                                 std::pair{std::size_t{8}, std::byte{0x11}}}) {
      CAPTURE(offset);
      auto bad = corrupted(offset, value);
      CHECK_THROWS_AS((void)c.decode_add(st, bad.bytes().first(payload.size()), acc), bellows::wire_error);
    }
    // An empty block from a collective.
    CHECK_THROWS_AS((void)c.validate(st, {}), bellows::wire_error);
    // Oversized: bytes after the payload that the header does not count, or that it counts as
    // body (zeros after the arrays), or a count whose arrays would pass the end of memory.
    {
      payload_storage bigger(payload.size() + 64);
      std::memcpy(bigger.bytes().data(), payload.data(), payload.size());
      CHECK_THROWS_WITH_AS((void)c.decode_add(st, bigger.bytes().first(payload.size() + 8), acc),
                           doctest::Contains("body bytes"), bellows::wire_error);
      bellows::wire::header h;
      std::memcpy(&h, payload.data(), sizeof h);
      h.body_bytes += 64;
      std::memcpy(bigger.bytes().data(), &h, sizeof h);
      CHECK_THROWS_AS((void)c.decode_add(st, bigger.bytes(), acc), bellows::wire_error);
      for (std::uint64_t count : {std::uint64_t{1} << 61, std::uint64_t{1} << 62, ~std::uint64_t{0}}) {
        h.body_bytes -= 64;
        h.count = count;
        std::memcpy(bigger.bytes().data(), &h, sizeof h);
        CHECK_THROWS_AS((void)c.decode_add(st, bigger.bytes().first(payload.size()), acc), bellows::wire_error);
        h.body_bytes += 64;
      }
    }
    CHECK(acc == before);

    // A sender's non-finite input is flagged, and decoding it adds nothing.
    auto poisoned = x;
    poisoned[3] = std::numeric_limits<float>::quiet_NaN();
    const auto flagged = c.encode(st, poisoned, buf.bytes(), 0);
    CHECK(c.validate(st, flagged) == bellows::step_status::non_finite);
    CHECK(c.decode_add(st, flagged, acc) == bellows::step_status::non_finite);
    CHECK(acc == before);
  }
}

TEST_CASE_TEMPLATE_DEFINE("conformance: layers of no element and of one element", Case, conformance_9) {
  using C = typename Case::compressor;
  for (const bellows::shape& shp :
       {bellows::shape{0}, bellows::shape{5, 0}, bellows::shape{}, bellows::shape{1}, bellows::shape{1, 1}}) {
    CAPTURE(shp.to_string());
    const std::size_t n = shp.size();
    const auto rec = run<Case>(2, shp, 3, [&](std::size_t r, int s) {
      return std::vector<float>(n, static_cast<float>(r) * 1.5f + static_cast<float>(s) - 0.75f);
    });
    for (const auto& rank : rec)
      for (std::size_t s = 0; s < rank.size(); ++s) {
        CHECK(rank[s].result.status == bellows::step_status::ok);
        REQUIRE(rank[s].out.size() == n);
        // One element: the average of the two ranks' values, s - 0.75 and s + 0.75 (QSGD: up to
        // its rounding).
        if (n == 1) CHECK(std::abs(rank[s].out[0] - static_cast<float>(s)) <= 0.01f);
      }
    if constexpr (bellows::PayloadCodec<C>) {
      bellows::cpu::executor exec(1);
      const C c = Case::make(exec);
      auto st = c.make_state({0, "odd", shp});
      payload_storage buf(c.max_payload_bytes(st));
      const std::vector<float> x(n, 2.5f);
      const auto payload = c.encode(st, x, buf.bytes(), 0);
      std::vector<float> acc(n, 1.0f);
      CHECK(c.decode_add(st, payload, acc) == bellows::step_status::ok);
      if (n == 1) CHECK(std::abs(acc[0] - 3.5f) <= 0.03f);
      CHECK_THROWS_AS((void)c.validate(st, payload.first(payload.size() - 8)), bellows::wire_error);
    }
  }
}

TEST_CASE_TEMPLATE_APPLY(conformance_1, bellows::testing::conformance_cases);
TEST_CASE_TEMPLATE_APPLY(conformance_2, bellows::testing::conformance_cases);
TEST_CASE_TEMPLATE_APPLY(conformance_3, bellows::testing::conformance_cases);
TEST_CASE_TEMPLATE_APPLY(conformance_4, bellows::testing::conformance_cases);
TEST_CASE_TEMPLATE_APPLY(conformance_5, bellows::testing::conformance_cases);
TEST_CASE_TEMPLATE_APPLY(conformance_6, bellows::testing::conformance_cases);
TEST_CASE_TEMPLATE_APPLY(conformance_7, bellows::testing::conformance_cases);
TEST_CASE_TEMPLATE_APPLY(conformance_8, bellows::testing::conformance_cases);
TEST_CASE_TEMPLATE_APPLY(conformance_9, bellows::testing::conformance_cases);
TEST_CASE_TEMPLATE_APPLY(conformance_10, bellows::testing::conformance_cases);
