// SPDX-License-Identifier: Apache-2.0
// QSGD on one thread at 2^24 floats, buckets of 512, L2 scale: encode (scales, Philox rounding,
// packing into a wire payload) and decode (unpacking into a float buffer: `decode_add`, the
// codec's entry point, which reads and writes its accumulator; and `unpack` alone, the kernel
// writing fresh values). x_floor counts streaming reads of the 2^24 input floats.
#include <bellows/compressors/qsgd.hpp>

#include <algorithm>
#include <random>
#include <vector>

#include "x_floor.hpp"

namespace {

struct fixture {
  std::vector<float> grad;
  bellows::cpu::executor one_thread{1};
  bellows::qsgd<> codec;
  bellows::qsgd<>::state st;
  std::vector<std::uint64_t> storage;

  explicit fixture(benchmark::State& state)
      : grad(static_cast<std::size_t>(state.range(0))),
        codec({.bits = static_cast<unsigned>(state.range(1)), .bucket = 512}, one_thread) {
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    for (float& g : grad) g = normal(rng);
    st = codec.make_state({0, "bench", bellows::shape::vector(grad.size())});
    storage.resize((codec.max_payload_bytes(st) + 7) / 8);
  }
  std::span<std::byte> bytes() { return std::as_writable_bytes(std::span(storage)); }
};

void qsgd_encode(benchmark::State& state) {
  fixture f(state);
  bellows::bench::run_against_floor(state, f.grad, [&] {
    auto payload = f.codec.encode(f.st, f.grad, f.bytes(), 0);
    benchmark::DoNotOptimize(payload);
  });
}

void qsgd_decode_add(benchmark::State& state) {
  fixture f(state);
  const auto payload = f.codec.encode(f.st, f.grad, f.bytes(), 0);
  std::vector<float> acc(f.grad.size(), 0.0f);
  bellows::bench::run_against_floor(state, f.grad, [&] {
    auto status = f.codec.decode_add(f.st, payload, acc);
    benchmark::DoNotOptimize(status);
  });
}

void qsgd_unpack(benchmark::State& state) {
  fixture f(state);
  const auto bits = static_cast<unsigned>(state.range(1));
  const bellows::code_layout layout{bits, 512, f.grad.size()};
  std::vector<float> scales(layout.buckets());
  std::vector<std::uint8_t> codes(layout.code_bytes());
  (void)bellows::cpu::quantize_pack(f.one_thread, f.grad, layout, bellows::bucket_norm::l2, bellows::philox::stream{},
                                    scales, codes);
  std::vector<float> out(f.grad.size(), 0.0f);
  bellows::bench::run_against_floor(state, f.grad, [&] {
    bellows::cpu::unpack_dequantize(f.one_thread, scales, codes, layout, out, false);
    benchmark::DoNotOptimize(out.data());
  });
}

#define BELLOWS_QSGD_ARGS \
  ArgNames({"n", "bits"})->ArgsProduct({{1 << 24}, {2, 4, 8}})->UseRealTime()->Unit(benchmark::kMillisecond)
BENCHMARK(qsgd_encode)->BELLOWS_QSGD_ARGS;
BENCHMARK(qsgd_decode_add)->BELLOWS_QSGD_ARGS;
BENCHMARK(qsgd_unpack)->BELLOWS_QSGD_ARGS;

}  // namespace
