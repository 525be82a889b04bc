// SPDX-License-Identifier: Apache-2.0
// The device compressors' phases (concepts.hpp, PhasedCompressor) run for many layers around one
// call per round and operation over NCCL (tests/support/phased_layers.hpp: the allreduced parts
// in one buffer, the payloads gathered in place by allgather_slots) against each layer's own
// reduce on the same device: the same outputs, results, memories and queries, bit for bit, with
// the layer of a NaN skipped alone.
#include <bellows/collectives/nccl.cuh>
#include <bellows/compressors/identity.cuh>
#include <bellows/compressors/identity.hpp>
#include <bellows/compressors/powersgd.cuh>
#include <bellows/compressors/powersgd.hpp>
#include <bellows/compressors/qsgd.cuh>
#include <bellows/compressors/qsgd.hpp>
#include <bellows/compressors/randk.cuh>
#include <bellows/compressors/randk.hpp>
#include <bellows/compressors/signsgd.cuh>
#include <bellows/compressors/signsgd.hpp>
#include <bellows/compressors/topk.cuh>
#include <bellows/compressors/topk.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <span>

#include "../support/phased_layers.hpp"
#include "compressor_ranks.cuh"
#include "device_test.cuh"

namespace phases_test {

/// Both ways on every device: the same runs, and one layer skipped.
template <class Make>
void check_phases(Make make) {
  bellows::test::check_every_rank([&](std::size_t, bellows::collectives::nccl& coll) {
    bellows::cuda::executor exec(coll.stream());
    auto c = make(exec);
    const std::span<const bellows::layer_info> layers = bellows::test::phased_layers;
    using array = bellows::test::device_array<float>;
    const auto want = bellows::test::run_layers<array>(c, exec, coll, layers, false, 4);
    const auto got = bellows::test::run_layers<array>(c, exec, coll, layers, true, 4);
    return bellows::test::same_runs(got, want) && bellows::test::skipped(got) == 1;
  });
}

}  // namespace phases_test

TEST_CASE("cuda phases: identity over one bucket equals each layer's reduce" *
          doctest::skip(bellows::test::no_device())) {
  phases_test::check_phases(
      [](bellows::cuda::executor& exec) { return bellows::identity<bellows::cuda::executor>(exec); });
}

TEST_CASE("cuda phases: powersgd over one bucket equals each layer's reduce" *
          doctest::skip(bellows::test::no_device())) {
  for (const bool warm : {true, false})
    for (const std::size_t rank : {1u, 4u}) {
      CAPTURE(rank);
      CAPTURE(warm);
      phases_test::check_phases([&](bellows::cuda::executor& exec) {
        return bellows::powersgd<bellows::cuda::executor>({.rank = rank, .warm_start = warm, .seed = 9}, exec);
      });
    }
}

TEST_CASE("cuda phases: top-k averaged densely over one bucket equals each layer's reduce" *
          doctest::skip(bellows::test::no_device())) {
  for (const bellows::topk_mode mode : {bellows::topk_mode::exact, bellows::topk_mode::approximate}) {
    CAPTURE(static_cast<int>(mode));
    phases_test::check_phases([&](bellows::cuda::executor& exec) {
      return bellows::topk<bellows::cuda::executor>({.ratio = 0.5, .mode = mode}, exec);
    });
  }
}

TEST_CASE("cuda phases: top-k's leader over one bucket equals each layer's reduce" *
          doctest::skip(bellows::test::no_device())) {
  for (const bellows::topk_mode mode : {bellows::topk_mode::exact, bellows::topk_mode::approximate})
    for (const bellows::feedback f : {bellows::feedback::residual, bellows::feedback::none}) {
      CAPTURE(static_cast<int>(mode));
      phases_test::check_phases([&](bellows::cuda::executor& exec) {
        return bellows::topk<bellows::cuda::executor>(
            {.ratio = 0.1, .mode = mode, .feedback = f, .exchange = bellows::exchange::leader}, exec);
      });
    }
}

TEST_CASE("cuda phases: rand-k with shared indices over one bucket equals each layer's reduce" *
          doctest::skip(bellows::test::no_device())) {
  phases_test::check_phases([](bellows::cuda::executor& exec) {
    return bellows::randk<bellows::cuda::executor>({.ratio = 0.2, .mode = bellows::randk_mode::shared}, exec);
  });
}

TEST_CASE("cuda phases: the allgather codecs over one bucket equal each layer's reduce" *
          doctest::skip(bellows::test::no_device())) {
  using exec_type = bellows::cuda::executor;
  SUBCASE("qsgd") {
    phases_test::check_phases([](exec_type& exec) {
      return bellows::qsgd<exec_type>({.bits = 4, .bucket = 64, .feedback = bellows::feedback::residual}, exec);
    });
  }
  SUBCASE("signsgd") {
    phases_test::check_phases([](exec_type& exec) { return bellows::signsgd<exec_type>({}, exec); });
  }
  SUBCASE("top-k: small layers switch to an allreduce beside the others' allgather") {
    phases_test::check_phases([](exec_type& exec) {
      return bellows::topk<exec_type>({.ratio = 0.05, .mode = bellows::topk_mode::approximate}, exec);
    });
  }
  SUBCASE("rand-k per rank") {
    phases_test::check_phases([](exec_type& exec) {
      return bellows::randk<exec_type>({.ratio = 0.1, .mode = bellows::randk_mode::per_rank}, exec);
    });
  }
}
