// SPDX-License-Identifier: Apache-2.0
#include <bellows/cpu/sample.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <vector>

namespace {

std::vector<std::uint32_t> draw(const bellows::cpu::sample_plan& plan, std::uint64_t seed,
                                std::uint32_t step = 0) {
  bellows::cpu::executor exec(1);
  bellows::cpu::sample_workspace ws(plan);
  std::vector<std::uint32_t> out(plan.k);
  bellows::cpu::sample_indices(exec, plan, bellows::philox::stream{seed, step, 2, 0}, ws, std::span(out));
  // The workspace is left clean for the next draw.
  CHECK(std::all_of(ws.chosen.begin(), ws.chosen.end(), [](std::uint64_t w) { return w == 0; }));
  CHECK(std::all_of(ws.dropped.begin(), ws.dropped.end(), [](std::uint64_t w) { return w == 0; }));
  return out;
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

TEST_CASE("sample_indices: k distinct ascending indices below n, for every k including 0 and n") {
  for (std::uint64_t n : {1u, 2u, 3u, 64u, 65u, 1000u, 100003u}) {
    for (std::uint64_t k : {std::uint64_t{0}, std::uint64_t{1}, n / 100, n / 3, n / 2, n / 2 + 1, n - 1, n}) {
      if (k > n) continue;
      CAPTURE(n);
      CAPTURE(k);
      const auto plan = bellows::cpu::plan_sample(n, k);
      CHECK(plan.complement == (k > n - k));
      const auto v = draw(plan, 17);
      CHECK(v.size() == k);
      CHECK(distinct_ascending_below(v, n));
      CHECK(draw(plan, 17) == v);  // the key alone fixes the draw
    }
  }
}

TEST_CASE("sample_indices: extra rounds when the first batch yields too few distinct indices") {
  // A batch of chosen + 1 proposals almost never has enough distinct ones at this density.
  for (std::uint64_t k : {std::uint64_t{300}, std::uint64_t{700}}) {
    auto plan = bellows::cpu::plan_sample(1000, k);
    plan.batch = plan.chosen + 1;
    for (std::uint64_t seed = 0; seed < 20; ++seed) {
      const auto v = draw(plan, seed);
      CHECK(v.size() == k);
      CHECK(distinct_ascending_below(v, 1000));
    }
  }
}

TEST_CASE("sample_indices: another seed, step or rank gives another draw") {
  const auto plan = bellows::cpu::plan_sample(100000, 1000);
  const auto a = draw(plan, 1), b = draw(plan, 2), c = draw(plan, 1, 1);
  CHECK(a != b);
  CHECK(a != c);
}

TEST_CASE("sample_indices: index frequencies are uniform (chi-square, false alarm 1e-6)") {
  // z = 4.753 is the standard normal point of 1e-6. Every index should be kept k / n of the
  // draws; without replacement, sum (O_i - E)^2 / (E (1 - k/n)) * (n - 1) / n follows a
  // chi-square law with n - 1 degrees of freedom.
  struct setting {
    std::uint64_t n, k, draws;
  };
  for (const setting s : {setting{97, 5, 20000}, setting{1000, 990, 400}, setting{4096, 41, 4000},
                          setting{50000, 500, 200}}) {
    CAPTURE(s.n);
    CAPTURE(s.k);
    const auto plan = bellows::cpu::plan_sample(s.n, s.k);
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

TEST_CASE("sample_indices: every subset equally likely (chi-square over the 20 subsets of 3 of 6)") {
  const auto plan = bellows::cpu::plan_sample(6, 3);
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
      const auto p = bellows::cpu::plan_sample(n, k);
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
  CHECK_THROWS_AS((void)bellows::cpu::plan_sample(5, 6), bellows::error);
}

TEST_CASE("multiply_wide: the 128-bit product") {
  __extension__ using u128 = unsigned __int128;
  const std::uint64_t values[] = {0, 1, 0xFFFFFFFFu, 0x100000000u, 0x123456789ABCDEF0u, ~std::uint64_t{0}};
  for (std::uint64_t a : values)
    for (std::uint64_t b : values) {
      const u128 p = static_cast<u128>(a) * b;
      const auto w = bellows::cpu::multiply_wide(a, b);
      CHECK(w.high == static_cast<std::uint64_t>(p >> 64));
      CHECK(w.low == static_cast<std::uint64_t>(p));
    }
}
