// SPDX-License-Identifier: Apache-2.0
#include <bellows/cpu/skinny_gemm.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "../support/random.hpp"

namespace {

struct shape_case {
  std::size_t n, m;
};
// Tails in both directions (m not a multiple of the lane width, n not a multiple of four rows),
// one panel and several (at every rank), few rows and many.
const shape_case shapes[] = {{1, 1}, {3, 7}, {5, 8}, {17, 33}, {64, 48}, {9, 1100}, {130, 2051}, {6, 9001}};

std::vector<double> reference_p(const std::vector<float>& g, const std::vector<float>& e, std::size_t n, std::size_t m,
                                const std::vector<float>& q, std::size_t r) {
  std::vector<double> p(n * r, 0.0);
  for (std::size_t k = 0; k < r; ++k)
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < m; ++j)
        p[k * n + i] += (static_cast<double>(g[i * m + j]) + (e.empty() ? 0.0 : e[i * m + j])) * q[k * m + j];
  return p;
}

std::vector<double> reference_q(const std::vector<float>& g, const std::vector<float>& e, std::size_t n, std::size_t m,
                                const std::vector<float>& p, std::size_t r) {
  std::vector<double> q(m * r, 0.0);
  for (std::size_t k = 0; k < r; ++k)
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < m; ++j)
        q[k * m + j] += (static_cast<double>(g[i * m + j]) + (e.empty() ? 0.0 : e[i * m + j])) * p[k * n + i];
  return q;
}

/// |a - b| <= tol * (sum of |terms|), the bound of a float sum of that many terms.
void check_close(const std::vector<float>& got, const std::vector<double>& want, double scale) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(std::abs(got[i] - want[i]) <= 1e-5 * scale);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("project_rows and project_cols match a double reference, with and without a memory, for any thread count") {
  bellows::cpu::executor one(1), three(3);
  for (const auto [n, m] : shapes) {
    for (std::size_t r : {1u, 2u, 3u, 4u, 5u, 9u}) {
      for (bool memory : {true, false}) {
        CAPTURE(n);
        CAPTURE(m);
        CAPTURE(r);
        CAPTURE(memory);
        const auto g = bellows::testing::normal_floats(n * m, n + 7 * m);
        const auto e = memory ? bellows::testing::normal_floats(n * m, n + 11 * m) : std::vector<float>{};
        const auto q = bellows::testing::normal_floats(m * r, r);
        const auto pin = bellows::testing::normal_floats(n * r, r + 100);
        const bellows::compensated_matrix M{g, e, n, m};

        std::vector<float> p1(n * r), p3(n * r, -1.0f), q1(m * r), q3(m * r, -1.0f);
        bellows::cpu::project_rows(one, M, q, p1);
        bellows::cpu::project_rows(three, M, q, p3);
        bellows::cpu::project_cols(one, M, pin, q1);
        bellows::cpu::project_cols(three, M, pin, q3);
        CHECK(same_bits(p1, p3));
        CHECK(same_bits(q1, q3));
        // Terms are products of two normals (of sum variance 2 with a memory): scale by the count.
        check_close(p1, reference_p(g, e, n, m, q, r), 8.0 * static_cast<double>(m));
        check_close(q1, reference_q(g, e, n, m, pin, r), 8.0 * static_cast<double>(n));
      }
    }
  }
}

