// SPDX-License-Identifier: Apache-2.0
// cuda::fill_normals against cpu::fill_normals: the same normals from any point of the stream,
// nothing written outside the output, and a range past the stream's end refused.
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
