// SPDX-License-Identifier: Apache-2.0
#include <bellows/core/gather_buffer.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <vector>

TEST_CASE("gather_buffer: blocks in rank order, each at a multiple of 8 bytes") {
  bellows::gather_buffer g;
  const std::vector<std::size_t> sizes{5, 0, 16, 3};
  g.resize(sizes);
  REQUIRE(g.blocks() == 4);
  CHECK(g.total_bytes() == 24);
  for (std::size_t r = 0; r < 4; ++r) CHECK(g.block(r).size() == sizes[r]);
  CHECK(g.block(2).data() - g.block(0).data() == 8);
  CHECK(g.block(3).data() - g.block(0).data() == 24);
  CHECK_THROWS_AS((void)g.block(4), bellows::error);
}

TEST_CASE("gather_buffer: sizes whose padded total overflows raise naming the rank and change nothing") {
  constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
  bellows::gather_buffer g;
  const std::vector<std::size_t> good{4, 12};
  g.resize(good);
  g.block(1)[0] = std::byte{42};
  // A peer's size of 2^64 - 3 bytes padded to 8 wrapped to 0; two halves of 2^63 summed to 0.
  for (const std::vector<std::size_t>& bad :
       {std::vector<std::size_t>{4, max - 2}, std::vector<std::size_t>{std::size_t{1} << 63, std::size_t{1} << 63},
        std::vector<std::size_t>{8, max / 2, max / 2}}) {
    CHECK_THROWS_WITH_AS(g.resize(bad), doctest::Contains("rank"), bellows::error);
    CHECK(g.blocks() == 2);
    CHECK(g.block(1).size() == 12);
    CHECK(g.block(1)[0] == std::byte{42});
  }
}
