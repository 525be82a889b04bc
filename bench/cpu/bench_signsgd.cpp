// SPDX-License-Identifier: Apache-2.0
// EF-signSGD on one thread at 2^24 floats, one bucket (the default) and buckets of 512: encode
// (the scales' ordered sums and the sign bits, into a wire payload), decode (`decode_add`, the
// codec's entry point, which validates the payload and reads and writes its accumulator), the
// average of one payload (`sign_average`, the kernel of a step, writing fresh values), and the
// whole step at W = 1 with error feedback (m = g + e, encode, gather, validation, average,
// e = m - own). x_floor counts streaming reads of the 2^24 input floats. QSGD's figures for the
// same sizes are bench_qsgd.cpp's (its bits = 8 rows).
#include <bellows/compressors/signsgd.hpp>

#include <algorithm>
#include <random>
#include <vector>

#include "x_floor.hpp"

namespace {

struct fixture {
  std::vector<float> grad;
  bellows::cpu::executor one_thread{1};
  bellows::signsgd<> codec;
  bellows::signsgd<>::state st;
  std::vector<std::uint64_t> storage;

  explicit fixture(benchmark::State& state)
      : grad(static_cast<std::size_t>(state.range(0))),
        codec({.bucket = static_cast<std::size_t>(state.range(1))}, one_thread) {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    for (float& g : grad) g = normal(rng);
    st = codec.make_state({0, "bench", bellows::shape::vector(grad.size())});
    storage.resize((codec.max_payload_bytes(st) + 7) / 8);
  }
  std::span<std::byte> bytes() { return std::as_writable_bytes(std::span(storage)); }
};

void signsgd_encode(benchmark::State& state) {
  fixture f(state);
  bellows::bench::run_against_floor(state, f.grad, [&] {
    auto payload = f.codec.encode(f.st, f.grad, f.bytes(), 0);
    benchmark::DoNotOptimize(payload);
  });
}

void signsgd_decode_add(benchmark::State& state) {
  fixture f(state);
  const auto payload = f.codec.encode(f.st, f.grad, f.bytes(), 0);
  std::vector<float> acc(f.grad.size(), 0.0f);
  bellows::bench::run_against_floor(state, f.grad, [&] {
    auto status = f.codec.decode_add(f.st, payload, acc);
    benchmark::DoNotOptimize(status);
  });
}

void signsgd_average(benchmark::State& state) {
  fixture f(state);
  const bellows::sign_layout layout{static_cast<std::size_t>(state.range(1)), f.grad.size()};
  std::vector<float> scales(layout.buckets());
  std::vector<std::uint8_t> signs(layout.sign_bytes());
  std::vector<float> workspace(bellows::cpu::sign_workspace(layout));
  (void)bellows::cpu::sign_encode(f.one_thread, f.grad, layout, scales, signs, workspace);
  const bellows::sign_arrays part{scales, signs};
  std::vector<float> out(f.grad.size(), 0.0f);
  bellows::bench::run_against_floor(state, f.grad, [&] {
    bellows::cpu::sign_average(f.one_thread, {&part, 1}, layout, out);
    benchmark::DoNotOptimize(out.data());
  });
}

void signsgd_step(benchmark::State& state) {
  fixture f(state);
  bellows::archetypes::collective solo;
  std::vector<float> g = f.grad;
  bellows::bench::run_against_floor(
      state, f.grad,
      [&] {
        auto result = f.codec.reduce(f.st, g, solo);
        benchmark::DoNotOptimize(result);
      },
      [&] { std::copy(f.grad.begin(), f.grad.end(), g.begin()); });
}

#define BELLOWS_SIGNSGD_ARGS \
  ArgNames({"n", "bucket"})->ArgsProduct({{1 << 24}, {0, 512}})->UseRealTime()->Unit(benchmark::kMillisecond)
BENCHMARK(signsgd_encode)->BELLOWS_SIGNSGD_ARGS;
BENCHMARK(signsgd_decode_add)->BELLOWS_SIGNSGD_ARGS;
BENCHMARK(signsgd_average)->BELLOWS_SIGNSGD_ARGS;
BENCHMARK(signsgd_step)->BELLOWS_SIGNSGD_ARGS;

}  // namespace
