// SPDX-License-Identifier: Apache-2.0
#include <bellows/core/shape.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <vector>

TEST_CASE("shape: size, matrix view and text") {
  const bellows::shape conv{64, 32, 3, 3};
  CHECK(conv.rank() == 4);
  CHECK(conv.size() == 64 * 32 * 9);
  CHECK(conv.rows() == 64);
  CHECK(conv.cols() == 32 * 9);
  CHECK(conv.to_string() == "64x32x3x3");

  const bellows::shape vec = bellows::shape::vector(10);
  CHECK(vec.rows() == 10);
  CHECK(vec.cols() == 1);

  const bellows::shape scalar{};
  CHECK(scalar.size() == 1);
  CHECK(scalar.rows() == 1);
  CHECK(scalar.cols() == 1);
  CHECK(scalar.to_string() == "scalar");

  const bellows::shape empty{0, 5};
  CHECK(empty.size() == 0);
  CHECK(empty.rows() == 0);
  CHECK(empty.cols() == 5);

  CHECK(bellows::shape{2, 3} == bellows::shape{2, 3});
  CHECK_FALSE(bellows::shape{2, 3} == bellows::shape{3, 2});
  CHECK_FALSE(bellows::shape{6} == bellows::shape{6, 1});
}

TEST_CASE("shape: overflowing element counts and too many dimensions are refused") {
  const std::size_t big = std::size_t{1} << 40;
  CHECK_THROWS_WITH_AS(bellows::shape({big, big}), doctest::Contains("overflows"), bellows::error);
  CHECK_NOTHROW(bellows::shape({big, 1024}));
  CHECK_THROWS_AS(bellows::shape({1, 1, 1, 1, 1, 1, 1, 1, 1}), bellows::error);
}
