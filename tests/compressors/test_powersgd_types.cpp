// SPDX-License-Identifier: Apache-2.0
#include <bellows/compressors/powersgd_types.hpp>

#include <doctest/doctest.h>

TEST_CASE("powersgd_params: the defaults of PyTorch's PowerSGDState, error feedback on") {
  const bellows::powersgd_params p;
  CHECK(p.rank == 1);
  CHECK(p.min_compression_rate == 2.0f);
  CHECK(p.warm_start);
  CHECK(p.orthogonalization_eps == 0.0f);
  CHECK(p.feedback == bellows::feedback::residual);
}
