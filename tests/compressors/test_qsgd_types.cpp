// SPDX-License-Identifier: Apache-2.0
#include <bellows/compressors/qsgd_types.hpp>

#include <doctest/doctest.h>

TEST_CASE("qsgd_params: 8 bits, buckets of 512, L2 scale, no error feedback by default") {
  const bellows::qsgd_params p;
  CHECK(p.bits == 8);
  CHECK(p.bucket == 512);
  CHECK(p.norm == bellows::qsgd_norm::l2);
  CHECK(p.feedback == bellows::feedback::none);
}
