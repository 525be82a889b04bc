// SPDX-License-Identifier: Apache-2.0
#include <bellows/compressors/topk_types.hpp>

#include <doctest/doctest.h>

TEST_CASE("topk_params: exact selection of 1% with residual feedback, unless told otherwise") {
  constexpr bellows::topk_params p;
  static_assert(p.ratio == 0.01 && p.k == 0 && p.mode == bellows::topk_mode::exact);
  CHECK(p.feedback == bellows::feedback::residual);
  CHECK(p.dense_switch);
  CHECK(bellows::to_string(bellows::topk_mode::exact) == "exact");
  CHECK(bellows::to_string(bellows::topk_mode::approximate) == "approximate");
}