TEST_CASE("reconstruct_update writes P Q^T and leaves M - P Q^T in the memory") {
  bellows::cpu::executor one(1), three(3);
  for (const auto [n, m] : shapes) {
    for (std::size_t r : {1u, 3u, 4u, 6u}) {
      CAPTURE(n);
      CAPTURE(m);
      CAPTURE(r);
      const auto g = bellows::testing::normal_floats(n * m, 1);
      const auto e = bellows::testing::normal_floats(n * m, 2);
      const auto p = bellows::testing::normal_floats(n * r, 3);
      const auto q = bellows::testing::normal_floats(m * r, 4);
      auto g1 = g, e1 = e, g3 = g, e3 = e, g0 = g;
      bellows::cpu::reconstruct_update(one, g1, e1, n, m, p, q);
      bellows::cpu::reconstruct_update(three, g3, e3, n, m, p, q);
      bellows::cpu::reconstruct_update(one, g0, {}, n, m, p, q);
      CHECK(same_bits(g1, g3));
      CHECK(same_bits(e1, e3));
      CHECK(same_bits(g0, g1));
      // gated by a verdict: nothing written when it is not 0, the same bits when it is
      const float raised = 2.0f, clear = 0.0f;
      auto gs = g, es = e;
      bellows::cpu::reconstruct_update(three, gs, es, n, m, p, q, &raised);
      CHECK((same_bits(gs, g) && same_bits(es, e)));
      bellows::cpu::reconstruct_update(three, gs, es, n, m, p, q, &clear);
      CHECK((same_bits(gs, g1) && same_bits(es, e1)));
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < m; ++j) {
          double out = 0;
          for (std::size_t k = 0; k < r; ++k) out += static_cast<double>(p[k * n + i]) * q[k * m + j];
          const std::size_t x = i * m + j;
          CHECK(std::abs(g1[x] - out) <= 1e-5 * 4.0 * static_cast<double>(r));
          CHECK(std::abs(e1[x] - (static_cast<double>(g[x]) + e[x] - out)) <=
                1e-5 * (8.0 + 4.0 * static_cast<double>(r)));
        }
    }
  }
}

TEST_CASE("skinny products refuse factors of the wrong size") {
  bellows::cpu::executor one(1);
  std::vector<float> g(12), p(4 * 2), q(3 * 2), bad(5);
  const bellows::compensated_matrix M{g, {}, 4, 3};
  CHECK_THROWS_AS(bellows::cpu::project_rows(one, M, bad, p), bellows::error);
  CHECK_THROWS_AS(bellows::cpu::project_cols(one, M, bad, q), bellows::error);
  CHECK_THROWS_AS(bellows::cpu::project_rows(one, {g, bad, 4, 3}, q, p), bellows::error);
  CHECK_THROWS_AS(bellows::cpu::reconstruct_update(one, g, {}, 4, 3, p, bad), bellows::error);
}

TEST_CASE("skinny kernels: the baseline and the AVX2 build give the same bits") {
#if BELLOWS_X86_VERSIONS
  if (!__builtin_cpu_supports("avx2")) {
    MESSAGE("no AVX2 here: only the baseline build runs");
    return;
  }
  namespace d = bellows::cpu::detail;
  for (const auto& sc : shapes) {
    const std::size_t n = sc.n, m = sc.m;
    for (std::size_t r : {1u, 2u, 3u, 4u, 6u}) {
      CAPTURE(n);
      CAPTURE(m);
      CAPTURE(r);
      const auto g = bellows::testing::normal_floats(n * m, 5);
      const auto e = bellows::testing::normal_floats(n * m, 6);
      const auto p = bellows::testing::normal_floats(n * r, 7);
      const auto q = bellows::testing::normal_floats(m * r, 8);
      const bellows::compensated_matrix M{g, e, n, m};
      const auto both = [](const auto& body) {
        body(false);
        body(true);
      };
      std::vector<float> p_out[2], q_out[2], g_out[2], e_out[2];
      both([&](bool avx2) {
        p_out[avx2].assign(n * r, 0.0f);
        q_out[avx2].assign(m * r, 0.0f);
        g_out[avx2] = g;
        e_out[avx2] = e;
        const auto body = [&] {
          d::project_rows_range<true>(M, q, p_out[avx2], r, 0, n);
          d::project_cols_panel<true>(M, p, q_out[avx2], r, 0, m);
          for (std::size_t i = 0; i < n; ++i)
            d::reconstruct_row<true>(g_out[avx2].data() + i * m, e_out[avx2].data() + i * m, p.data() + i, n, q.data(),
                                     m, r);
        };
        if (avx2)
          d::run_avx2(body);
        else
          body();
      });
      CHECK(std::memcmp(p_out[0].data(), p_out[1].data(), n * r * sizeof(float)) == 0);
      CHECK(std::memcmp(q_out[0].data(), q_out[1].data(), m * r * sizeof(float)) == 0);
      CHECK(std::memcmp(g_out[0].data(), g_out[1].data(), n * m * sizeof(float)) == 0);
      CHECK(std::memcmp(e_out[0].data(), e_out[1].data(), n * m * sizeof(float)) == 0);
    }
  }
#else
  MESSAGE("not an x86-64 GCC or Clang build: there is no AVX2 build");
#endif
}
