// SPDX-License-Identifier: Apache-2.0
#include <bellows/compressors/topk.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <sys/mman.h>

#include "../support/allocation_counter.hpp"
#include "../support/random.hpp"
#include "sparse_checks.hpp"

namespace {

using bellows::testing::payload_storage;
using bellows::testing::same_bits;

/// The reference: x with all but its k largest |x| zeroed, ties to the lower index.
std::vector<float> sorted_top(const std::vector<float>& x, std::size_t k) {
  std::vector<std::size_t> order(x.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  // (No stable_sort here: its nothrow buffer would bypass the counting operator new.)
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::abs(x[a]) > std::abs(x[b]) || (std::abs(x[a]) == std::abs(x[b]) && a < b);
  });
  std::vector<float> out(x.size(), 0.0f);
  for (std::size_t j = 0; j < k; ++j) out[order[j]] = x[order[j]];
  return out;
}

std::vector<float> copy(std::span<const float> s) { return {s.begin(), s.end()}; }

/// Edge-case data: the brute-force comparison must hold for all of it.
std::vector<float> edge_data(int kind, std::size_t n) {
  std::vector<float> v = bellows::testing::normal_floats(n, static_cast<std::uint64_t>(kind) + 40);
  std::mt19937 rng(static_cast<unsigned>(kind));
  switch (kind) {
    case 1: std::fill(v.begin(), v.end(), 0.25f); break;  // all equal
    case 2:
      for (float& x : v) x = static_cast<float>(static_cast<int>(rng() % 5) - 2);
      break;  // ties
    case 3:
      for (float& x : v) x = rng() % 3 ? (rng() % 2 ? 0.0f : -0.0f) : x;
      break;  // signed zeros
    case 4:
      for (float& x : v) x = std::numeric_limits<float>::denorm_min() * static_cast<float>(rng() % 9);
      break;
    case 5:
      for (float& x : v) x *= rng() % 2 ? 1e37f : 1e-37f;
      break;         // huge and tiny
    default: break;  // normal
  }
  return v;
}

}  // namespace

TEST_CASE("topk: one rank's reduce keeps exactly the top k of a sort, ties to the lower index") {
  bellows::archetypes::collective solo;
  bellows::cpu::executor exec(2);
  for (int kind = 0; kind <= 5; ++kind) {
    for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{640}, std::size_t{70001}}) {
      for (double ratio : {1e-9, 0.001, 0.01, 0.2, 0.5, 1.0}) {
        CAPTURE(kind);
        CAPTURE(n);
        CAPTURE(ratio);
        bellows::topk<> c({.ratio = ratio, .feedback = bellows::feedback::none}, exec);
        auto st = c.make_state({0, "w", bellows::shape{n}});
        const std::size_t k = st.k();
        CHECK(k == std::clamp<std::size_t>(static_cast<std::size_t>(std::ceil(ratio * static_cast<double>(n))), 1, n));
        auto x = edge_data(kind, n);
        const auto expected = sorted_top(x, k);
        const auto r = c.reduce(st, x, solo);
        CHECK(r.status == bellows::step_status::ok);
        CHECK(x == expected);  // a kept -0 may come out as +0: 0 + -0 is +0
        CHECK(st.step == 1);
        CHECK(r.sent.kept == k);
        if (8 * k >= 4 * n)  // one rank: the dense allreduce of n values and the flag
          CHECK(r.sent == bellows::traffic{4 * (n + 1), n + 1, k});
        else
          CHECK(r.sent.bytes == bellows::sparse_payload_bytes(n, k));
      }
    }
  }
}

TEST_CASE("topk: the contraction ||x - C(x)||^2 <= (1 - k/n) ||x||^2") {
  bellows::cpu::executor exec(1);
  for (int kind : {0, 2, 5}) {
    for (double ratio : {0.001, 0.01, 0.3}) {
      const std::size_t n = 20000;
      bellows::topk<> c({.ratio = ratio, .feedback = bellows::feedback::none}, exec);
      auto st = c.make_state({0, "w", bellows::shape{n}});
      const auto x = edge_data(kind, n);
      payload_storage buf(c.max_payload_bytes(st));
      std::vector<float> cx(n, 0.0f);
      REQUIRE(c.decode_add(st, c.encode(st, x, buf.bytes()), cx) == bellows::step_status::ok);
      double left = 0, whole = 0;
      for (std::size_t i = 0; i < n; ++i) {
        left += (double{x[i]} - cx[i]) * (double{x[i]} - cx[i]);
        whole += double{x[i]} * x[i];
      }
      CAPTURE(kind);
      CAPTURE(ratio);
      CHECK(left <= (1.0 - static_cast<double>(st.k()) / static_cast<double>(n)) * whole);
    }
  }
}

