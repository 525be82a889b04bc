// SPDX-License-Identifier: Apache-2.0
// PowerSGD's device kernels against the CPU's on the same seeded inputs: the products within
// the rounding bound of a float dot product, the fused reconstruction bit for bit, the device
// Gram-Schmidt orthonormal and close to the CPU's, and every kernel deterministic.
//
// cuda/skinny_gemm.cuh brings cpu/skinny_gemm.hpp (with nvcc's note on its GCC loop hints
// silenced), so it is included first.
#include <bellows/cuda/skinny_gemm.cuh>
#include <bellows/cuda/gram_schmidt.cuh>
#include <bellows/cpu/gram_schmidt.hpp>
#include <bellows/cpu/skinny_gemm.hpp>
#include <bellows/cpu/executor.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "../support/random.hpp"
#include "device_test.cuh"

using bellows::test::device_array;
using bellows::test::same_bytes;

namespace {

struct shape_case {
  std::size_t n, m;
};
// 1 x 1; odd sizes (one float per load); a tall matrix with few columns (several row groups and
// row lanes per block) and many row tiles; a wide one with a single row tile (project_cols
// writes Q directly); 16-byte rows with several tiles each way.
const shape_case shapes[] = {{1, 1}, {37, 1001}, {3000, 24}, {5, 20000}, {300, 512}, {129, 257}};

/// gamma(k) = k u / (1 - k u), u = 2^-24: a float dot product of k terms, in any order, fused
/// or not, is within gamma(k) * (sum of |terms|) of the exact one (Higham, Accuracy and
/// Stability, 3.1). The CPU and the device each are, so they differ by at most twice that.
double gamma(std::size_t k) {
  const double ku = static_cast<double>(k) * 0x1p-24;
  return ku / (1.0 - ku);
}

/// M = g + e as both backends round it (g alone without e).
std::vector<float> compensated(const std::vector<float>& g, const std::vector<float>& e) {
  std::vector<float> m = g;
  for (std::size_t x = 0; x < e.size(); ++x) m[x] = g[x] + e[x];
  return m;
}

/// A device copy of `host` that starts `shift` floats into its buffer (shift 1: not 16-byte aligned).
struct shifted_array {
  device_array<float> buffer;
  std::size_t shift, n;
  shifted_array(const std::vector<float>& host, std::size_t s) : buffer(pad(host, s)), shift(s), n(host.size()) {}
  static std::vector<float> pad(const std::vector<float>& host, std::size_t s) {
    if (host.empty()) return {};
    std::vector<float> v(s, -7.0f);
    v.insert(v.end(), host.begin(), host.end());
    return v;
  }
  [[nodiscard]] std::span<float> span() const { return n == 0 ? std::span<float>() : buffer.span().subspan(shift); }
  [[nodiscard]] std::vector<float> host() const {
    const std::vector<float> all = buffer.host();
    return all.empty() ? all : std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(shift), all.end());
  }
};

