// SPDX-License-Identifier: Apache-2.0
#include <bellows/cpu/normals.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <span>
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

TEST_CASE("warm_query: nonzero columns copied, an all-zero column drawn as the first draw drew it") {
  bellows::cpu::executor exec(1);
  const bellows::philox::stream s{42, 0, 7, bellows::philox::stream::shared};
  const std::size_t m = 13, r = 4;
  std::vector<float> query(m * r);
  for (std::size_t i = 0; i < query.size(); ++i) query[i] = 0.25f * static_cast<float>(i + 1);
  for (std::size_t i = 0; i < m; ++i) query[2 * m + i] = 0.0f;  // column 2 all zero
  query[3 * m + 5] = 0.0f;                                      // column 3 has a zero, not all
  std::vector<float> next(m * r, -1.0f), first_draw(m * r);
  bellows::cpu::warm_query(exec, query, next, m, s);
  bellows::cpu::fill_normals(exec, first_draw, s, 0);
  for (std::size_t j = 0; j < r; ++j)
    for (std::size_t i = 0; i < m; ++i) CHECK(next[j * m + i] == (j == 2 ? first_draw[j * m + i] : query[j * m + i]));
  // fewer columns in next than in query: the first ones
  std::vector<float> two(2 * m);
  bellows::cpu::warm_query(exec, query, two, m, s);
  CHECK(std::equal(two.begin(), two.end(), query.begin()));
  std::vector<float> odd(m + 1);
  CHECK_THROWS_AS(bellows::cpu::warm_query(exec, query, odd, m, s), bellows::error);
  CHECK_THROWS_AS(bellows::cpu::warm_query(exec, std::span<const float>(query).first(m), next, m, s), bellows::error);
}
