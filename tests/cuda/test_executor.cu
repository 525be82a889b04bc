// SPDX-License-Identifier: Apache-2.0
// The CUDA executor: the arena carves what it sizes, the pool grows only by reserve(), a
// caller's workspace never grows.
#include <bellows/cuda/executor.cuh>

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "device_test.cuh"

TEST_CASE("cuda arena: sizing and carving take the same aligned pieces") {
  const auto carve = [](bellows::cuda::arena a) {
    const auto* x = a.take<float>(3);
    const auto* y = a.take<std::uint64_t>(100);
    const auto* z = a.take<char>(0);
    return std::pair{a.used(), std::array<const void*, 3>{x, y, z}};
  };
  const auto [bytes, none] = carve(bellows::cuda::arena());
  CHECK(bytes == 256 + 1024);  // 12 bytes round to 256, 800 to 1024, 0 to 0
  CHECK(none[0] == nullptr);
  alignas(256) static std::byte buffer[2048];
  const auto [used, at] = carve(bellows::cuda::arena(buffer, sizeof(buffer)));
  CHECK(used == bytes);
  CHECK(at[0] == buffer);
  CHECK(at[1] == buffer + 256);
  // the last piece needs no padding after it: 256 + 800 bytes hold all three, one byte less not
  CHECK_NOTHROW(carve(bellows::cuda::arena(buffer, 256 + 800)));
  CHECK_THROWS_AS(carve(bellows::cuda::arena(buffer, 256 + 799)), bellows::error);
}

TEST_CASE("cuda executor: the pool grows by reserve() only; a caller's workspace never" *
          doctest::skip(bellows::test::no_device())) {
  bellows::cuda::executor pooled;
  CHECK(pooled.workspace_bytes() == 0);
  pooled.reserve(1000);
  CHECK(pooled.workspace_bytes() == 1000);
  bellows::cuda::arena a = pooled.workspace();
  CHECK(a.take<float>(250) != nullptr);
  CHECK_THROWS_AS((void)a.take<float>(1), bellows::error);
  pooled.reserve(10);  // never shrinks
  CHECK(pooled.workspace_bytes() == 1000);

  bellows::test::device_array<std::byte> mine(512);
  cudaStream_t stream = nullptr;
  BELLOWS_CUDA_CHECK(cudaStreamCreate(&stream));
  bellows::cuda::executor lent(stream, mine.data(), 512);
  CHECK(lent.stream() == stream);
  CHECK_NOTHROW(lent.reserve(512));
  CHECK_THROWS_AS(lent.reserve(513), bellows::error);
  lent.synchronize();
  BELLOWS_CUDA_CHECK(cudaStreamDestroy(stream));
}