void compare_products(std::size_t n, std::size_t m, std::size_t r, bool memory, std::size_t shift) {
  CAPTURE(n);
  CAPTURE(m);
  CAPTURE(r);
  CAPTURE(memory);
  CAPTURE(shift);
  static bellows::cpu::executor host(2);
  static bellows::cuda::executor dev;
  const auto g = bellows::testing::normal_floats(n * m, n + 7 * m);
  const auto e = memory ? bellows::testing::normal_floats(n * m, n + 11 * m) : std::vector<float>{};
  const auto q = bellows::testing::normal_floats(m * r, r);
  const auto p_in = bellows::testing::normal_floats(n * r, r + 100);
  std::vector<float> p(n * r), q_out(m * r);
  bellows::cpu::project_rows(host, {g, e, n, m}, q, p);
  bellows::cpu::project_cols(host, {g, e, n, m}, p_in, q_out);

  const shifted_array dg(g, shift), de(e, shift);
  device_array<float> dq(q), dp_in(p_in), dp(std::vector<float>(n * r, -1.0f));
  device_array<float> dq_out(std::vector<float>(m * r, -1.0f));
  dev.reserve(bellows::cuda::project_cols_workspace_bytes(n, m, r));
  const bellows::compensated_matrix M{dg.span(), de.span(), n, m};
  bellows::cuda::project_rows(dev, M, dq.span(), dp.span());
  bellows::cuda::project_cols(dev, M, dp_in.span(), dq_out.span());
  const std::vector<float> got_p = dp.host(), got_q = dq_out.host();
  CHECK(same_bytes(dg.host(), g));  // M is only read
  CHECK(same_bytes(de.host(), e));

  const std::vector<float> x = compensated(g, e);
  std::size_t bad_p = 0, bad_q = 0;
  for (std::size_t k = 0; k < r; ++k) {
    for (std::size_t i = 0; i < n; ++i) {
      double bound = 0;
      for (std::size_t j = 0; j < m; ++j) bound += std::abs(static_cast<double>(x[i * m + j]) * q[k * m + j]);
      bad_p += std::abs(static_cast<double>(got_p[k * n + i]) - p[k * n + i]) > 2 * gamma(m) * bound;
    }
    for (std::size_t j = 0; j < m; ++j) {
      double bound = 0;
      for (std::size_t i = 0; i < n; ++i) bound += std::abs(static_cast<double>(x[i * m + j]) * p_in[k * n + i]);
      bad_q += std::abs(static_cast<double>(got_q[k * m + j]) - q_out[k * m + j]) > 2 * gamma(n) * bound;
    }
  }
  CHECK(bad_p == 0);
  CHECK(bad_q == 0);
}

/// sum_t a[i][t] * a[j][t] in double, columns of `rows` floats.
double dot(const std::vector<float>& a, std::size_t i, std::size_t j, std::size_t rows) {
  double s = 0;
  for (std::size_t t = 0; t < rows; ++t) s += static_cast<double>(a[i * rows + t]) * a[j * rows + t];
  return s;
}

/// Every column has norm 1 (or is zero, where `zero_allowed`) and is orthogonal to the others, to 1e-5.
void check_orthonormal(const std::vector<float>& a, std::size_t rows, bool zero_allowed) {
  const std::size_t rank = a.size() / rows;
  for (float v : a) REQUIRE(std::isfinite(v));
  for (std::size_t i = 0; i < rank; ++i) {
    CAPTURE(i);
    const double norm2 = dot(a, i, i, rows);
    CHECK((std::abs(norm2 - 1.0) < 1e-5 || (zero_allowed && norm2 == 0.0)));
    for (std::size_t j = 0; j < i; ++j) CHECK(std::abs(dot(a, i, j, rows)) < 1e-5);
  }
}

/// The device's orthogonalisation of `a`.
std::vector<float> device_orthogonalized(const std::vector<float>& a, std::size_t rows, float eps) {
  static bellows::cuda::executor dev;
  device_array<float> d(a);
  bellows::cuda::orthogonalize(dev, d.span(), rows, eps);
  return d.host();
}

}  // namespace

TEST_CASE("cuda project_rows and project_cols: the CPU's products within twice a float dot product's bound" *
          doctest::skip(bellows::test::no_device())) {
  for (const auto [n, m] : shapes)
    for (std::size_t r : {1u, 2u, 3u, 4u, 8u})
      for (bool memory : {false, true}) compare_products(n, m, r, memory, 0);
  // Rows of 16 bytes at an address that is not: the one-float path on a shape that would take 16-byte loads.
  compare_products(300, 512, 4, true, 1);
  compare_products(300, 512, 2, false, 1);
}

