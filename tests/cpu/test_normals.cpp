// SPDX-License-Identifier: Apache-2.0
#include <bellows/cpu/normals.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

TEST_CASE("fill_normals: any range equals the same range of one long draw") {
  bellows::cpu::executor exec(1);
  const bellows::philox::stream s{42, 0, 7, bellows::philox::stream::shared};
  std::vector<float> all(101);
  bellows::cpu::fill_normals(exec, all, s, 0);
  // The definition: normal i is half of the pair of words 2(i/2), 2(i/2)+1.
  for (std::size_t i = 0; i < all.size(); ++i) {
    const auto pair = bellows::philox::to_normals(s.word(i / 2 * 2), s.word(i / 2 * 2 + 1));
    CHECK(all[i] == (i % 2 == 0 ? pair.first : pair.second));
  }
  for (std::size_t first : {0u, 1u, 2u, 33u, 99u}) {
    for (std::size_t count : {0u, 1u, 2u, 5u}) {
      if (first + count > all.size()) continue;
      std::vector<float> part(count);
      bellows::cpu::fill_normals(exec, part, s, first);
      for (std::size_t t = 0; t < count; ++t) CHECK(part[t] == all[first + t]);
    }
  }
  double sum = 0, sq = 0;
  std::vector<float> many(20000);
  bellows::cpu::fill_normals(exec, many, s, 0);
  for (float v : many) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  CHECK(std::abs(sum / 20000) < 0.03);
  CHECK(std::abs(sq / 20000 - 1.0) < 0.05);
}
