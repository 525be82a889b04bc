// SPDX-License-Identifier: Apache-2.0
#include <bellows/core/gather_buffer.hpp>
#include <bellows/core/traffic.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

TEST_CASE("traffic: adds field by field; step statuses have names") {
  bellows::traffic t{100, 20, 20};
  t += bellows::traffic{8, 2, 1};
  CHECK(t == bellows::traffic{108, 22, 21});
  CHECK(t + bellows::traffic{} == t);
  CHECK(std::string(bellows::to_string(bellows::step_status::ok)) == "ok");
  CHECK(std::string(bellows::to_string(bellows::step_status::non_finite)) == "non_finite");
}

TEST_CASE("gather_buffer: aligned blocks of any size, storage reused") {
  bellows::gather_buffer g;
  const std::vector<std::size_t> sizes{3, 0, 16, 9};
  g.resize(sizes);
  CHECK(g.blocks() == 4);
  CHECK(g.total_bytes() == 28);
  for (std::size_t r = 0; r < sizes.size(); ++r) {
    CHECK(g.block(r).size() == sizes[r]);
    CHECK(reinterpret_cast<std::uintptr_t>(g.block(r).data()) % bellows::gather_buffer::alignment == 0);
  }
  const std::byte* before = g.block(0).data();
  const std::vector<std::size_t> smaller{8, 8};
  g.resize(smaller);
  CHECK(g.block(0).data() == before);
  CHECK(g.blocks() == 2);
  CHECK_THROWS_AS((void)g.block(2), bellows::error);
}
