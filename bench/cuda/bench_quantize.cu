// SPDX-License-Identifier: Apache-2.0
// QSGD on the device at 2^26 floats, buckets of 512, L2 scale: encode (scales, Philox rounding,
// packing) at 4 and 8 bits, decode (unpack into fresh floats), and the whole step of
// qsgd<cuda::executor> with error feedback on one rank (compensate, encode, validate, average and
// update the memory; no transport). x_floor counts device reads of the 2^26 input floats.
#include <bellows/compressors/qsgd.cuh>
#include <bellows/cuda/quantize.cuh>

#include "cuda/device_floor.cuh"
#include "cuda/one_rank.cuh"

namespace {

struct buffers {
  bellows::code_layout layout;
  float* in;
  float* scales = nullptr;
  float* out = nullptr;
  std::uint8_t* codes = nullptr;
  unsigned* flag = nullptr;

  explicit buffers(benchmark::State& state)
      : layout{static_cast<unsigned>(state.range(1)), 512, static_cast<std::size_t>(state.range(0))},
        in(bellows::bench::device_normals(layout.n, 1)) {
    BELLOWS_CUDA_CHECK(cudaMalloc(&scales, layout.buckets() * sizeof(float)));
    BELLOWS_CUDA_CHECK(cudaMalloc(&out, layout.n * sizeof(float)));
    BELLOWS_CUDA_CHECK(cudaMalloc(&codes, layout.code_bytes()));
    BELLOWS_CUDA_CHECK(cudaMalloc(&flag, sizeof(unsigned)));
  }
  buffers(const buffers&) = delete;
  buffers& operator=(const buffers&) = delete;
  ~buffers() {
    for (void* p : {static_cast<void*>(in), static_cast<void*>(scales), static_cast<void*>(out),
                    static_cast<void*>(codes), static_cast<void*>(flag)})
      (void)cudaFree(p);
  }
  void encode(bellows::cuda::executor& exec) const {
    bellows::cuda::quantize_pack(exec, {in, layout.n}, layout, bellows::bucket_norm::l2, {0x5eedULL, 1, 0, 0},
                                 {scales, layout.buckets()}, {codes, layout.code_bytes()}, flag);
  }
};

void cuda_qsgd_encode(benchmark::State& state) {
  if (!bellows::bench::have_device(state)) return;
  const buffers b(state);
  bellows::cuda::executor exec;
  bellows::bench::run_timed(state, b.in, b.layout.n, [&] { b.encode(exec); });
}

void cuda_qsgd_decode(benchmark::State& state) {
  if (!bellows::bench::have_device(state)) return;
  const buffers b(state);
  bellows::cuda::executor exec;
  b.encode(exec);
  bellows::bench::run_timed(state, b.in, b.layout.n, [&] {
    bellows::cuda::unpack_dequantize(exec, {b.scales, b.layout.buckets()}, {b.codes, b.layout.code_bytes()}, b.layout,
                                     {b.out, b.layout.n}, false);
  });
}

void cuda_qsgd_step(benchmark::State& state) {
  if (!bellows::bench::have_device(state)) return;
  const auto n = static_cast<std::size_t>(state.range(0));
  float* g = bellows::bench::device_normals(n, 2);
  bellows::cuda::executor exec;
  bellows::qsgd<bellows::cuda::executor> q(
      {.bits = static_cast<unsigned>(state.range(1)), .bucket = 512, .feedback = bellows::feedback::residual}, exec);
  auto st = q.make_state({0, "bench", bellows::shape{n}});
  bellows::bench::one_rank coll;
  bellows::bench::run_timed(state, g, n, [&] { (void)q.reduce(st, {g, n}, coll); });
  (void)cudaFree(g);
}

}  // namespace

BENCHMARK(cuda_qsgd_step)
    ->ArgNames({"n", "bits"})
    ->Args({1 << 26, 4})
    ->Args({1 << 26, 8})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(cuda_qsgd_encode)
    ->ArgNames({"n", "bits"})
    ->Args({1 << 26, 4})
    ->Args({1 << 26, 8})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(cuda_qsgd_decode)
    ->ArgNames({"n", "bits"})
    ->Args({1 << 26, 4})
    ->Args({1 << 26, 8})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
