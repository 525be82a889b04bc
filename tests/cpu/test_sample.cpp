// SPDX-License-Identifier: Apache-2.0
#include <bellows/cpu/sample.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <vector>

#include "../support/random.hpp"

namespace {

/// The indices of a draw, through draw_sample and gather_sample.
std::vector<std::uint32_t> draw(const bellows::sample_plan& plan, std::uint64_t seed, std::uint32_t step = 0) {
  bellows::cpu::executor exec(1);
  bellows::cpu::sample_workspace ws(plan);
  std::vector<std::uint32_t> index(plan.k);
  std::vector<float> value(plan.k);
  const std::vector<float> g(plan.n, 1.0f);
  bellows::cpu::draw_sample(exec, plan, bellows::philox::stream{seed, step, 2, 0}, ws);
  CHECK(bellows::cpu::gather_sample(exec, plan, ws, g, {}, {}, bellows::sparse_arrays<std::uint32_t>{index, value}));
  // The workspace is left clean for the next draw.
  CHECK(std::all_of(ws.chosen.begin(), ws.chosen.end(), [](std::uint64_t w) { return w == 0; }));
  CHECK(std::all_of(ws.dropped.begin(), ws.dropped.end(), [](std::uint64_t w) { return w == 0; }));
  return index;
}

bool distinct_ascending_below(const std::vector<std::uint32_t>& v, std::uint64_t n) {
  for (std::size_t j = 0; j < v.size(); ++j)
    if (v[j] >= n || (j > 0 && v[j] <= v[j - 1])) return false;
  return true;
}

/// The upper `1 - alpha` point of the chi-square distribution with `dof` degrees of freedom,
/// by the Wilson-Hilferty approximation (relative error below 1% for dof >= 10); z is the
/// standard normal point of alpha.
double chi_square_critical(double dof, double z) {
  const double c = 2.0 / (9.0 * dof);
  return dof * std::pow(1.0 - c + z * std::sqrt(c), 3.0);
}

}  // namespace

TEST_CASE("draw_sample: k distinct ascending indices below n, for every k including 0 and n") {
  for (std::uint64_t n : {std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{3}, std::uint64_t{64}, std::uint64_t{65},
                          std::uint64_t{1000}, 3 * bellows::cpu::sparse_chunk + 7}) {
    for (std::uint64_t k : {std::uint64_t{0}, std::uint64_t{1}, n / 100, n / 3, n / 2, n / 2 + 1, n - 1, n}) {
      if (k > n) continue;
      CAPTURE(n);
      CAPTURE(k);
      const auto plan = bellows::plan_sample(n, k);
      CHECK(plan.complement == (k > n - k));
      const auto v = draw(plan, 17);
      CHECK(v.size() == k);
      CHECK(distinct_ascending_below(v, n));
      CHECK(draw(plan, 17) == v);  // the key alone fixes the draw
    }
  }
}

TEST_CASE("draw_sample: extra rounds when the first batch yields too few distinct indices") {
  // A batch of chosen + 1 proposals almost never has enough distinct ones at this density.
  for (std::uint64_t k : {std::uint64_t{300}, std::uint64_t{700}}) {
    auto plan = bellows::plan_sample(1000, k);
    plan.batch = plan.chosen + 1;
    for (std::uint64_t seed = 0; seed < 20; ++seed) {
      const auto v = draw(plan, seed);
      CHECK(v.size() == k);
      CHECK(distinct_ascending_below(v, 1000));
    }
  }
}

TEST_CASE("draw_sample: another seed, step or rank gives another draw") {
  const auto plan = bellows::plan_sample(100000, 1000);
  const auto a = draw(plan, 1), b = draw(plan, 2), c = draw(plan, 1, 1);
  CHECK(a != b);
  CHECK(a != c);
}

TEST_CASE("draw_sample: index frequencies are uniform (chi-square, false alarm 1e-6)") {
  // z = 4.753 is the standard normal point of 1e-6. Every index should be kept k / n of the
  // draws; without replacement, sum (O_i - E)^2 / (E (1 - k/n)) * (n - 1) / n follows a
  // chi-square law with n - 1 degrees of freedom.
  struct setting {
    std::uint64_t n, k, draws;
  };
  for (const setting s :
       {setting{97, 5, 20000}, setting{1000, 990, 400}, setting{4096, 41, 4000}, setting{50000, 500, 200}}) {
    CAPTURE(s.n);
    CAPTURE(s.k);
    const auto plan = bellows::plan_sample(s.n, s.k);
    std::vector<double> count(s.n, 0.0);
    for (std::uint64_t d = 0; d < s.draws; ++d)
      for (std::uint32_t i : draw(plan, 1000 + d)) count[i] += 1;
    const double p = static_cast<double>(s.k) / static_cast<double>(s.n);
    const double expected = p * static_cast<double>(s.draws);
    double stat = 0;
    for (double c : count) stat += (c - expected) * (c - expected);
    stat *= static_cast<double>(s.n - 1) / (static_cast<double>(s.n) * expected * (1.0 - p));
    CHECK(stat < chi_square_critical(static_cast<double>(s.n - 1), 4.753));
  }
}

