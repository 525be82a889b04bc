// SPDX-License-Identifier: Apache-2.0
// The device top-k keeps the CPU's set with the same values and residual: in exact mode (ties to
// the lower index), and in approximate mode (the CPU's sample, the same draw), where it keeps k to
// max_count; the values separate or right after the indices (a payload's layout).
#include <bellows/cpu/select.hpp>
#include <bellows/compressors/topk_types.hpp>
#include <bellows/cuda/select.cuh>
#include <bellows/cpu/executor.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
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

/// Compares one selection on both backends; returns the count the CPU kept (0 when not finite).
std::size_t compare(std::size_t n, std::size_t k, data kind, float bad, std::size_t most = 0) {
  most = most == 0 ? k : most;
  CAPTURE(n);
  CAPTURE(k);
  CAPTURE(most);
  CAPTURE(static_cast<int>(kind));
  CAPTURE(bad);
  static bellows::cpu::executor host(2);
  static bellows::cuda::executor dev;
  const bellows::select_plan plan = bellows::plan_select(n, k, most);
  const bellows::philox::stream s{0x77ULL, 1, 4, bellows::philox::stream::shared};
  std::vector<float> g = make(n, kind, 5), e = make(n, kind, 6);
  if (bad != 0.0f && n > 0) e[n / 3] = bad;
  dev.reserve(bellows::cuda::select_workspace::bytes(plan));

  std::size_t kept = 0;
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

    // with feedback, the values follow the indices in one array of 2 most words (a payload's layout)
    bellows::test::device_array<float> dg(g), de(feedback ? e : std::vector<float>()), dvalue(feedback ? 0 : most),
        dstaged(feedback ? n : 0);
    bellows::test::device_array<std::uint32_t> dindex(feedback ? 2 * most : most);
    bellows::cuda::select_workspace dws(plan, dev.workspace());
    bellows::cuda::select_top(dev, plan, s, dg.span(), de.span(), dstaged.span(), dws,
                              {dindex.span().first(most), dvalue.span()});
    unsigned flag = 0;
    std::uint32_t selected = 0;
    BELLOWS_CUDA_CHECK(cudaDeviceSynchronize());
    BELLOWS_CUDA_CHECK(cudaMemcpy(&flag, dws.non_finite, sizeof(flag), cudaMemcpyDeviceToHost));
    CHECK(flag == (finite ? 0u : 1u));
    if (!finite) continue;
    BELLOWS_CUDA_CHECK(cudaMemcpy(&selected, dws.selected, sizeof(selected), cudaMemcpyDeviceToHost));
    REQUIRE(selected == index.size());
    kept = selected;
    const std::vector<std::uint32_t> words = dindex.host();
    CHECK(same_bytes(std::vector<std::uint32_t>(words.begin(), words.begin() + selected), index));
    std::vector<float> got = dvalue.host();
    if (feedback && selected != 0) {  // the values right after the `selected` indices
      got.resize(selected);
      std::memcpy(got.data(), words.data() + selected, selected * sizeof(float));
    }
    got.resize(selected);
    CHECK(same_bytes(got, value));
    CHECK(same_bytes(dstaged.host(), staged));
  }
  return kept;
}

}  // namespace

TEST_CASE("cuda select_top: the CPU's exact set, values and residual, ties to the lower index" *
          doctest::skip(bellows::test::no_device())) {
  const std::size_t cases[][2] = {{0, 0},    {1, 1},       {2, 1},          {100, 7},         {4096, 4096},
                                  {5000, 1}, {5000, 4999}, {100'003, 1000}, {1 << 20, 10486}, {3'000'017, 300'001}};
  for (const auto& c : cases)
    for (data kind : {data::normal, data::few_values, data::zeros}) compare(c[0], c[1], kind, 0.0f);
}

TEST_CASE("cuda select_top: approximate mode keeps the CPU's set, k to max_count, from the same sample" *
          doctest::skip(bellows::test::no_device())) {
  // the sample: all of a small layer, 2048 of 100'003 and of 2^20, 4096 of 2^22; with and without
  // t_hi (k > n / 8); ties; mostly zeros (where the CPU takes its exact path)
  const std::size_t cases[][2] = {{100, 7},          {5000, 1},          {5000, 2000},    {100'003, 1000},
                                  {100'003, 30'000}, {1 << 20, 1 << 18}, {1 << 22, 41943}};
  bool above_k = false;
  for (const auto& c : cases)
    for (data kind : {data::normal, data::few_values, data::zeros}) {
      if (c[0] > 200'000 && kind != data::normal) continue;  // the emulation's time
      const std::size_t most = bellows::topk_most(bellows::topk_mode::approximate, c[0], c[1]);
      const std::size_t kept = compare(c[0], c[1], kind, 0.0f, most);
      CHECK(kept >= c[1]);
      CHECK(kept <= most);
      above_k |= kept > c[1];
    }
  CHECK(above_k);  // the sampled set was taken, not only the exact fallback
}

TEST_CASE("cuda select_top: NaN or Inf raises the flag" * doctest::skip(bellows::test::no_device())) {
  for (const std::size_t most : {100, 125}) {
    compare(10'000, 100, data::normal, std::numeric_limits<float>::quiet_NaN(), most);
    compare(10'000, 100, data::normal, std::numeric_limits<float>::infinity(), most);
    compare(10'000, 2000, data::normal, std::numeric_limits<float>::quiet_NaN(), most * 20);  // with t_hi
  }
}