TEST_CASE("topk residual feedback: e = m with zeros where kept; sum of contributions + e_T = sum of g") {
  for (auto memory : {bellows::feedback::residual, bellows::feedback::scaled})
    bellows::testing::check_feedback_invariant(
        [&](bellows::cpu::executor& exec) { return bellows::topk<>({.ratio = 0.02, .feedback = memory}, exec); }, 5000,
        40);
}

TEST_CASE("topk: NaN or Inf on one rank gives non_finite on all; gradient, memory and step unchanged") {
  for (double ratio : {0.01, 0.6})  // by allgather, and by the dense allreduce
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()})
      bellows::testing::check_non_finite(
          [&](bellows::cpu::executor& exec) { return bellows::topk<>({.ratio = ratio}, exec); }, 3000, 2999, bad);
}

TEST_CASE("topk: for W = 1, 2, 3, 8 the output is the average of every rank's decoded payload") {
  for (std::size_t w : {1u, 2u, 3u, 8u})
    for (double ratio : {0.01, 0.3})
      for (bool dense_switch : {true, false}) {  // 0.3 goes dense from W = 2 when it may
        CAPTURE(w);
        CAPTURE(ratio);
        CAPTURE(dense_switch);
        bellows::testing::check_average_of_payloads(
            [&](bellows::cpu::executor& exec) {
              return bellows::topk<>({.ratio = ratio, .dense_switch = dense_switch}, exec);
            },
            w, bellows::shape{40, 100});
      }
}

TEST_CASE("topk: a malformed payload raises wire_error and leaves the output untouched") {
  bellows::cpu::executor exec(1);
  const bellows::topk<> c({.ratio = 0.05, .feedback = bellows::feedback::none}, exec);
  const std::size_t n = 1000;
  auto st = c.make_state({0, "fc.w", bellows::shape{n}});
  payload_storage buf(c.max_payload_bytes(st));
  const auto x = bellows::testing::normal_floats(n, 1);
  const auto good = c.encode(st, x, buf.bytes());
  const std::size_t k = st.k(), head = bellows::wire::header_bytes;
  REQUIRE(good.size() == bellows::sparse_payload_bytes(n, k));
  const std::vector<float> before(n, 2.0f);
  std::vector<float> acc = before;
  auto changed = [&](auto&& edit) {
    payload_storage bad(good.size());
    std::memcpy(bad.bytes().data(), good.data(), good.size());
    edit(bad.bytes().first(good.size()));
    return bad;
  };
  auto index = [&](std::span<std::byte> p, std::size_t j) {
    return reinterpret_cast<std::uint32_t*>(p.data() + head) + j;
  };
  auto value = [&](std::span<std::byte> p, std::size_t j) {
    return reinterpret_cast<float*>(p.data() + head + 4 * k) + j;
  };
  const std::pair<const char*, std::function<void(std::span<std::byte>)>> edits[] = {
      {"index", [&](std::span<std::byte> p) { std::swap(*index(p, 3), *index(p, 4)); }},             // descending
      {"index", [&](std::span<std::byte> p) { *index(p, 5) = *index(p, 4); }},                       // repeated
      {"index", [&](std::span<std::byte> p) { *index(p, k - 1) = static_cast<std::uint32_t>(n); }},  // out of range
      {"non-finite", [&](std::span<std::byte> p) { *value(p, 7) = std::numeric_limits<float>::infinity(); }},
      {"entries", [&](std::span<std::byte> p) { p[16] = std::byte{static_cast<unsigned char>(k - 1)}; }},  // count
      {"flagged", [&](std::span<std::byte> p) { p[7] = std::byte{2}; }},  // flag with entries
      {"indices", [&](std::span<std::byte> p) { p[7] = std::byte{1}; }},  // 64-bit indices
      {"param", [&](std::span<std::byte> p) { p[24] = std::byte{1}; }},
  };
  for (const auto& edit : edits) {
    CAPTURE(edit.first);
    auto bad = changed(edit.second);
    CHECK_THROWS_WITH_AS((void)c.decode_add(st, bad.bytes().first(good.size()), acc), doctest::Contains(edit.first),
                         bellows::wire_error);
  }
  CHECK_THROWS_AS((void)c.validate(st, good.first(good.size() - 8)), bellows::wire_error);
  CHECK_THROWS_AS((void)c.validate(st, good.first(head)), bellows::wire_error);
  CHECK(acc == before);
  CHECK(c.decode_add(st, good, acc) == bellows::step_status::ok);
}

