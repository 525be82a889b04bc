// SPDX-License-Identifier: Apache-2.0
// cuda::fill_normals against cpu::fill_normals: the same normals from any point of the stream,
// nothing written outside the output, and a range past the stream's end refused; and
// cuda::warm_query against cpu::warm_query.
#include <bellows/cpu/normals.hpp>
#include <bellows/cuda/normals.cuh>
#include <bellows/cpu/executor.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "device_test.cuh"

TEST_CASE("cuda fill_normals: the CPU's normals from any point of the stream" *
          doctest::skip(bellows::test::no_device())) {
  bellows::cuda::executor dev;
  bellows::cpu::executor host(1);
  const bellows::philox::stream s{0x1234'5678'9abcULL, 7, 3, bellows::philox::stream::shared};
  for (const std::uint64_t first : {0u, 1u, 6u, 1001u}) {
    for (const std::size_t count : {1u, 2u, 5u, 4099u}) {
      CAPTURE(first);
      CAPTURE(count);
      std::vector<float> want(count);
      bellows::cpu::fill_normals(host, want, s, first);
      bellows::test::device_array<float> d(std::vector<float>(count + 2, -9.0f));
      bellows::cuda::fill_normals(dev, d.span().subspan(1, count), s, first);
      std::vector<float> got = d.host();
      CHECK(got.front() == -9.0f);  // nothing written outside
      CHECK(got.back() == -9.0f);
      got = std::vector<float>(got.begin() + 1, got.end() - 1);
      CHECK(bellows::test::same_draw(got, want));
    }
  }
  bellows::test::device_array<float> d(4);
  CHECK_THROWS_WITH_AS(bellows::cuda::fill_normals(dev, d.span(), s, bellows::philox::stream::max_words / 2 - 2),
                       doctest::Contains("overrun the stream"), bellows::error);
}

TEST_CASE("cuda warm_query: the CPU's columns, an all-zero column drawn as the first draw drew it" *
          doctest::skip(bellows::test::no_device())) {
  bellows::cuda::executor dev;
  bellows::cpu::executor host(1);
  const bellows::philox::stream s{0x1234'5678'9abcULL, 0, 3, bellows::philox::stream::shared};
  for (const std::size_t m : {std::size_t{1}, std::size_t{48}, std::size_t{1000}}) {
    CAPTURE(m);
    const std::size_t r = 3;
    std::vector<float> query(m * r);
    for (std::size_t i = 0; i < query.size(); ++i) query[i] = 0.5f + static_cast<float>(i % 7);
    for (std::size_t i = 0; i < m; ++i) query[m + i] = 0.0f;  // column 1 all zero
    std::vector<float> want(m * r);
    bellows::cpu::warm_query(host, query, want, m, s);
    bellows::test::device_array<float> q(query), next(m * r);
    bellows::cuda::warm_query(dev, q.span(), next.span(), m, s);
    const std::vector<float> got = next.host();
    // the copied columns bit for bit, the drawn one as fill_normals agrees with the CPU's
    CHECK(bellows::test::same_bytes(std::vector<float>(got.begin(), got.begin() + m),
                                    std::vector<float>(want.begin(), want.begin() + m)));
    CHECK(bellows::test::same_draw(std::vector<float>(got.begin() + m, got.begin() + 2 * m),
                                   std::vector<float>(want.begin() + m, want.begin() + 2 * m)));
    CHECK(bellows::test::same_bytes(std::vector<float>(got.begin() + 2 * m, got.end()),
                                    std::vector<float>(want.begin() + 2 * m, want.end())));
  }
}
