// SPDX-License-Identifier: Apache-2.0
#include <bellows/compressors/randk_types.hpp>

#include <doctest/doctest.h>

TEST_CASE("randk_params: 1% shared across ranks, unscaled, with residual feedback, unless told otherwise") {
  constexpr bellows::randk_params p;
  static_assert(p.ratio == 0.01 && p.k == 0 && p.mode == bellows::randk_mode::shared && !p.unbiased);
  CHECK(p.feedback == bellows::feedback::residual);
  CHECK(bellows::to_string(bellows::randk_mode::shared) == "shared");
  CHECK(bellows::to_string(bellows::randk_mode::per_rank) == "per_rank");
}