TEST_CASE("topk: each bad parameter is refused at construction, naming the parameter and the value") {
  bellows::cpu::executor exec(1);
  struct bad_case {
    bellows::topk_params params;
    const char* says;
  };
  for (const bad_case& b : {
           bad_case{{.ratio = 0.0}, "topk: ratio must be in (0, 1], got 0"},
           bad_case{{.ratio = 1.5}, "topk: ratio must be in (0, 1], got 1.5"},
           bad_case{{.ratio = -0.25}, "topk: ratio must be in (0, 1], got -0.25"},
           bad_case{{.ratio = std::nan("")}, "topk: ratio must be in (0, 1], got nan"},
           bad_case{{.k = -3}, "topk: k must not be negative, got -3"},
           bad_case{{.mode = static_cast<bellows::topk_mode>(7)},
                    "topk: mode must be exact or approximate, got the value 7"},
           bad_case{{.feedback = static_cast<bellows::feedback>(9)},
                    "topk: feedback must be none, residual or scaled, got the value 9"},
       }) {
    CAPTURE(b.says);
    CHECK_THROWS_WITH_AS(bellows::topk<>(b.params, exec), b.says, bellows::error);
  }
  CHECK_NOTHROW(bellows::topk<>({.ratio = 0.0, .k = 5}, exec));  // a k > 0 sets aside the ratio
}

TEST_CASE("topk: a buffer of another length than the layer is refused, naming the layer") {
  bellows::cpu::executor exec(1);
  const bellows::layer_info layer{0, "conv1.weight", bellows::shape{64, 3, 3, 3}};
  bellows::topk<> c({}, exec);
  auto st = c.make_state(layer);
  std::vector<float> x(10);
  CHECK_THROWS_WITH_AS((void)c.stage(st, x), doctest::Contains("conv1.weight"), bellows::error);
}

TEST_CASE("topk: a layer with no elements keeps nothing") {
  bellows::cpu::executor exec(1);
  bellows::archetypes::collective solo;
  for (double ratio : {0.01, 1.0}) {
    bellows::topk<> c({.ratio = ratio}, exec);
    auto st = c.make_state({0, "empty", bellows::shape{4, 0}});
    CHECK(st.k() == 0);
    std::vector<float> none;
    CHECK(c.reduce(st, none, solo).status == bellows::step_status::ok);
    CHECK(c.validate(st, c.stage(st, none)) == bellows::step_status::ok);
  }
}

TEST_CASE("topk: k = clamp(ceil(ratio * n), 1, n) as a decimal ratio reads; an explicit k at most n") {
  bellows::cpu::executor exec(1);
  auto k_of = [&](bellows::topk_params p, std::size_t n) {
    return bellows::topk<>(p, exec).make_state({0, "w", bellows::shape{n}}).k();
  };
  CHECK(k_of({.ratio = 0.07}, 100) == 7);
  CHECK(k_of({.ratio = 0.29}, 100) == 29);
  CHECK(k_of({.ratio = 0.01}, 1000) == 10);
  CHECK(k_of({.ratio = 0.01}, 1001) == 11);
  CHECK(k_of({.ratio = 0.001}, 10) == 1);
  CHECK(k_of({.ratio = 1.0}, 33) == 33);
  CHECK(k_of({.ratio = 0.5, .k = 5}, 100) == 5);
  CHECK(k_of({.k = 500}, 100) == 100);
}

