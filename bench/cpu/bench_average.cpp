// SPDX-License-Identifier: Apache-2.0
// The averaging that ends every allgather codec's step, alone: W prepared payloads of a layer of
// 2^24 floats, averaged into the output on one thread. Two ways, in the same run:
//   fused   the kernel the codecs call: average_dequantize (QSGD, 8 bits, buckets of 512) and
//           scatter_average (top-k 1%), one write of the output
//   passes  the sequence they ran before: zero the output, add each payload's decoded values
//           into it (unpack_dequantize accumulating, scatter_add), divide it by W
// Both give the same bits (tests/cpu/test_quantize.cpp and test_sparse.cpp check it). x_floor
// counts streaming reads of the 2^24 output floats. Names: average/<codec>/<way>/W:<ranks>, and
// average/write_output, one fill of the output: the write every average costs at least.
#include <bellows/cpu/elementwise.hpp>
#include <bellows/cpu/quantize.hpp>
#include <bellows/cpu/sparse.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "x_floor.hpp"

namespace {

constexpr std::size_t n = std::size_t{1} << 24;

bellows::cpu::executor& one_thread() {
  static bellows::cpu::executor exec(1);
  return exec;
}

const std::vector<float>& gradient() {
  static const std::vector<float> g = [] {
    std::vector<float> v(n);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    for (float& x : v) x = normal(rng);
    return v;
  }();
  return g;
}

/// Rank r's QSGD payload arrays: the gradient quantised with rank r's noise.
struct qsgd_payloads {
  bellows::code_layout layout{8, 512, n};
  std::vector<std::vector<float>> scales;
  std::vector<std::vector<std::uint8_t>> codes;
  std::vector<bellows::code_arrays> parts;

  explicit qsgd_payloads(std::size_t w) : scales(w), codes(w) {
    for (std::size_t r = 0; r < w; ++r) {
      scales[r].resize(layout.buckets());
      codes[r].resize(layout.code_bytes());
      (void)bellows::cpu::quantize_pack(one_thread(), gradient(), layout, bellows::bucket_norm::l2,
                                        {1, 0, 0, static_cast<std::uint32_t>(r)}, scales[r], codes[r]);
      parts.push_back({scales[r], codes[r]});
    }
  }
};

/// Rank r's top-k payload: the 1% of largest magnitude of the gradient rotated by r * 7919
/// elements, so that the ranks' index sets differ.
struct topk_payloads {
  std::vector<std::vector<std::uint32_t>> index;
  std::vector<std::vector<float>> value;
  std::vector<bellows::cpu::sparse_view<std::uint32_t>> parts;

  explicit topk_payloads(std::size_t w) : index(w), value(w) {
    const std::size_t k = n / 100;
    const std::vector<float>& g = gradient();
    std::vector<float> magnitude(n);
    for (std::size_t r = 0; r < w; ++r) {
      const auto at = [&](std::size_t i) { return g[(i + r * 7919) % n]; };
      for (std::size_t i = 0; i < n; ++i) magnitude[i] = std::abs(at(i));
      std::nth_element(magnitude.begin(), magnitude.begin() + static_cast<std::ptrdiff_t>(k - 1), magnitude.end(),
                       std::greater<>());
      const float threshold = magnitude[k - 1];
      for (std::size_t i = 0; i < n && index[r].size() < k; ++i)
        if (std::abs(at(i)) >= threshold) {
          index[r].push_back(static_cast<std::uint32_t>(i));
          value[r].push_back(at(i));
        }
      parts.push_back({index[r], value[r]});
    }
  }
};

void qsgd_fused(benchmark::State& state) {
  const qsgd_payloads p(static_cast<std::size_t>(state.range(0)));
  std::vector<float> out(n);
  bellows::bench::run_against_floor(state, out, [&] {
    bellows::cpu::average_dequantize(one_thread(), p.parts, p.layout, out);
    benchmark::DoNotOptimize(out.data());
  });
}

void qsgd_passes(benchmark::State& state) {
  const qsgd_payloads p(static_cast<std::size_t>(state.range(0)));
  std::vector<float> out(n);
  bellows::bench::run_against_floor(state, out, [&] {
    bellows::cpu::fill(one_thread(), out, 0.0f);
    for (const bellows::code_arrays& part : p.parts)
      bellows::cpu::unpack_dequantize(one_thread(), part.scales, part.codes, p.layout, out, true);
    bellows::cpu::divide(one_thread(), out, static_cast<float>(p.parts.size()));
    benchmark::DoNotOptimize(out.data());
  });
}

void topk_fused(benchmark::State& state) {
  const topk_payloads p(static_cast<std::size_t>(state.range(0)));
  std::vector<float> out(n);
  std::vector<std::size_t> cursors(bellows::cpu::scatter_average_cursors(p.parts.size(), n));
  bellows::bench::run_against_floor(state, out, [&] {
    bellows::cpu::scatter_average(one_thread(), std::span<float>(out),
                                  std::span<const bellows::cpu::sparse_view<std::uint32_t>>(p.parts),
                                  std::span(cursors));
    benchmark::DoNotOptimize(out.data());
  });
}

void topk_passes(benchmark::State& state) {
  const topk_payloads p(static_cast<std::size_t>(state.range(0)));
  std::vector<float> out(n);
  bellows::bench::run_against_floor(state, out, [&] {
    bellows::cpu::fill(one_thread(), out, 0.0f);
    for (const auto& part : p.parts)
      bellows::cpu::scatter_add(one_thread(), std::span<float>(out), part.index, part.value);
    if (p.parts.size() != 1) bellows::cpu::divide(one_thread(), out, static_cast<float>(p.parts.size()));
    benchmark::DoNotOptimize(out.data());
  });
}

/// The least any average costs: one write of the output (the library's fill, a string store).
void write_output(benchmark::State& state) {
  std::vector<float> out(n);
  bellows::bench::run_against_floor(state, out, [&] {
    bellows::cpu::fill(one_thread(), out, 0.0f);
    benchmark::DoNotOptimize(out.data());
  });
}

#define BELLOWS_AVERAGE_ARGS ArgName("W")->Arg(1)->Arg(2)->Arg(4)->Arg(8)->UseRealTime()->Unit(benchmark::kMillisecond)
BENCHMARK(write_output)->Name("average/write_output")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(qsgd_fused)->Name("average/qsgd8/fused")->BELLOWS_AVERAGE_ARGS;
BENCHMARK(qsgd_passes)->Name("average/qsgd8/passes")->BELLOWS_AVERAGE_ARGS;
BENCHMARK(topk_fused)->Name("average/topk1%/fused")->BELLOWS_AVERAGE_ARGS;
BENCHMARK(topk_passes)->Name("average/topk1%/passes")->BELLOWS_AVERAGE_ARGS;

}  // namespace