TEST_CASE("cuda reconstruct_update: the CPU's g and e, bit for bit, with and without a memory" *
          doctest::skip(bellows::test::no_device())) {
  bellows::cpu::executor host(2);
  bellows::cuda::executor dev;
  for (const auto [n, m] : shapes) {
    for (std::size_t r : {1u, 2u, 3u, 4u, 8u}) {
      for (std::size_t shift : {0u, 1u}) {
        CAPTURE(n);
        CAPTURE(m);
        CAPTURE(r);
        CAPTURE(shift);
        const auto g = bellows::testing::normal_floats(n * m, 1);
        const auto e = bellows::testing::normal_floats(n * m, 2);
        const auto p = bellows::testing::normal_floats(n * r, 3);
        const auto q = bellows::testing::normal_floats(m * r, 4);
        auto g1 = g, e1 = e, g0 = g;
        bellows::cpu::reconstruct_update(host, g1, e1, n, m, p, q);
        bellows::cpu::reconstruct_update(host, g0, {}, n, m, p, q);
        const shifted_array dg(g, shift), de(e, shift), dg0(g, shift);
        const device_array<float> dp(p), dq(q), raised(std::vector<float>{1.0f}), clear(std::vector<float>{0.0f});
        // gated by a verdict in device memory: nothing written while it is raised
        bellows::cuda::reconstruct_update(dev, dg.span(), de.span(), n, m, dp.span(), dq.span(), raised.span().data());
        CHECK((same_bytes(dg.host(), g) && same_bytes(de.host(), e)));
        bellows::cuda::reconstruct_update(dev, dg.span(), de.span(), n, m, dp.span(), dq.span(), clear.span().data());
        bellows::cuda::reconstruct_update(dev, dg0.span(), {}, n, m, dp.span(), dq.span());
        CHECK(same_bytes(dg.host(), g1));
        CHECK(same_bytes(de.host(), e1));
        CHECK(same_bytes(dg0.host(), g0));
      }
    }
  }
}

TEST_CASE("cuda orthogonalize: orthonormal columns close to the CPU's" * doctest::skip(bellows::test::no_device())) {
  bellows::cpu::executor host(1);
  for (std::size_t rows : {1u, 5u, 1001u, 8192u}) {
    for (std::size_t rank : {1u, 2u, 3u, 4u, 8u}) {
      if (rank > rows) continue;
      CAPTURE(rows);
      CAPTURE(rank);
      const auto a = bellows::testing::normal_floats(rows * rank, rows + rank);
      auto want = a;
      bellows::cpu::orthogonalize(host, want, rows, 0.0f);
      const std::vector<float> got = device_orthogonalized(a, rows, 0.0f);
      check_orthonormal(got, rows, false);
      // The same algorithm with sums in another order: the double sums round to the same floats
      // but in rare cases, a few units in the last place of values below 1.
      std::size_t far = 0;
      for (std::size_t x = 0; x < a.size(); ++x) far += std::abs(got[x] - want[x]) > 1e-5f;
      CHECK(far == 0);
    }
  }
}

TEST_CASE("cuda orthogonalize: zero columns stay zero, eps divides as SPEC says, rank-deficient input" *
          doctest::skip(bellows::test::no_device())) {
  for (float eps : {0.0f, 1e-8f}) {
    CAPTURE(eps);
    std::vector<float> a = bellows::testing::normal_floats(3 * 10, 1);
    for (std::size_t t = 0; t < 10; ++t) a[10 + t] = 0.0f;  // column 1
    const std::vector<float> got = device_orthogonalized(a, 10, eps);
    for (std::size_t t = 0; t < 10; ++t) CHECK(got[10 + t] == 0.0f);
    check_orthonormal(got, 10, true);
    CHECK(std::abs(dot(got, 2, 2, 10) - 1.0) < 1e-5);
    const std::vector<float> zeros = device_orthogonalized(std::vector<float>(20, 0.0f), 10, eps);
    for (float v : zeros) CHECK(v == 0.0f);
  }
  const std::vector<float> sized = device_orthogonalized({3.0f, 4.0f}, 2, 1.0f);
  CHECK(sized[0] == 3.0f / 6.0f);
  CHECK(sized[1] == 4.0f / 6.0f);

  // Columns 2 and 3 lie in the span of columns 0 and 1: what is left of them after the first
  // projections is rounding noise, which the second pass makes orthogonal before it is scaled up.
  const std::size_t rows = 1001;
  std::vector<float> a = bellows::testing::normal_floats(4 * rows, 9);
  for (std::size_t t = 0; t < rows; ++t) {
    a[2 * rows + t] = a[t] + 0.5f * a[rows + t];
    a[3 * rows + t] = 2.0f * a[t];
  }
  const std::vector<float> got = device_orthogonalized(a, rows, 0.0f);
  check_orthonormal(got, rows, true);
  CHECK(std::abs(dot(got, 1, 1, rows) - 1.0) < 1e-5);

  bellows::cuda::executor dev;
  device_array<float> three(3);
  CHECK_THROWS_AS(bellows::cuda::orthogonalize(dev, three.span(), 2, 0.0f), bellows::error);
  CHECK_THROWS_AS(bellows::cuda::orthogonalize(dev, three.span(), 3, -1.0f), bellows::error);
}

