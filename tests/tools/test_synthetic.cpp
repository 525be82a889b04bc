// SPDX-License-Identifier: Apache-2.0
#include "bellows-bench/synthetic.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace tool = bellows::tool;

TEST_CASE("parse_shape: AxBxC... of positive integers") {
  CHECK(tool::parse_shape("4096x4096") == bellows::shape{4096, 4096});
  CHECK(tool::parse_shape("7") == bellows::shape{7});
  CHECK(tool::parse_shape("2x3x4x5") == bellows::shape{2, 3, 4, 5});
  for (const char* bad : {"", "x", "4096x", "x4", "0x5", "4a", "-3", "4,4", "1x1x1x1x1x1x1x1x1", "99999999999999999999",
                          "4294967296x4294967296"}) {
    CAPTURE(bad);
    const std::string named = std::string("--shape '") + bad + "'";
    CHECK_THROWS_WITH_AS((void)tool::parse_shape(bad), doctest::Contains(named.c_str()), std::invalid_argument);
  }
}

TEST_CASE("synthetic_gradient: a function of (distribution, seed, index) alone") {
  bellows::cpu::executor one(1), two(2);
  for (const auto d : {tool::distribution::normal, tool::distribution::laplace, tool::distribution::lognormal}) {
    CAPTURE(tool::to_string(d));
    const std::size_t n = 3 * bellows::cpu::elementwise_chunk + 5;
    const auto a = tool::synthetic_gradient(d, n, 42, one);
    CHECK(a == tool::synthetic_gradient(d, n, 42, two));
    const auto prefix = tool::synthetic_gradient(d, 1001, 42, one);
    CHECK(std::equal(prefix.begin(), prefix.end(), a.begin()));
    CHECK(a != tool::synthetic_gradient(d, n, 43, one));
  }
}

TEST_CASE("synthetic_gradient: moments of each distribution, within 6 standard errors") {
  bellows::cpu::executor exec(2);
  const std::size_t n = std::size_t{1} << 18;
  const auto moments = [&](tool::distribution d) {
    const auto x = tool::synthetic_gradient(d, n, 7, exec);
    double sum = 0, sum_abs = 0, sum_sq = 0, negative = 0;
    for (const float v : x) {
      sum += v;
      sum_abs += std::fabs(v);
      sum_sq += double{v} * v;
      negative += v < 0;
    }
    return std::vector<double>{sum / n, sum_abs / n, sum_sq / n, negative / n};
  };
  const double se = 6 / std::sqrt(static_cast<double>(n));  // 6 standard errors of a unit-variance mean
  const auto normal = moments(tool::distribution::normal);
  CHECK(std::fabs(normal[0]) < se);
  CHECK(std::fabs(normal[1] - std::sqrt(2 / M_PI)) < se);
  CHECK(std::fabs(normal[2] - 1) < se * std::sqrt(2.0));  // Var(x^2) = 2
  const auto laplace = moments(tool::distribution::laplace);
  CHECK(std::fabs(laplace[0]) < se * std::sqrt(2.0));
  CHECK(std::fabs(laplace[1] - 1) < se);                    // |x| ~ Exp(1)
  CHECK(std::fabs(laplace[2] - 2) < se * std::sqrt(20.0));  // Var(x^2) = 24 - 4
  const auto lognormal = moments(tool::distribution::lognormal);
  CHECK(std::fabs(lognormal[1] - std::exp(0.5)) < se * 1.5);  // sd of exp(z) is 2.16
  CHECK(std::fabs(lognormal[3] - 0.5) < se * 0.5);
}