TEST_CASE("topk approximate: keeps between k and ceil(1.25 k) and reports the count kept") {
  bellows::cpu::executor exec(1);
  bellows::archetypes::collective solo;
  // At 10% of n = 400000 the 2048-element sample expects h = 205 hits (sd 13.6); t_lo at
  // rank h + 2 sd lets through about 1.14 k, inside [k, 1.25 k], so the candidates are kept
  // as they are. (At 1% the same sample lets through about 1.5 k, and k are selected exactly.)
  bellows::topk<> c({.ratio = 0.1, .mode = bellows::topk_mode::approximate, .feedback = bellows::feedback::none}, exec);
  const std::size_t n = 400000;
  auto st = c.make_state({0, "w", bellows::shape{n}});
  const std::size_t k = st.k();
  int beyond_k = 0;
  for (int s = 0; s < 5; ++s) {
    auto x = bellows::testing::normal_floats(n, 60 + static_cast<unsigned>(s));
    const auto r = c.reduce(st, x, solo);
    const auto kept = static_cast<std::size_t>(std::count_if(x.begin(), x.end(), [](float v) { return v != 0.0f; }));
    CHECK(r.sent.kept == kept);
    CHECK(kept >= k);
    CHECK(kept <= k + (k + 3) / 4);
    CHECK(r.sent.bytes == bellows::sparse_payload_bytes(n, kept));
    beyond_k += kept > k;
  }
  CHECK(beyond_k >= 3);  // each step with probability about 0.93
}

TEST_CASE("topk: a state serves another ratio (Accordion's levels) and keeps its memory") {
  bellows::cpu::executor exec(1);
  bellows::archetypes::collective solo;
  bellows::topk<> low({.ratio = 0.5}, exec), high({.ratio = 0.01}, exec);
  const std::size_t n = 10000;
  auto st = low.make_state({0, "w", bellows::shape{n}});
  auto x = bellows::testing::normal_floats(n, 1);
  (void)high.reduce(st, x, solo);
  CHECK(st.k() == 100);
  const auto memory = copy(st.memory.values());
  x = bellows::testing::normal_floats(n, 2);
  std::vector<float> m(n);
  for (std::size_t i = 0; i < n; ++i) m[i] = x[i] + memory[i];
  (void)low.reduce(st, x, solo);
  CHECK(st.k() == 5000);
  CHECK(same_bits(x, sorted_top(m, 5000)));
  CHECK(st.step == 2);
  bellows::topk<> none({.feedback = bellows::feedback::none}, exec);
  CHECK_THROWS_WITH_AS((void)none.reduce(st, x, solo), doctest::Contains("feedback"), bellows::error);
}

TEST_CASE("topk: steady-state steps allocate nothing") {
  bellows::cpu::executor exec(1);
  bellows::archetypes::collective solo;
  for (double ratio : {0.01, 0.7}) {  // by allgather; by the dense allreduce
    bellows::topk<> c({.ratio = ratio}, exec);
    auto st = c.make_state({0, "w", bellows::shape{50000}});
    auto x = bellows::testing::normal_floats(50000, 3);
    (void)c.reduce(st, x, solo);  // the first step of each kind sizes its buffers
    (void)c.stage(st, x);
    c.commit(st);
    const std::size_t before = bellows::testing::allocations;
    for (int s = 0; s < 4; ++s) {
      x = bellows::testing::normal_floats(50000, 4);  // allocates; not counted below
      const std::size_t mark = bellows::testing::allocations;
      (void)c.reduce(st, x, solo);
      (void)c.stage(st, x);
      c.commit(st);
      CHECK(bellows::testing::allocations == mark);
    }
    CHECK(bellows::testing::allocations > before);
  }
}

