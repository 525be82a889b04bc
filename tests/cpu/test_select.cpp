// SPDX-License-Identifier: Apache-2.0
#include <bellows/cpu/select.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../support/random.hpp"

namespace {

using bellows::cpu::select_chunk;

/// The reference: indices of the k largest |v|, ties to the lower index, in ascending order.
std::vector<std::uint32_t> sorted_top(const std::vector<float>& v, std::size_t k) {
  std::vector<std::uint32_t> order(v.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return std::abs(v[a]) > std::abs(v[b]); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

struct selection {
  bool finite = false;
  bool called = false;
  std::vector<std::uint32_t> index;
  std::vector<float> value;
  std::vector<float> staged;
};

selection select(unsigned threads, const bellows::select_plan& plan, const std::vector<float>& g,
                 const std::vector<float>& e = {}, std::size_t capacity = 0, std::uint32_t step = 0) {
  bellows::cpu::executor exec(threads);
  bellows::select_plan sized = plan;
  if (capacity != 0) sized.capacity = capacity;
  bellows::cpu::select_workspace ws(sized);
  selection s;
  s.staged.assign(e.empty() ? 0 : g.size(), -7.0f);
  s.finite = bellows::cpu::select_top(exec, plan, bellows::philox::stream{5, step, 1, 0}, g, e, s.staged, ws,
                                      [&](std::size_t count) {
                                        s.called = true;
                                        s.index.resize(count);
                                        s.value.resize(count);
                                        return bellows::sparse_arrays<std::uint32_t>{s.index, s.value};
                                      });
  return s;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Data of several kinds that stress the selection: ties, zeros, extremes.
std::vector<float> data(const std::string& kind, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> v = bellows::testing::normal_floats(n, seed);
  if (kind == "heavy") {
    std::student_t_distribution<float> t(1.5f);
    for (float& x : v) x = t(rng);
  } else if (kind == "equal") {
    std::fill(v.begin(), v.end(), -1.5f);
  } else if (kind == "levels") {  // few distinct magnitudes: ties at any threshold
    for (float& x : v) x = static_cast<float>(static_cast<int>(rng() % 7) - 3);
  } else if (kind == "signed_zeros") {
    for (std::size_t i = 0; i < n; ++i) v[i] = rng() % 5 == 0 ? v[i] : (rng() % 2 ? -0.0f : 0.0f);
  } else if (kind == "denormal") {
    for (float& x : v)
      x = std::numeric_limits<float>::denorm_min() * static_cast<float>(rng() % 50) * (rng() % 2 ? 1.0f : -1.0f);
  } else if (kind == "extreme") {  // huge and tiny magnitudes side by side
    const float scales[] = {
        std::numeric_limits<float>::max() / 4,   1e30f, 1.0f, 1e-30f, std::numeric_limits<float>::min(),
        std::numeric_limits<float>::denorm_min()};
    for (float& x : v) x *= scales[rng() % 6] / 4;
  } else if (kind == "sparse") {  // mostly exact zeros
    for (float& x : v) x = rng() % 200 == 0 ? x : 0.0f;
  } else if (kind == "concentrated") {  // the large values all in one corner
    for (std::size_t i = 0; i < n; ++i) v[i] *= i < n / 50 ? 1000.0f : 1.0f;
  }
  return v;
}

const char* const kinds[] = {"normal",   "heavy",   "equal",  "levels",      "signed_zeros",
                             "denormal", "extreme", "sparse", "concentrated"};

}  // namespace

TEST_CASE("select_top: the exact top-k of a stable sort, for data of every kind, size and k") {
  for (const std::string kind : kinds) {
    for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{7}, std::size_t{1000}, 3 * select_chunk + 5,
                          std::size_t{50021}}) {
      const std::vector<float> v = data(kind, n, n + 11);
      std::vector<std::size_t> ks{1, 2, n / 1000, n / 100 + 1, n / 16, n / 8 + 1, n / 2, n - 1, n};
      std::erase_if(ks, [&](std::size_t k) { return k == 0 || k > n; });
      for (std::size_t k : ks) {
        CAPTURE(kind);
        CAPTURE(n);
        CAPTURE(k);
        const auto plan = bellows::plan_select(n, k, k);
        const selection s = select(1, plan, v);
        REQUIRE(s.finite);
        CHECK(s.index == sorted_top(v, k));
        bool values_right = s.value.size() == s.index.size();
        for (std::size_t j = 0; values_right && j < s.index.size(); ++j)
          values_right = std::memcmp(&s.value[j], &v[s.index[j]], sizeof(float)) == 0;
        CHECK(values_right);
        if (n > 1000) {  // the thread count changes nothing
          const selection t = select(3, plan, v);
          CHECK(t.index == s.index);
          CHECK(same_bits(t.value, s.value));
        }
      }
    }
  }
}

TEST_CASE("select_top with a memory: selects from g + e, and stages g + e with zeros where kept") {
  const std::size_t n = 4 * select_chunk + 9;
  for (const std::string kind : {"normal", "sparse"}) {  // sparse: mostly zeros, zeros kept too
    const auto g = data(kind, n, 1);
    auto e = data(kind, n, 2);
    for (float& x : e) x *= 0.5f;
    std::vector<float> m(n);
    for (std::size_t i = 0; i < n; ++i) m[i] = g[i] + e[i];
    for (std::size_t k : {std::size_t{1}, n / 1000, n / 100, n / 5, n - 3}) {
      CAPTURE(kind);
      CAPTURE(k);
      for (unsigned threads : {1u, 2u}) {
        const selection s = select(threads, bellows::plan_select(n, k, k), g, e);
        REQUIRE(s.finite);
        CHECK(s.index == sorted_top(m, k));
        std::vector<float> expected = m;
        for (std::uint32_t i : s.index) expected[i] = 0.0f;
        CHECK(same_bits(s.staged, expected));
        for (std::size_t j = 0; j < s.index.size(); ++j) CHECK(s.value[j] == m[s.index[j]]);
      }
    }
  }
}

TEST_CASE("select_top: when the sample misleads or the workspace overflows, the result is the same") {
  const std::size_t n = 5 * select_chunk + 1;
  for (const std::string kind : {"normal", "levels", "concentrated"}) {
    CAPTURE(kind);
    const auto g = data(kind, n, 3);
    const auto e = data("normal", n, 4);
    std::vector<float> m(n);
    for (std::size_t i = 0; i < n; ++i) m[i] = g[i] + e[i];
    for (std::size_t k : {n / 200, n / 4}) {
      CAPTURE(k);
      const auto plan = bellows::plan_select(n, k, k);
      auto too_high = plan;  // the threshold above every sample: fewer than k candidates
      too_high.lower_rank = 1;
      too_high.upper_rank = 0;
      auto too_low = plan;  // an upper threshold with more than k elements above it
      too_low.upper_rank = too_low.lower_rank - 1;
      for (const auto& p : {plan, too_high, too_low}) {
        CHECK(select(1, p, g).index == sorted_top(g, k));
        CHECK(select(2, p, g, {}, 16).index == sorted_top(g, k));  // overflow
        const selection s = select(1, p, g, e, 16);
        CHECK(s.index == sorted_top(m, k));
        std::vector<float> expected = m;
        for (std::uint32_t i : s.index) expected[i] = 0.0f;
        CHECK(same_bits(s.staged, expected));
      }
    }
  }
}

TEST_CASE("select_top approximate: keeps between k and max_count elements, each at least as large as any left") {
  const std::size_t n = 200000;
  for (const std::string kind : {"normal", "heavy", "levels"}) {
    const auto v = data(kind, n, 8);
    for (std::size_t k : {std::size_t{2000}, std::size_t{200}}) {
      CAPTURE(kind);
      CAPTURE(k);
      const std::size_t most = k + (k + 3) / 4;
      std::size_t above_k = 0;
      for (std::uint32_t step = 0; step < 8; ++step) {
        const selection s = select(1, bellows::plan_select(n, k, most), v, {}, 0, step);
        REQUIRE(s.finite);
        CHECK(s.index.size() >= k);
        CHECK(s.index.size() <= most);
        above_k += s.index.size() > k;
        CHECK(std::is_sorted(s.index.begin(), s.index.end()));
        float smallest_kept = std::numeric_limits<float>::infinity();
        for (std::uint32_t i : s.index) smallest_kept = std::min(smallest_kept, std::abs(v[i]));
        std::vector<bool> kept(n);
        for (std::uint32_t i : s.index) kept[i] = true;
        float largest_left = 0;
        for (std::size_t i = 0; i < n; ++i)
          if (!kept[i]) largest_left = std::max(largest_left, std::abs(v[i]));
        CHECK(largest_left <= smallest_kept);
      }
      if (kind == "normal" && k == 2000) CHECK(above_k > 0);  // it does approximate
    }
  }
}

TEST_CASE("select_top: a NaN or Inf anywhere returns false before anything is emitted") {
  const std::size_t n = 3 * select_chunk + 21;
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
  for (std::size_t k : {std::size_t{1}, n / 100, n / 3, n}) {
    const auto plan = bellows::plan_select(n, k, k);
    for (float bad : bad_values) {
      for (std::size_t at : {std::size_t{0}, select_chunk - 1, select_chunk, n - 1}) {
        CAPTURE(k);
        CAPTURE(at);
        auto g = bellows::testing::normal_floats(n, 9);
        g[at] = bad;
        const selection s = select(2, plan, g);
        CHECK_FALSE(s.finite);
        CHECK_FALSE(s.called);
        CHECK_FALSE(select(1, plan, g, std::vector<float>(n, 0.5f)).finite);
      }
    }
    // Finite g and e whose sum overflows.
    std::vector<float> g(n, 1.0f), e(n, 0.0f);
    g[n / 2] = e[n / 2] = std::numeric_limits<float>::max();
    CHECK_FALSE(select(1, plan, g, e).finite);
  }
}

TEST_CASE("kth_largest_key: the key at rank r of a descending sort, and how many keys exceed it") {
  std::mt19937 rng(4);
  for (std::size_t n : {1u, 5u, 1000u, 70000u}) {
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(static_cast<int>(rng() % 41) - 20) * (rng() % 3 ? 1.0f : 1e-20f);
    std::vector<std::uint32_t> keys(n), scratch(n);
    for (std::size_t i = 0; i < n; ++i) keys[i] = bellows::magnitude_key(v[i]);
    std::sort(keys.begin(), keys.end(), std::greater<>());
    for (std::size_t rank : {std::size_t{1}, n / 3 + 1, n}) {
      const auto r = bellows::cpu::kth_largest_key(v, rank, scratch);
      CHECK(r.key == keys[rank - 1]);
      CHECK(r.above == static_cast<std::size_t>(
                           std::count_if(keys.begin(), keys.end(), [&](std::uint32_t k) { return k > r.key; })));
    }
  }
}

TEST_CASE("plan_select: thresholds inside the sample, an upper one only for large k, none for k = n") {
  for (std::size_t n : {std::size_t{1}, std::size_t{100}, std::size_t{1} << 20, std::size_t{1} << 26}) {
    for (std::size_t k : {std::size_t{1}, n / 1000, n / 100, n / 8, n / 8 + 1, n / 2, n}) {
      if (k == 0) continue;
      CAPTURE(n);
      CAPTURE(k);
      const auto p = bellows::plan_select(n, k, k);
      CHECK(p.sample <= std::min<std::size_t>(n, 32768));
      if (k == n) {
        CHECK(p.sample == 0);
        continue;
      }
      CHECK(p.lower_rank >= 1);
      CHECK(p.lower_rank <= p.sample);
      CHECK(p.upper_rank < p.lower_rank);
      if (k <= n / 8) CHECK(p.upper_rank == 0);
      CHECK(p.capacity <= n);
      // The lower threshold sits above about k of n: its rank exceeds the expected sample count.
      CHECK(static_cast<double>(p.lower_rank) >=
            static_cast<double>(k) * static_cast<double>(p.sample) / static_cast<double>(n));
    }
  }
  CHECK_THROWS_AS((void)bellows::plan_select(10, 0, 0), bellows::error);
  CHECK_THROWS_AS((void)bellows::plan_select(10, 5, 11), bellows::error);
}

TEST_CASE("select_top_dense: the same selection written densely, and the same staged residual") {
  const std::size_t n = 3 * select_chunk + 77;
  for (const std::string kind : {"normal", "levels", "sparse", "equal"}) {
    const auto g = data(kind, n, 21);
    const auto e = data("normal", n, 22);
    for (std::size_t k : {std::size_t{1}, n / 100, n / 3, n - 2, n}) {
      CAPTURE(kind);
      CAPTURE(k);
      auto plan = bellows::plan_select(n, k, k);
      for (int variant = 0; variant < 2; ++variant) {  // as planned; with the sample misleading
        if (variant == 1 && plan.sample != 0) plan.lower_rank = 1;
        const selection sparse = select(2, plan, g, e);
        bellows::cpu::executor exec(2);
        bellows::cpu::select_workspace ws(plan);
        std::vector<float> dense(n, -3.0f), staged(n, -7.0f);
        const auto kept =
            bellows::cpu::select_top_dense(exec, plan, bellows::philox::stream{5, 0, 1, 0}, g, e, staged, ws, dense);
        REQUIRE(kept.has_value());
        CHECK(*kept == k);
        std::vector<float> expected(n, 0.0f);
        for (std::size_t j = 0; j < sparse.index.size(); ++j) expected[sparse.index[j]] = sparse.value[j];
        CHECK(dense == expected);
        CHECK(same_bits(staged, sparse.staged));
      }
    }
  }
  auto g = bellows::testing::normal_floats(n, 3);
  g[n - 1] = std::numeric_limits<float>::infinity();
  bellows::cpu::executor exec(1);
  const auto plan = bellows::plan_select(n, n / 100, n / 100);
  bellows::cpu::select_workspace ws(plan);
  std::vector<float> dense(n);
  CHECK_FALSE(bellows::cpu::select_top_dense(exec, plan, bellows::philox::stream{}, g, {}, {}, ws, dense).has_value());
}
