// SPDX-License-Identifier: Apache-2.0
// The device rand-k draw gives the CPU's indices bit for bit, and the same values and residual.
#include <bellows/cpu/sample.hpp>
#include <bellows/cuda/sample.cuh>
#include <bellows/cpu/executor.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "device_test.cuh"

using bellows::test::same_bytes;

namespace {

/// Draws k of n with and without error feedback on both backends and compares everything.
void compare(std::size_t n, std::size_t k, std::uint32_t step, float bad) {
  CAPTURE(n);
  CAPTURE(k);
  CAPTURE(step);
  CAPTURE(bad);
  static bellows::cpu::executor host(2);
  static bellows::cuda::executor dev;
  const bellows::sample_plan plan = bellows::plan_sample(n, k);
  const bellows::philox::stream s{0xabcdefULL, step, 2, bellows::philox::stream::shared};
  std::mt19937 gen(step);
  std::normal_distribution<float> d;
  std::vector<float> g(n), e(n);
  for (std::size_t i = 0; i < n; ++i) {
    g[i] = d(gen);
    e[i] = d(gen);
  }
  if (bad != 0.0f && n > 0) g[n - 1] = bad;
  dev.reserve(bellows::cuda::sample_workspace::bytes(plan));

  for (const bool feedback : {false, true}) {
    CAPTURE(feedback);
    bellows::cpu::sample_workspace ws(plan);
    std::vector<std::uint32_t> index(k);
    std::vector<float> value(k), staged(feedback ? n : 0);
    bellows::cpu::draw_sample(host, plan, s, ws);
    const std::span<const float> ce = feedback ? std::span<const float>(e) : std::span<const float>();
    const bool finite = bellows::cpu::gather_sample(host, plan, ws, g, ce, staged,
                                                    bellows::sparse_arrays<std::uint32_t>{index, value}, 0.5f);

    bellows::test::device_array<float> dg(g), de(feedback ? e : std::vector<float>()), dvalue(k),
        dstaged(feedback ? n : 0);
    bellows::test::device_array<std::uint32_t> dindex(k);
    bellows::cuda::sample_workspace dws(plan, dev.workspace());
    bellows::cuda::draw_sample(dev, plan, s, dws);
    bellows::cuda::gather_sample(dev, plan, dws, dg.span(), de.span(), dstaged.span(),
                                 bellows::sparse_arrays<std::uint32_t>{dindex.span(), dvalue.span()}, 0.5f);
    unsigned flag = 0;
    BELLOWS_CUDA_CHECK(cudaMemcpy(&flag, dws.non_finite, sizeof(flag), cudaMemcpyDeviceToHost));
    CHECK(flag == (finite ? 0u : 1u));
    CHECK(same_bytes(dindex.host(), index));
    if (!finite) continue;
    CHECK(same_bytes(dvalue.host(), value));
    CHECK(same_bytes(dstaged.host(), staged));
  }
}

}  // namespace

TEST_CASE("cuda draw_sample and gather_sample: the CPU's indices, values and residual" *
          doctest::skip(bellows::test::no_device())) {
  const std::size_t cases[][2] = {
      {0, 0},      {1, 1},    {2, 1},       {10, 3},           {64, 33},         {100, 60},          {1000, 1000},
      {1000, 999}, {4099, 1}, {65536, 655}, {100'003, 50'001}, {1 << 20, 10486}, {3'000'017, 30'001}};
  for (const auto& c : cases)
    for (std::uint32_t step : {0u, 1u, 17u}) compare(c[0], c[1], step, 0.0f);
}

TEST_CASE("cuda gather_sample: NaN or Inf anywhere raises the flag, kept or not" *
          doctest::skip(bellows::test::no_device())) {
  compare(5000, 50, 3, std::numeric_limits<float>::quiet_NaN());
  compare(5000, 4000, 3, std::numeric_limits<float>::infinity());
}
