// SPDX-License-Identifier: Apache-2.0
#include <bellows/cpu/gram_schmidt.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "../support/random.hpp"

namespace {
double dot(const std::vector<float>& a, std::size_t i, std::size_t j, std::size_t rows) {
  double s = 0;
  for (std::size_t t = 0; t < rows; ++t) s += static_cast<double>(a[i * rows + t]) * a[j * rows + t];
  return s;
}
}  // namespace

TEST_CASE("orthogonalize: orthonormal columns spanning the same leading subspaces") {
  bellows::cpu::executor exec(1);
  for (std::size_t rows : {1u, 5u, 64u, 1001u}) {
    for (std::size_t rank : {1u, 2u, 4u, 8u}) {
      if (rank > rows) continue;
      CAPTURE(rows);
      CAPTURE(rank);
      const auto a = bellows::testing::normal_floats(rows * rank, rows + rank);
      auto q = a;
      bellows::cpu::orthogonalize(exec, q, rows, 0.0f);
      for (std::size_t i = 0; i < rank; ++i)
        for (std::size_t j = 0; j < rank; ++j) CHECK(std::abs(dot(q, i, j, rows) - (i == j ? 1.0 : 0.0)) < 1e-5);
      // Column 0 is column 0 of a, scaled: the same direction.
      const double c = dot(q, 0, 0, rows) == 0 ? 0 : q[0] / a[0];
      CHECK(c > 0);
      for (std::size_t t = 0; t < rows; ++t) CHECK(std::abs(q[t] - c * a[t]) < 1e-5);
    }
  }
}

TEST_CASE("orthogonalize: a column of zeros stays zero, never NaN, with or without eps") {
  bellows::cpu::executor exec(1);
  for (float eps : {0.0f, 1e-8f}) {
    std::vector<float> q = bellows::testing::normal_floats(3 * 10, 1);
    for (std::size_t t = 0; t < 10; ++t) q[10 + t] = 0.0f;  // column 1
    bellows::cpu::orthogonalize(exec, q, 10, eps);
    for (std::size_t t = 0; t < 10; ++t) CHECK(q[10 + t] == 0.0f);
    for (float v : q) CHECK(std::isfinite(v));
    CHECK(std::abs(dot(q, 2, 2, 10) - 1.0) < 1e-5);
    CHECK(std::abs(dot(q, 0, 2, 10)) < 1e-5);
    std::vector<float> zeros(20, 0.0f);
    bellows::cpu::orthogonalize(exec, zeros, 10, eps);
    for (float v : zeros) CHECK(v == 0.0f);
  }
  // A column that becomes zero once earlier columns are removed (a copy of column 0) stays
  // finite: its remainder is rounding noise, not NaN.
  std::vector<float> twin = bellows::testing::normal_floats(10, 2);
  twin.insert(twin.end(), twin.begin(), twin.end());
  bellows::cpu::orthogonalize(exec, twin, 10, 0.0f);
  for (float v : twin) CHECK(std::isfinite(v));
  // ... and, projected twice, orthogonal to column 0 (what lets P Q^T rebuild a low-rank M).
  CHECK(std::abs(dot(twin, 0, 1, 10)) < 1e-5);
}

TEST_CASE("orthogonalize: eps enlarges the divisor as SPEC says") {
  bellows::cpu::executor exec(1);
  std::vector<float> q{3.0f, 4.0f};
  bellows::cpu::orthogonalize(exec, q, 2, 1.0f);
  CHECK(q[0] == 3.0f / 6.0f);
  CHECK(q[1] == 4.0f / 6.0f);
  CHECK_THROWS_AS(bellows::cpu::orthogonalize(exec, q, 3, 0.0f), bellows::error);
  CHECK_THROWS_AS(bellows::cpu::orthogonalize(exec, q, 2, -1.0f), bellows::error);
}