TEST_CASE("topk: stage changes nothing until commit; commit needs a finite staged step") {
  bellows::cpu::executor exec(1);
  bellows::topk<> c({.ratio = 0.1}, exec);
  auto st = c.make_state({0, "w", bellows::shape{100}});
  CHECK_THROWS_WITH_AS(c.commit(st), doctest::Contains("no staged step"), bellows::error);
  auto x = bellows::testing::normal_floats(100, 5);
  const auto payload = c.stage(st, x);
  CHECK(payload.size() == c.max_payload_bytes(st));
  CHECK(std::all_of(st.memory.values().begin(), st.memory.values().end(), [](float v) { return v == 0.0f; }));
  CHECK(st.step == 0);
  c.commit(st);
  CHECK(st.step == 1);
  CHECK(std::count(st.memory.values().begin(), st.memory.values().end(), 0.0f) == 10);
  CHECK_THROWS_AS(c.commit(st), bellows::error);
  x[3] = std::numeric_limits<float>::infinity();
  CHECK(c.validate(st, c.stage(st, x)) == bellows::step_status::non_finite);
  CHECK_THROWS_AS(c.commit(st), bellows::error);
}

TEST_CASE("topk: save and load restore the step and the memory") {
  bellows::testing::check_save_load([](bellows::cpu::executor& exec) { return bellows::topk<>({.ratio = 0.1}, exec); });
}

