// SPDX-License-Identifier: Apache-2.0
// randk<cuda::executor> (shared mode) over the NCCL collective, one rank per device, against
// randk<cpu::executor> over the local collective with the same ranks and inputs: every status,
// average, error memory and step counter bit for bit, NaN steps included; what it refuses;
// checkpoints that cross backends.
#include <bellows/collectives/nccl.cuh>
#include <bellows/compressors/randk.hpp>
#include <bellows/compressors/randk.cuh>

#include <doctest/doctest.h>

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
  bellows::randk_params params;
  bool nan_step;  ///< the last rank's input at step 1 holds an Inf
};

inline constexpr std::size_t steps = 3;

std::vector<float> gradient(const config& c, std::size_t step, std::size_t rank, std::size_t ranks) {
  std::vector<float> g = bellows::testing::normal_floats(c.n, 500 * step + rank + 7);
  if (c.nan_step && step == 1 && rank + 1 == ranks && c.n != 0) g[c.n - 1] = -std::numeric_limits<float>::infinity();
  return g;
}

bellows::layer_info layer_of(const config& c) { return {2, "conv", bellows::shape{c.n}}; }

std::size_t ranks() { return static_cast<std::size_t>(bellows::cuda::device_count()); }

}  // namespace

TEST_CASE("cuda randk: every rank's average, memory and step equal the CPU's, bit for bit" *
          doctest::skip(bellows::test::no_device())) {
  using bellows::feedback;
  const std::vector<config> configs = {
      {0, {.ratio = 0.5}, false},
      {1, {.ratio = 1.0, .seed = 3}, true},
      {1000, {.ratio = 0.01, .seed = 11}, true},                                         // few: the plain draw
      {1000, {.ratio = 0.9, .feedback = feedback::none}, false},                         // most: the complement
      {5000, {.k = 37, .unbiased = true, .feedback = feedback::none, .seed = 5}, true},  // n / k scaling
      {4099, {.ratio = 0.25, .feedback = feedback::scaled, .seed = 8}, false},
      // per-rank mode: each rank's own draw, averaged by allgather
      {1, {.ratio = 1.0, .mode = bellows::randk_mode::per_rank}, true},
      {1000, {.ratio = 0.01, .mode = bellows::randk_mode::per_rank, .seed = 11}, true},
      {1000, {.ratio = 0.9, .mode = bellows::randk_mode::per_rank, .feedback = feedback::none}, false},
      {5000,
       {.k = 37, .mode = bellows::randk_mode::per_rank, .unbiased = true, .feedback = feedback::none, .seed = 5},
       true},
  };
  const std::size_t w = ranks();
  for (const config& c : configs) {
    CAPTURE(c.n);
    CAPTURE(c.params.ratio);
    CAPTURE(c.params.k);
    const auto input = [&](std::size_t step, std::size_t rank) { return gradient(c, step, rank, w); };
    const auto want = bellows::test::trace_on_cpu<bellows::randk>(c.params, layer_of(c), w, steps, input);
    const auto got = bellows::test::trace_on_device<bellows::randk>(c.params, layer_of(c), steps, input);
    bellows::test::check_same_traces(got, want);
    if (c.nan_step && c.n != 0) {
      CHECK(want[0].status[1] == step_status::non_finite);
      CHECK(bellows::test::same_bytes(got[0].out[1], gradient(c, 1, 0, w)));
    }
  }
}

TEST_CASE("cuda randk: per-rank payloads corrupted in transit raise the CPU validation's wire_error" *
          doctest::skip(bellows::test::no_device())) {
  const config c{1000, {.ratio = 0.01, .mode = bellows::randk_mode::per_rank, .seed = 4}, false};
  const auto input = [&](std::size_t step, std::size_t rank) { return gradient(c, step, rank, ranks()); };
  const std::size_t at = bellows::wire::header_bytes;  // the 10 indices, then the 10 values
  for (const bellows::test::corruption& bad : std::vector<bellows::test::corruption>{
           {at + 4 * 9, 1000, 4, "indices must ascend"},   // the last index is n
           {at + 40, 0x7FC00000u, 4, "non-finite value"},  // value 0 is NaN
       }) {
    CAPTURE(bad.says);
    bellows::test::check_malformed<bellows::randk>(c.params, layer_of(c), input, bad);
  }
}

TEST_CASE("cuda randk: wrong states, streams and sizes are refused before anything runs" *
          doctest::skip(bellows::test::no_device())) {
  CHECK_THROWS_WITH_AS((void)bellows::randk<bellows::cuda::executor>({.unbiased = true}),
                       doctest::Contains("unbiased scaling needs feedback none"), bellows::error);
  const config c{200, {.ratio = 0.1}, false};
  bellows::test::check_refusals<bellows::randk>(
      c.params, layer_of(c), [&](std::size_t step, std::size_t rank) { return gradient(c, step, rank, ranks()); });
}

TEST_CASE("cuda randk: checkpoints cross backends" * doctest::skip(bellows::test::no_device())) {
  const config c{300, {.ratio = 0.1, .seed = 2}, false};
  bellows::test::check_checkpoints<bellows::randk>(
      c.params, layer_of(c), [&](std::size_t step, std::size_t rank) { return gradient(c, step, rank, ranks()); });
}

TEST_CASE("cuda randk: make_state refuses a layer of 2^32 elements, which the device does not draw from" *
          doctest::skip(bellows::test::no_device())) {
  bellows::cuda::executor exec;
  const bellows::randk<bellows::cuda::executor> c({.ratio = 0.01, .feedback = bellows::feedback::none}, exec);
  CHECK_THROWS_WITH_AS((void)c.make_state({0, "embedding", bellows::shape{std::size_t{1} << 32}}),
                       doctest::Contains("fewer than 2^32"), bellows::error);
}