TEST_CASE("draw_sample: every subset equally likely (chi-square over the 20 subsets of 3 of 6)") {
  const auto plan = bellows::plan_sample(6, 3);
  std::map<std::vector<std::uint32_t>, double> count;
  const double draws = 40000;
  for (std::uint64_t d = 0; d < static_cast<std::uint64_t>(draws); ++d) count[draw(plan, d)] += 1;
  CHECK(count.size() == 20);
  double stat = 0;
  for (const auto& [subset, c] : count) stat += (c - draws / 20) * (c - draws / 20) / (draws / 20);
  CHECK(stat < 63.7);  // chi-square with 19 degrees of freedom: P(> 63.7) = 1e-6
}

TEST_CASE("plan_sample: a batch above the chosen count, within n, found with IEEE arithmetic") {
  for (std::uint64_t n : {2u, 10u, 1000u, 1u << 24, 1u << 30}) {
    for (std::uint64_t k : {std::uint64_t{1}, n / 100, n / 2, n - 1}) {
      if (k == 0) continue;
      const auto p = bellows::plan_sample(n, k);
      CAPTURE(n);
      CAPTURE(k);
      CHECK(p.chosen == std::min(k, n - k));
      if (p.chosen == 0) continue;
      CHECK(p.batch > p.chosen);
      CHECK(p.batch <= n);
      // Expected distinct indices of `batch` proposals: n (1 - (1 - 1/n)^batch) >= chosen.
      const double distinct = static_cast<double>(n) *
                              -std::expm1(static_cast<double>(p.batch) * std::log1p(-1.0 / static_cast<double>(n)));
      CHECK(distinct >= static_cast<double>(p.chosen));
    }
  }
  CHECK_THROWS_AS((void)bellows::plan_sample(5, 6), bellows::error);
}

TEST_CASE("multiply_wide: the 128-bit product") {
  __extension__ using u128 = unsigned __int128;
  const std::uint64_t values[] = {0, 1, 0xFFFFFFFFu, 0x100000000u, 0x123456789ABCDEF0u, ~std::uint64_t{0}};
  for (std::uint64_t a : values)
    for (std::uint64_t b : values) {
      const u128 p = static_cast<u128>(a) * b;
      const auto w = bellows::multiply_wide(a, b);
      CHECK(w.high == static_cast<std::uint64_t>(p >> 64));
      CHECK(w.low == static_cast<std::uint64_t>(p));
    }
}

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct gathered {
  bool finite = false;
  std::vector<std::uint32_t> index;
  std::vector<float> value, staged;
};

gathered gather(unsigned threads, const bellows::sample_plan& plan, const std::vector<float>& g,
                const std::vector<float>& e, float scale = 1.0f) {
  bellows::cpu::executor exec(threads);
  bellows::cpu::sample_workspace ws(plan);
  gathered r;
  r.index.resize(plan.k);
  r.value.resize(plan.k);
  r.staged.assign(e.empty() ? 0 : plan.n, -1.0f);
  bellows::cpu::draw_sample(exec, plan, bellows::philox::stream{3, 4, 5, 6}, ws);
  r.finite = bellows::cpu::gather_sample(exec, plan, ws, g, e, r.staged,
                                         bellows::sparse_arrays<std::uint32_t>{r.index, r.value}, scale);
  CHECK(std::all_of(ws.chosen.begin(), ws.chosen.end(), [](std::uint64_t w) { return w == 0; }));
  return r;
}

}  // namespace

TEST_CASE("gather_sample: scaled kept values; with a memory, staged = g + e with zeros where kept") {
  const std::size_t n = 2 * bellows::cpu::sparse_chunk + 37;  // a tail shorter than a block of 16
  const auto g = bellows::testing::normal_floats(n, 2);
  const auto e = bellows::testing::normal_floats(n, 3);
  std::vector<float> m(n);
  for (std::size_t i = 0; i < n; ++i) m[i] = g[i] + e[i];
  for (std::size_t k : {std::size_t{1}, n / 100, n / 2, n - 40, n}) {
    CAPTURE(k);
    const auto plan = bellows::plan_sample(n, k);
    const gathered plain = gather(1, plan, g, {}, 2.5f);
    REQUIRE(plain.finite);
    for (std::size_t j = 0; j < k; ++j) CHECK(plain.value[j] == 2.5f * g[plain.index[j]]);
    for (unsigned threads : {1u, 3u}) {
      const gathered r = gather(threads, plan, g, e);
      REQUIRE(r.finite);
      CHECK(r.index == plain.index);  // the draw does not depend on the data
      std::vector<float> expected_staged = m, expected(k);
      for (std::size_t j = 0; j < k; ++j) {
        expected[j] = m[r.index[j]];
        expected_staged[r.index[j]] = 0.0f;
      }
      CHECK(same_bits(r.value, expected));
      CHECK(same_bits(r.staged, expected_staged));
    }
  }
}

TEST_CASE("gather_sample: a NaN or Inf anywhere, kept or not, returns false") {
  const std::size_t n = 2 * bellows::cpu::sparse_chunk + 5;
  const auto plan = bellows::plan_sample(n, n / 50);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    for (std::size_t at : {std::size_t{0}, bellows::cpu::sparse_chunk + 3, n - 1}) {
      auto g = bellows::testing::normal_floats(n, 5);
      g[at] = bad;
      CHECK_FALSE(gather(2, plan, g, {}).finite);
      CHECK_FALSE(gather(1, plan, g, std::vector<float>(n, 0.25f)).finite);
    }
  }
  std::vector<float> g(n, 1.0f), e(n, 0.0f);
  g[9] = e[9] = std::numeric_limits<float>::max();  // finite parts, overflowing sum
  CHECK_FALSE(gather(1, plan, g, e).finite);
}
