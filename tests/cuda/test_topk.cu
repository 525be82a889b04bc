// SPDX-License-Identifier: Apache-2.0
// topk<cuda::executor> over the NCCL collective, one rank per device, against
// topk<cpu::executor> over the local collective with the same ranks and inputs: every status,
// traffic figure, average, error memory and step counter bit for bit, in exact and approximate
// mode, by allgather and by the dense allreduce, with ties and NaN steps; malformed payloads;
// what it refuses; checkpoints that cross backends.
#include <bellows/collectives/nccl.cuh>
#include <bellows/compressors/topk.hpp>
#include <bellows/compressors/topk.cuh>

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
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
  bellows::topk_params params;
  bool nan_step;  ///< the last rank's input at step 1 holds a NaN
  bool ties;      ///< magnitudes from a few levels, so the threshold falls among equal ones
};

inline constexpr std::size_t steps = 3;

std::vector<float> gradient(const config& c, std::size_t step, std::size_t rank, std::size_t ranks) {
  std::vector<float> g = bellows::testing::normal_floats(c.n, 300 * step + rank + 1);
  if (c.ties)
    for (float& x : g) x = std::round(x * 2.0f) / 2.0f;
  if (c.nan_step && step == 1 && rank + 1 == ranks && c.n != 0) g[c.n / 3] = std::numeric_limits<float>::quiet_NaN();
  return g;
}

bellows::layer_info layer_of(const config& c) { return {1, "attn", bellows::shape{c.n}}; }

std::size_t ranks() { return static_cast<std::size_t>(bellows::cuda::device_count()); }

}  // namespace

TEST_CASE("cuda topk: every rank's average, memory, traffic and step equal the CPU's, bit for bit" *
          doctest::skip(bellows::test::no_device())) {
  using bellows::feedback;
  constexpr auto approximate = bellows::topk_mode::approximate;
  const std::vector<config> configs = {
      {0, {.ratio = 0.5}, false, false},
      {1, {.ratio = 1.0}, true, false},
      {1000, {.ratio = 0.01}, true, false},                         // by allgather
      {1000, {.ratio = 0.3}, false, true},                          // dense for 2 ranks or more, ties
      {1000, {.ratio = 0.3, .dense_switch = false}, true, true},    // by allgather, many, ties
      {1000, {.ratio = 0.4, .dense_switch = false}, false, false},  // many: sums of up to W values
      {4099, {.k = 37, .feedback = feedback::none}, true, false},   // no memory
      {5000, {.ratio = 0.05, .feedback = feedback::scaled}, false, true},
      // approximate: each rank keeps k to 1.25 k from its own sample, so the payloads differ in length
      {1000, {.ratio = 0.2, .mode = approximate, .dense_switch = false}, true, false},  // with t_hi
      {40'000, {.ratio = 0.05, .mode = approximate, .seed = 3}, true, false},           // by allgather
      {1000, {.ratio = 0.3, .mode = approximate}, true, false},                         // dense
      {5000, {.ratio = 0.05, .mode = approximate, .feedback = feedback::scaled}, false, false},
      // the exact fallback: ties push the count past 1.25 k; a sample too small to bound it
      {5000, {.ratio = 0.05, .mode = approximate}, false, true},
      {100, {.ratio = 0.05, .mode = approximate}, false, false},
  };
  const std::size_t w = ranks();
  for (const config& c : configs) {
    CAPTURE(c.n);
    CAPTURE(c.params.ratio);
    CAPTURE(c.params.dense_switch);
    const auto input = [&](std::size_t step, std::size_t rank) { return gradient(c, step, rank, w); };
    const auto want = bellows::test::trace_on_cpu<bellows::topk>(c.params, layer_of(c), w, steps, input);
    const auto got = bellows::test::trace_on_device<bellows::topk>(c.params, layer_of(c), steps, input);
    bellows::test::check_same_traces(got, want);
    if (c.params.mode == approximate && c.n > 100 && !c.ties) {  // a count above k went through
      const std::size_t k = bellows::detail::kept_count(layer_of(c), c.params.ratio, c.params.k);
      bool above_k = false;
      for (const auto& rank : want)
        for (const bellows::traffic& t : rank.sent) above_k |= t.kept > k;
      CHECK(above_k);
    }
    if (c.nan_step && c.n != 0) {
      CHECK(want[0].status[1] == step_status::non_finite);
      CHECK(bellows::test::same_bytes(got[0].out[1], gradient(c, 1, 0, w)));
    }
  }
}

TEST_CASE("cuda topk: a malformed payload raises wire_error on every rank and changes nothing" *
          doctest::skip(bellows::test::no_device())) {
  // 1000 elements, k = 10, by allgather: the header, then 10 indices (40 bytes), then 10 values
  const config c{1000, {.ratio = 0.01, .dense_switch = false}, false, false};
  const std::size_t at = bellows::wire::header_bytes;
  const auto input = [&](std::size_t step, std::size_t rank) { return gradient(c, step, rank, ranks()); };
  for (const bellows::test::corruption& bad : std::vector<bellows::test::corruption>{
           {16, 9, 1, "entries where layer"},              // the header's count
           {at + 4 * 9, 1000, 4, "indices must ascend"},   // the last index is n
           {at + 4 * 1, 0, 4, "indices must ascend"},      // index 1 is 0, not above index 0
           {at + 40, 0x7FC00000u, 4, "non-finite value"},  // value 0 is NaN
           {7, 2, 1, "flagged non-finite carries 10"},     // the flag on a payload with entries
           {32, 8, 1, "overruns the 8-byte body"},         // the body size
       }) {
    CAPTURE(bad.offset);
    bellows::test::check_malformed<bellows::topk>(c.params, layer_of(c), input, bad);
  }
}

TEST_CASE("cuda topk: wrong states, streams and sizes are refused before anything runs" *
          doctest::skip(bellows::test::no_device())) {
  const config c{200, {.ratio = 0.1}, false, false};
  bellows::test::check_refusals<bellows::topk>(
      c.params, layer_of(c), [&](std::size_t step, std::size_t rank) { return gradient(c, step, rank, ranks()); });
}

TEST_CASE("cuda topk: checkpoints cross backends" * doctest::skip(bellows::test::no_device())) {
  const config c{300, {.ratio = 0.1}, false, false};
  bellows::test::check_checkpoints<bellows::topk>(
      c.params, layer_of(c), [&](std::size_t step, std::size_t rank) { return gradient(c, step, rank, ranks()); });
}

TEST_CASE("cuda topk: make_state refuses a layer of 2^31 elements, which the device does not select from" *
          doctest::skip(bellows::test::no_device())) {
  bellows::cuda::executor exec;
  const bellows::topk<bellows::cuda::executor> c({.ratio = 0.01, .feedback = bellows::feedback::none}, exec);
  CHECK_THROWS_WITH_AS((void)c.make_state({0, "embedding", bellows::shape{std::size_t{1} << 31}}),
                       doctest::Contains("fewer than 2^31"), bellows::error);
  CHECK(c.make_state({0, "embedding", bellows::shape{(std::size_t{1} << 31) - 1}}).k() == 21474837);
}

TEST_CASE("cuda topk: the scatter exchange is refused at construction (the CPU's only, for now)" *
          doctest::skip(bellows::test::no_device())) {
  CHECK_THROWS_WITH_AS(bellows::topk<bellows::cuda::executor>({.exchange = bellows::exchange::scatter}),
                       doctest::Contains("CPU backend only"), bellows::error);
}