TEST_CASE("cuda PowerSGD step: a matrix of rank 2 rebuilt, no error left; two runs give the same bytes" *
          doctest::skip(bellows::test::no_device())) {
  // M = u1 v1^T + u2 v2^T split into g and e; rank 4 (two columns more than M needs).
  const std::size_t n = 700, m = 1000, r = 4;
  const auto u = bellows::testing::normal_floats(2 * n, 21), v = bellows::testing::normal_floats(2 * m, 22);
  std::vector<float> g(n * m), e = bellows::testing::normal_floats(n * m, 23);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) {
      const std::size_t x = i * m + j;
      g[x] = (u[i] * v[j] + u[n + i] * v[m + j]) - e[x];
    }
  const std::vector<float> full = compensated(g, e);
  double scale = 0;
  for (float x : full) scale = std::max(scale, static_cast<double>(std::abs(x)));

  const auto step = [&](std::vector<float>& g_out, std::vector<float>& e_out, std::vector<float>& p_out,
                        std::vector<float>& q_out) {
    bellows::cuda::executor dev;
    dev.reserve(bellows::cuda::project_cols_workspace_bytes(n, m, r));
    device_array<float> dg(g), de(e), dq(bellows::testing::normal_floats(m * r, 24)), dp(n * r);
    const bellows::compensated_matrix M{dg.span(), de.span(), n, m};
    bellows::cuda::orthogonalize(dev, dq.span(), m, 0.0f);
    bellows::cuda::project_rows(dev, M, dq.span(), dp.span());
    bellows::cuda::orthogonalize(dev, dp.span(), n, 0.0f);
    bellows::cuda::project_cols(dev, M, dp.span(), dq.span());
    bellows::cuda::reconstruct_update(dev, dg.span(), de.span(), n, m, dp.span(), dq.span());
    g_out = dg.host();
    e_out = de.host();
    p_out = dp.host();
    q_out = dq.host();
  };
  std::vector<float> g1, e1, p1, q1, g2, e2, p2, q2;
  step(g1, e1, p1, q1);
  step(g2, e2, p2, q2);
  CHECK(same_bytes(g1, g2));
  CHECK(same_bytes(e1, e2));
  CHECK(same_bytes(p1, p2));
  CHECK(same_bytes(q1, q2));
  check_orthonormal(p1, n, true);
  std::size_t far = 0;
  for (std::size_t x = 0; x < full.size(); ++x)
    far += std::abs(g1[x] - full[x]) > 1e-4 * scale || std::abs(e1[x]) > 1e-4 * scale;
  CHECK(far == 0);
}

TEST_CASE("cuda skinny products refuse factors of the wrong size and a workspace too small" *
          doctest::skip(bellows::test::no_device())) {
  bellows::cuda::executor dev;
  device_array<float> g(300 * 3), p(300 * 2), q(3 * 2), bad(5);
  const bellows::compensated_matrix M{g.span(), {}, 300, 3};
  CHECK_THROWS_AS(bellows::cuda::project_rows(dev, M, bad.span(), p.span()), bellows::error);
  CHECK_THROWS_AS(bellows::cuda::project_cols(dev, M, bad.span(), q.span()), bellows::error);
  CHECK_THROWS_AS(bellows::cuda::project_rows(dev, {g.span(), bad.span(), 300, 3}, q.span(), p.span()), bellows::error);
  CHECK_THROWS_AS(bellows::cuda::reconstruct_update(dev, g.span(), {}, 300, 3, p.span(), bad.span()), bellows::error);
  // 300 rows are three tiles of tile sums; the executor holds no workspace yet.
  CHECK(bellows::cuda::project_cols_workspace_bytes(300, 3, 2) > 0);
  CHECK(bellows::cuda::project_cols_workspace_bytes(128, 3, 2) == 0);
  CHECK_THROWS_AS(bellows::cuda::project_cols(dev, M, p.span(), q.span()), bellows::error);
  dev.reserve(bellows::cuda::project_cols_workspace_bytes(300, 3, 2));
  bellows::cuda::project_cols(dev, M, p.span(), q.span());
  dev.synchronize();
}
