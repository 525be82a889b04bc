// SPDX-License-Identifier: Apache-2.0
// qsgd<cuda::executor> over the NCCL collective, one rank per device, against qsgd<cpu::executor>
// over the local collective with the same ranks and inputs: every status, average, error memory
// and step counter bit for bit, NaN steps included; malformed payloads, wrong streams and sizes;
// checkpoints that cross backends.
#include <bellows/collectives/nccl.cuh>
#include <bellows/compressors/qsgd.hpp>
#include <bellows/compressors/qsgd.cuh>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "../support/random.hpp"
#include "compressor_ranks.cuh"
#include "device_test.cuh"
#include "nccl_ranks.cuh"

namespace {

using bellows::step_status;

struct config {
  std::size_t n;
  bellows::qsgd_params params;
  bool nan_step;  ///< the last rank's input at step 1 holds a NaN
};

inline constexpr std::size_t steps = 3;

/// Rank r's gradient at a step: normal values, a zero run (a zero bucket for small buckets),
/// and the NaN of the config.
std::vector<float> gradient(const config& c, std::size_t step, std::size_t rank, std::size_t ranks) {
  std::vector<float> g = bellows::testing::normal_floats(c.n, 1000 * step + rank);
  for (std::size_t i = c.n / 3; i < c.n / 3 + 20 && i < c.n; ++i) g[i] = 0.0f;
  if (c.nan_step && step == 1 && rank + 1 == ranks && c.n != 0) g[c.n / 2] = std::numeric_limits<float>::quiet_NaN();
  return g;
}

bellows::layer_info layer_of(const config& c) { return {3, "fc", bellows::shape{c.n}}; }

std::size_t ranks() { return static_cast<std::size_t>(bellows::cuda::device_count()); }

}  // namespace

TEST_CASE("cuda qsgd: every rank's average, memory and step equal the CPU's, bit for bit" *
          doctest::skip(bellows::test::no_device())) {
  using bellows::feedback;
  using bellows::qsgd_norm;
  const std::vector<config> configs = {
      {0, {.bits = 8, .bucket = 512, .feedback = feedback::residual}, false},
      {1, {.bits = 4, .bucket = 1, .norm = qsgd_norm::max_abs, .seed = 5}, true},
      {1000, {.bits = 2, .bucket = 7, .seed = 9, .feedback = feedback::residual}, true},
      {777, {.bits = 2, .bucket = 33, .norm = qsgd_norm::max_abs}, false},
      {4099, {.bits = 4, .bucket = 100, .norm = qsgd_norm::max_abs, .feedback = feedback::residual}, false},
      {4099, {.bits = 8, .bucket = 512, .seed = 77, .feedback = feedback::residual}, true},
  };
  const std::size_t w = ranks();
  for (const config& c : configs) {
    CAPTURE(c.n);
    CAPTURE(c.params.bits);
    CAPTURE(c.params.bucket);
    const auto input = [&](std::size_t step, std::size_t rank) { return gradient(c, step, rank, w); };
    const auto want = bellows::test::trace_on_cpu<bellows::qsgd>(c.params, layer_of(c), w, steps, input);
    const auto got = bellows::test::trace_on_device<bellows::qsgd>(c.params, layer_of(c), steps, input);
    bellows::test::check_same_traces(got, want);
    // the NaN step is skipped everywhere and leaves the input as it was
    if (c.nan_step && c.n != 0) {
      CHECK(want[0].status[1] == step_status::non_finite);
      CHECK(want[0].step == steps - 1);
      CHECK(bellows::test::same_bytes(got[0].out[1], gradient(c, 1, 0, w)));
    }
  }
}

TEST_CASE("cuda qsgd: a malformed payload raises wire_error on every rank and changes nothing" *
          doctest::skip(bellows::test::no_device())) {
  // 1001 elements, 2 bits, buckets of 7: 143 scales (572 bytes), 251 code bytes (the last with 2
  // bits used), 1 byte of padding
  const config c{1001, {.bits = 2, .bucket = 7, .feedback = bellows::feedback::residual}, false};
  const std::size_t codes_at = bellows::wire::header_bytes + 572;
  const auto input = [&](std::size_t step, std::size_t rank) { return gradient(c, step, rank, ranks()); };
  for (const bellows::test::corruption& bad : std::vector<bellows::test::corruption>{
           {8, 0x01, 1, "elements in"},                          // the header's n
           {bellows::wire::header_bytes + 3, 0xFF, 1, "scale"},  // scale 0 negative
           {codes_at + 251, 0x01, 1, "padding"},                 // the padding byte
           {codes_at + 250, 0xC0, 1, "unused bits"},             // above the 2 bits used of the last code byte
       }) {
    CAPTURE(bad.offset);
    bellows::test::check_malformed<bellows::qsgd>(c.params, layer_of(c), input, bad);
  }
}

TEST_CASE("cuda qsgd: wrong streams and sizes are refused before anything runs" *
          doctest::skip(bellows::test::no_device())) {
  const config c{100, {.bits = 4, .bucket = 16, .feedback = bellows::feedback::residual}, false};
  bellows::test::check_refusals<bellows::qsgd>(
      c.params, layer_of(c), [&](std::size_t step, std::size_t rank) { return gradient(c, step, rank, ranks()); });
}

TEST_CASE("cuda qsgd: checkpoints cross backends" * doctest::skip(bellows::test::no_device())) {
  const config c{300, {.bits = 8, .bucket = 64, .feedback = bellows::feedback::residual}, false};
  bellows::test::check_checkpoints<bellows::qsgd>(
      c.params, layer_of(c), [&](std::size_t step, std::size_t rank) { return gradient(c, step, rank, ranks()); });
}

TEST_CASE("cuda qsgd: the scatter exchange is refused at construction (the CPU's only, for now)" *
          doctest::skip(bellows::test::no_device())) {
  CHECK_THROWS_WITH_AS(bellows::qsgd<bellows::cuda::executor>({.exchange = bellows::exchange::scatter}),
                       doctest::Contains("CPU backend only"), bellows::error);
}
