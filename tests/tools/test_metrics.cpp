// SPDX-License-Identifier: Apache-2.0
#include "bellows-bench/metrics.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

namespace tool = bellows::tool;

TEST_CASE("compare: relative error and cosine of known pairs") {
  const std::vector<float> x{3, 4, 0}, zero(3, 0.0f);
  const auto same = tool::compare(x, x);
  CHECK(same.rel_error == 0);
  CHECK(same.cosine == doctest::Approx(1).epsilon(1e-15));
  const auto dropped = tool::compare(x, zero);
  CHECK(dropped.rel_error == 1);
  CHECK(dropped.cosine == 0);
  const auto doubled = tool::compare(x, std::vector<float>{6, 8, 0});
  CHECK(doubled.rel_error == 1);
  CHECK(doubled.cosine == doctest::Approx(1).epsilon(1e-15));
  const auto orthogonal = tool::compare(x, std::vector<float>{0, 0, 5});
  CHECK(orthogonal.rel_error == doctest::Approx(std::sqrt(2.0)).epsilon(1e-15));
  CHECK(orthogonal.cosine == 0);
  const auto both_zero = tool::compare(zero, zero);
  CHECK(both_zero.rel_error == 0);
  CHECK(both_zero.cosine == 1);
  CHECK(std::isinf(tool::compare(zero, x).rel_error));
  CHECK_THROWS_AS((void)tool::compare(x, std::vector<float>{1}), bellows::error);
}

TEST_CASE("median: middle element, or mean of the middle two") {
  CHECK(tool::median({5}) == 5);
  CHECK(tool::median({3, 1, 2}) == 2);
  CHECK(tool::median({4, 1, 3, 2}) == 2.5);
  CHECK_THROWS_AS((void)tool::median({}), bellows::error);
}
