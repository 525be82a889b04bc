// SPDX-License-Identifier: Apache-2.0
// signsgd<cuda::executor> over the NCCL collective, one rank per device, against
// signsgd<cpu::executor> over the local collective with the same ranks and inputs: every status,
// average, error memory and step counter bit for bit, NaN and Inf steps included; malformed
// payloads, wrong streams and sizes; checkpoints that cross backends.
#include <bellows/collectives/nccl.cuh>
#include <bellows/compressors/signsgd.hpp>
#include <bellows/compressors/signsgd.cuh>

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
  bellows::signsgd_params params;
  bool nan_step;  ///< the last rank's input at step 1 holds a NaN (an Inf at step 2)
};

inline constexpr std::size_t steps = 3;

/// Rank r's gradient at a step: normal values, a zero run with -0.0 in it, and the NaN or Inf of
/// the config.
std::vector<float> gradient(const config& c, std::size_t step, std::size_t rank, std::size_t ranks) {
  std::vector<float> g = bellows::testing::normal_floats(c.n, 1000 * step + rank);
  for (std::size_t i = c.n / 3; i < c.n / 3 + 20 && i < c.n; ++i) g[i] = (i % 2 == 0) ? 0.0f : -0.0f;
  if (c.nan_step && rank + 1 == ranks && c.n != 0) {
    if (step == 1) g[c.n / 2] = std::numeric_limits<float>::quiet_NaN();
    if (step == 2) g[c.n - 1] = -std::numeric_limits<float>::infinity();
  }
  return g;
}

bellows::layer_info layer_of(const config& c) { return {3, "fc", bellows::shape{c.n}}; }

std::size_t ranks() { return static_cast<std::size_t>(bellows::cuda::device_count()); }

}  // namespace

TEST_CASE("cuda signsgd: every rank's average, memory and step equal the CPU's, bit for bit" *
          doctest::skip(bellows::test::no_device())) {
  using bellows::feedback;
  const std::vector<config> configs = {
      {0, {.bucket = 0, .feedback = feedback::residual}, false},
      {1, {.bucket = 1, .feedback = feedback::none}, true},
      {1000, {.bucket = 7, .feedback = feedback::residual}, true},
      {777, {.bucket = 33, .feedback = feedback::none}, false},
      {4099, {.bucket = 100, .feedback = feedback::residual}, false},
      {5000, {.bucket = 0, .feedback = feedback::residual}, true},      // one bucket of 5 chunks
      {3000, {.bucket = 2048, .feedback = feedback::residual}, false},  // 2 and 1 chunks
      {1025, {.bucket = 1024, .feedback = feedback::scaled}, false},
      {500, {.bucket = 100000, .feedback = feedback::residual}, true},  // a bucket longer than the layer
  };
  const std::size_t w = ranks();
  for (const config& c : configs) {
    CAPTURE(c.n);
    CAPTURE(c.params.bucket);
    const auto input = [&](std::size_t step, std::size_t rank) { return gradient(c, step, rank, w); };
    const auto want = bellows::test::trace_on_cpu<bellows::signsgd>(c.params, layer_of(c), w, steps, input);
    const auto got = bellows::test::trace_on_device<bellows::signsgd>(c.params, layer_of(c), steps, input);
    bellows::test::check_same_traces(got, want);
    // the NaN and Inf steps are skipped everywhere and leave the input as it was
    if (c.nan_step && c.n != 0) {
      CHECK(want[0].status[1] == step_status::non_finite);
      CHECK(want[0].status[2] == step_status::non_finite);
      CHECK(want[0].step == 1);
      CHECK(bellows::test::same_bytes(got[0].out[1], gradient(c, 1, 0, w)));
    }
  }
}

TEST_CASE("cuda signsgd: a malformed payload raises wire_error on every rank and changes nothing" *
          doctest::skip(bellows::test::no_device())) {
  // 1001 elements in buckets of 7: 143 scales (572 bytes), 126 sign bytes (the last with 1 bit
  // used), 6 bytes of padding
  const config c{1001, {.bucket = 7, .feedback = bellows::feedback::residual}, false};
  const std::size_t signs_at = bellows::wire::header_bytes + 572;
  const auto input = [&](std::size_t step, std::size_t rank) { return gradient(c, step, rank, ranks()); };
  for (const bellows::test::corruption& bad : std::vector<bellows::test::corruption>{
           {8, 0x01, 1, "elements in"},                          // the header's n
           {24, 0x08, 1, "bucket parameter"},                    // the header's param
           {bellows::wire::header_bytes + 3, 0xFF, 1, "scale"},  // scale 0 negative
           {signs_at + 126, 0x01, 1, "padding"},                 // a padding byte
           {signs_at + 125, 0xFE, 1, "unused bits"},             // above the 1 bit used of the last sign byte
       }) {
    CAPTURE(bad.offset);
    bellows::test::check_malformed<bellows::signsgd>(c.params, layer_of(c), input, bad);
  }
}

TEST_CASE("cuda signsgd: wrong streams and sizes are refused before anything runs" *
          doctest::skip(bellows::test::no_device())) {
  const config c{100, {.bucket = 16, .feedback = bellows::feedback::residual}, false};
  bellows::test::check_refusals<bellows::signsgd>(
      c.params, layer_of(c), [&](std::size_t step, std::size_t rank) { return gradient(c, step, rank, ranks()); });
}

TEST_CASE("cuda signsgd: checkpoints cross backends" * doctest::skip(bellows::test::no_device())) {
  const config c{300, {.bucket = 64, .feedback = bellows::feedback::residual}, false};
  bellows::test::check_checkpoints<bellows::signsgd>(
      c.params, layer_of(c), [&](std::size_t step, std::size_t rank) { return gradient(c, step, rank, ranks()); });
}

TEST_CASE("cuda signsgd: the scatter exchange is refused at construction (the CPU's only, for now)" *
          doctest::skip(bellows::test::no_device())) {
  CHECK_THROWS_WITH_AS(bellows::signsgd<bellows::cuda::executor>({.exchange = bellows::exchange::scatter}),
                       doctest::Contains("CPU backend only"), bellows::error);
}
