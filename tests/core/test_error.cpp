// SPDX-License-Identifier: Apache-2.0
#include <bellows/core/error.hpp>

#include <doctest/doctest.h>

#include <string>

TEST_CASE("BELLOWS_EXPECTS passes silently when the condition holds") {
  const double ratio = 0.5;
  CHECK_NOTHROW(BELLOWS_EXPECTS(ratio > 0 && ratio <= 1, "ratio ", ratio));
}

TEST_CASE("BELLOWS_EXPECTS raises its message alone, without the condition") {
  const double ratio = 1.5;
  CHECK_THROWS_WITH_AS(BELLOWS_EXPECTS(ratio > 0 && ratio <= 1, "topk: ratio must be in (0, 1], got ", ratio),
                       "topk: ratio must be in (0, 1], got 1.5", bellows::error);
}

TEST_CASE("every bellows exception is a bellows::error and a std::runtime_error") {
  CHECK_THROWS_AS(throw bellows::wire_error("w"), bellows::error);
  CHECK_THROWS_AS(throw bellows::cuda_error("c"), bellows::error);
  CHECK_THROWS_AS(throw bellows::collective_error("c"), bellows::error);
  CHECK_THROWS_AS(throw bellows::error("e"), std::runtime_error);
  CHECK_THROWS_WITH_AS(bellows::fail<bellows::wire_error>("bad ", 7, " bytes"), "bad 7 bytes", bellows::wire_error);
}