namespace {

/// n floats of zero-filled address space that cost memory only where written (or nothing, when
/// the system refuses the mapping: empty then).
struct mapped_floats {
  float* data = nullptr;
  std::size_t n = 0;
  explicit mapped_floats(std::size_t count) {
    void* p = ::mmap(nullptr, count * sizeof(float), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return;
    (void)::madvise(p, count * sizeof(float), MADV_HUGEPAGE);  // reads then map the huge zero page
    data = static_cast<float*>(p);
    n = count;
  }
  mapped_floats(const mapped_floats&) = delete;
  mapped_floats& operator=(const mapped_floats&) = delete;
  ~mapped_floats() {
    if (data != nullptr) ::munmap(data, n * sizeof(float));
  }
  std::span<float> span() { return {data, n}; }
};

}  // namespace

TEST_CASE("sparse payloads: 32-bit indices below 2^32 elements, 64-bit from 2^32 on; their sizes are checked") {
  using bellows::sparse_payload_bytes;
  using bellows::wide_indices;
  constexpr std::uint64_t two32 = std::uint64_t{1} << 32;
  CHECK_FALSE(wide_indices(0));
  CHECK_FALSE(wide_indices(std::uint64_t{1} << 31));  // signed 32-bit would overflow here; unsigned does not
  CHECK_FALSE(wide_indices(two32 - 1));               // the largest index, 2^32 - 2, fits 32 bits
  CHECK(wide_indices(two32));
  CHECK(wide_indices(~std::uint64_t{0}));
  // Header, then 3 indices of 4 or 8 bytes, then 3 floats, padded to 8.
  CHECK(sparse_payload_bytes(two32 - 1, 3) == 40 + 24);
  CHECK(sparse_payload_bytes(two32, 3) == 40 + 40);
  // Counts whose bytes do not fit std::size_t raise instead of wrapping.
  CHECK_THROWS_WITH_AS((void)sparse_payload_bytes(two32 * 4, std::size_t{1} << 61), doctest::Contains("overflows"),
                       bellows::error);
  CHECK_THROWS_AS((void)sparse_payload_bytes(100, std::size_t{1} << 62), bellows::error);
  CHECK_THROWS_AS((void)sparse_payload_bytes(two32, (std::size_t{1} << 61) - 1), bellows::error);  // + the floats
  // A compressor's state for a layer of 2^32 + 5 elements sizes its payloads with 64-bit indices.
  bellows::cpu::executor exec(1);
  const bellows::topk<> c({.k = 4, .feedback = bellows::feedback::none}, exec);
  const auto st = c.make_state({0, "embedding", bellows::shape{two32 + 5}});
  CHECK(c.max_payload_bytes(st) == 40 + 32 + 16);
  const auto narrow = c.make_state({0, "embedding", bellows::shape{two32 - 1}});
  CHECK(c.max_payload_bytes(narrow) == 40 + 16 + 16);
}

TEST_CASE("topk: a layer of more than 2^32 elements carries indices past 2^32 through encode and decode") {
  constexpr std::size_t two32 = std::size_t{1} << 32, n = two32 + 4096;
  const bellows::layer_info layer{0, "embedding", bellows::shape{n}};
  const std::pair<std::uint64_t, float> spikes[] = {{5, -3.0f}, {two32 - 1, 4.0f}, {two32, -5.0f}, {n - 1, 6.0f}};

  // The codec alone, without any dense buffer: write the payload of four entries, read it back.
  payload_storage buf(bellows::sparse_payload_bytes(n, 4));
  const auto [index, value] =
      bellows::payload_entries<std::uint64_t>(buf.bytes().data() + bellows::wire::header_bytes, 4);
  for (std::size_t j = 0; j < 4; ++j) {
    index[j] = spikes[j].first;
    value[j] = spikes[j].second;
  }
  bellows::cpu::executor one(1);
  const unsigned finite = 0;
  const std::uint64_t four = 4;
  bellows::cpu::finish_payload(one, buf.bytes(), bellows::sparse_payload_of(bellows::topk_method::codec.id, n, 4, 4),
                               {&finite, &four});
  const auto payload = buf.bytes().first(bellows::sparse_payload_bytes(n, 4));
  CHECK(bellows::wire::reader(payload, bellows::topk_method::codec).head().flags == bellows::wire::flag::index64);
  const auto entries = bellows::detail::read_sparse(payload, bellows::topk_method::codec, layer, 4, 4);
  REQUIRE(entries.index64.size() == 4);
  CHECK(entries.index32.empty());
  for (std::size_t j = 0; j < 4; ++j) {
    CHECK(entries.index64[j] == spikes[j].first);
    CHECK(entries.value[j] == spikes[j].second);
  }
  // An index at n, and the same entries claimed as 32-bit, are refused.
  {
    payload_storage bad(payload.size());
    std::memcpy(bad.bytes().data(), payload.data(), payload.size());
    const std::uint64_t past = n;
    std::memcpy(bad.bytes().data() + bellows::wire::header_bytes + 24, &past, 8);
    CHECK_THROWS_WITH_AS(
        (void)bellows::detail::read_sparse(bad.bytes().first(payload.size()), bellows::topk_method::codec, layer, 4, 4),
        doctest::Contains("has index 4294971392"), bellows::wire_error);
    bad.bytes()[7] = std::byte{0};
    CHECK_THROWS_WITH_AS(
        (void)bellows::detail::read_sparse(bad.bytes().first(payload.size()), bellows::topk_method::codec, layer, 4, 4),
        doctest::Contains("32-bit indices"), bellows::wire_error);
  }

  // The compressor end to end, on 16 GiB of mapped zeros (the pages written cost memory). Not
  // under AddressSanitizer: its instrumented passes over 2^32 elements take a minute and a half of
  // the sanitizer stage, and the widths are the same code (checked here without it).
#if defined(__SANITIZE_ADDRESS__)
  MESSAGE("AddressSanitizer: the end-to-end part is skipped");
  return;
#endif
  mapped_floats in(n), acc(n);
  if (in.data == nullptr || acc.data == nullptr) {
    MESSAGE("no 16 GiB mapping here: the end-to-end part is skipped");
    return;
  }
  for (const auto& [i, v] : spikes) in.data[i] = v;
  bellows::cpu::executor exec(1);
  const bellows::topk<> c({.k = 4, .feedback = bellows::feedback::none}, exec);
  auto st = c.make_state(layer);
  payload_storage out(c.max_payload_bytes(st));
  const auto encoded = c.encode(st, in.span(), out.bytes());
  const auto got = bellows::detail::read_sparse(encoded, bellows::topk_method::codec, layer, 4, 4);
  REQUIRE(got.index64.size() == 4);
  for (std::size_t j = 0; j < 4; ++j) {
    CHECK(got.index64[j] == spikes[j].first);
    CHECK(got.value[j] == spikes[j].second);
  }
  CHECK(c.decode_add(st, encoded, acc.span()) == bellows::step_status::ok);
  for (const auto& [i, v] : spikes) CHECK(acc.data[i] == v);
  for (std::size_t i : {std::size_t{4}, std::size_t{6}, two32 - 2, two32 + 1, n - 2}) CHECK(acc.data[i] == 0.0f);
}
