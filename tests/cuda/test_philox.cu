// SPDX-License-Identifier: Apache-2.0
// The device draws the same Philox words, uniforms and normals as the host.
#include <bellows/core/philox.hpp>
#include <bellows/cuda/check.cuh>
#include <bellows/cuda/launch.cuh>

#include <doctest/doctest.h>

#include "device_test.cuh"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

__global__ void draw(bellows::philox::stream s, std::uint32_t* words, float* uniforms, float* normals,
                     std::uint32_t n) {
  const std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  words[i] = s.word(i);
  uniforms[i] = bellows::philox::to_uniform(words[i]);
  if (i % 2 == 0) {
    const auto z = bellows::philox::to_normals(s.word(i), s.word(i + 1));
    normals[i] = z.first;
    normals[i + 1] = z.second;
  }
}

}  // namespace

TEST_CASE("cuda philox: device words, uniforms and normals equal the host's" *
          doctest::skip(bellows::test::no_device())) {
  constexpr std::uint32_t n = 1 << 16;
  const bellows::philox::stream s{0x243f6a8885a308d3ULL, 5, 2, 1};
  std::uint32_t* d_words = nullptr;
  float *d_uniforms = nullptr, *d_normals = nullptr;
  BELLOWS_CUDA_CHECK(cudaMalloc(&d_words, n * sizeof(std::uint32_t)));
  BELLOWS_CUDA_CHECK(cudaMalloc(&d_uniforms, n * sizeof(float)));
  BELLOWS_CUDA_CHECK(cudaMalloc(&d_normals, n * sizeof(float)));
  bellows::cuda::detail::launch(&draw, n / 256, 256u, nullptr, s, d_words, d_uniforms, d_normals, n);
  std::vector<std::uint32_t> words(n);
  std::vector<float> uniforms(n), normals(n);
  BELLOWS_CUDA_CHECK(cudaMemcpy(words.data(), d_words, n * sizeof(std::uint32_t), cudaMemcpyDeviceToHost));
  BELLOWS_CUDA_CHECK(cudaMemcpy(uniforms.data(), d_uniforms, n * sizeof(float), cudaMemcpyDeviceToHost));
  BELLOWS_CUDA_CHECK(cudaMemcpy(normals.data(), d_normals, n * sizeof(float), cudaMemcpyDeviceToHost));
  BELLOWS_CUDA_CHECK(cudaFree(d_words));
  BELLOWS_CUDA_CHECK(cudaFree(d_uniforms));
  BELLOWS_CUDA_CHECK(cudaFree(d_normals));

  std::uint32_t word_mismatch = 0, uniform_mismatch = 0, normal_far = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    word_mismatch += words[i] != s.word(i);
    uniform_mismatch += uniforms[i] != bellows::philox::to_uniform(s.word(i));
  }
  for (std::uint32_t i = 0; i < n; i += 2) {
    const auto z = bellows::philox::to_normals(s.word(i), s.word(i + 1));
    // Computed in double and rounded once: equal, or one float ulp apart where the libms differ.
    normal_far += std::abs(normals[i] - z.first) > 1e-6f * (1 + std::abs(z.first));
    normal_far += std::abs(normals[i + 1] - z.second) > 1e-6f * (1 + std::abs(z.second));
  }
  CHECK(word_mismatch == 0);
  CHECK(uniform_mismatch == 0);
  CHECK(normal_far == 0);
}

TEST_CASE("cuda check: a failed call raises cuda_error naming the call" * doctest::skip(bellows::test::no_device())) {
  void* p = nullptr;
  CHECK_THROWS_WITH_AS(BELLOWS_CUDA_CHECK(cudaMalloc(&p, ~std::size_t{0})), doctest::Contains("cudaMalloc"),
                       bellows::cuda_error);
}
