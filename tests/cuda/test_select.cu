// SPDX-License-Identifier: Apache-2.0
// The device exact top-k keeps the CPU's set (ties to the lower index) with the same values and
// residual.
#include <bellows/cpu/select.hpp>
#include <bellows/cuda/select.cuh>
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

enum class data { normal, few_values, zeros };

std::vector<float> make(std::size_t n, data kind, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  std::uniform_int_distribution<int> small(-3, 3);
  std::vector<float> v(n);
  for (float& x : v)
    x = kind == data::normal ? d(gen) : kind == data::few_values ? static_cast<float>(small(gen)) : 0.0f;
  return v;
}

void compare(std::size_t n, std::size_t k, data kind, float bad) {
  CAPTURE(n);
  CAPTURE(k);
  CAPTURE(static_cast<int>(kind));
  CAPTURE(bad);
  static bellows::cpu::executor host(2);
  static bellows::cuda::executor dev;
  const bellows::select_plan plan = bellows::plan_select(n, k, k);
  const bellows::philox::stream s{0x77ULL, 1, 4, bellows::philox::stream::shared};
  std::vector<float> g = make(n, kind, 5), e = make(n, kind, 6);
  if (bad != 0.0f && n > 0) e[n / 3] = bad;
  dev.reserve(bellows::cuda::select_workspace::bytes(plan));

  for (const bool feedback : {false, true}) {
    CAPTURE(feedback);
    bellows::cpu::select_workspace ws(plan);
    std::vector<std::uint32_t> index;
    std::vector<float> value, staged(feedback ? n : 0);
    const std::span<const float> ce = feedback ? std::span<const float>(e) : std::span<const float>();
    const bool finite = bellows::cpu::select_top(host, plan, s, g, ce, staged, ws, [&](std::size_t count) {
      index.resize(count);
      value.resize(count);
      return bellows::sparse_arrays<std::uint32_t>{index, value};
    });

    bellows::test::device_array<float> dg(g), de(feedback ? e : std::vector<float>()), dvalue(k),
        dstaged(feedback ? n : 0);
    bellows::test::device_array<std::uint32_t> dindex(k);
    bellows::cuda::select_workspace dws(plan, dev.workspace());
    bellows::cuda::select_top(dev, plan, dg.span(), de.span(), dstaged.span(), dws,
                              bellows::sparse_arrays<std::uint32_t>{dindex.span(), dvalue.span()});
    unsigned flag = 0;
    std::uint32_t selected = 0;
    BELLOWS_CUDA_CHECK(cudaDeviceSynchronize());
    BELLOWS_CUDA_CHECK(cudaMemcpy(&flag, dws.non_finite, sizeof(flag), cudaMemcpyDeviceToHost));
    CHECK(flag == (finite ? 0u : 1u));
    if (!finite) continue;
    if (n != 0) BELLOWS_CUDA_CHECK(cudaMemcpy(&selected, dws.selected, sizeof(selected), cudaMemcpyDeviceToHost));
    CHECK(selected == k);
    CHECK(same_bytes(dindex.host(), index));
    CHECK(same_bytes(dvalue.host(), value));
    CHECK(same_bytes(dstaged.host(), staged));
  }
}

}  // namespace

TEST_CASE("cuda select_top: the CPU's exact set, values and residual, ties to the lower index") {
  if (!bellows::test::have_device()) return;
  const std::size_t cases[][2] = {{0, 0},    {1, 1},       {2, 1},          {100, 7},         {4096, 4096},
                                  {5000, 1}, {5000, 4999}, {100'003, 1000}, {1 << 20, 10486}, {3'000'017, 300'001}};
  for (const auto& c : cases)
    for (data kind : {data::normal, data::few_values, data::zeros}) compare(c[0], c[1], kind, 0.0f);
}

TEST_CASE("cuda select_top: NaN or Inf raises the flag") {
  if (!bellows::test::have_device()) return;
  compare(10'000, 100, data::normal, std::numeric_limits<float>::quiet_NaN());
  compare(10'000, 100, data::normal, std::numeric_limits<float>::infinity());
}
