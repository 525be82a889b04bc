// SPDX-License-Identifier: Apache-2.0
// The kernels one step of every device compressor of the list launches, at each of its examples,
// counted under the emulation (which counts the kernels each rank's thread launches): the second
// step of a 64x48 layer and of a vector of 300, on every emulated device, held to the counts the
// device bodies launched before each compressor was written once over the executor (measured
// with this file against them; PowerSGD and identity were one class already, and PowerSGD's
// device body had launched 12 and 3). On a device the case reports skipped: nothing counts
// launches there.
#include <bellows/collectives/nccl.cuh>
#include <bellows/compressors/identity.cuh>
#include <bellows/compressors/list.hpp>
#include <bellows/compressors/powersgd.cuh>
#include <bellows/compressors/qsgd.cuh>
#include <bellows/compressors/randk.cuh>
#include <bellows/compressors/signsgd.cuh>
#include <bellows/compressors/topk.cuh>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../support/random.hpp"
#include "device_test.cuh"
#include "nccl_ranks.cuh"

#if !defined(__CUDACC__)
namespace {

/// The launches of a step of `method` at example `example` that its device body made, on the
/// matrix and on the vector (measured with this file at commit f65c550); for top-k's leader
/// (examples 4 and 5), which no device body had, those of the leader's rank when it came.
struct bound {
  std::string_view method;
  std::size_t example;
  std::uint64_t matrix, vector;
};
constexpr bound device_bodies[] = {
    {"identity", 0, 3, 3},  {"topk", 0, 17, 17},    {"topk", 1, 32, 32},    {"topk", 2, 17, 17},  {"topk", 3, 14, 14},
    {"topk", 4, 17, 17},    {"topk", 5, 35, 35},    {"randk", 0, 9, 9},     {"randk", 1, 12, 12}, {"randk", 2, 9, 9},
    {"randk", 3, 12, 12},   {"qsgd", 0, 4, 4},      {"qsgd", 1, 4, 4},      {"qsgd", 2, 4, 4},    {"qsgd", 3, 5, 5},
    {"powersgd", 0, 11, 3}, {"powersgd", 1, 11, 3}, {"powersgd", 2, 11, 3}, {"signsgd", 0, 7, 6}, {"signsgd", 1, 6, 6},
    {"signsgd", 2, 5, 5},   {"signsgd", 3, 6, 6},
};

/// Launches per rank of the second step of M at example i on a layer of shape `shp`.
template <class M>
std::vector<std::uint64_t> launches_of(std::size_t i, const bellows::shape& shp) {
  std::vector<std::uint64_t> launches(static_cast<std::size_t>(bellows::cuda::device_count()));
  bellows::test::on_every_device([&](std::size_t rank, bellows::collectives::nccl& coll) {
    bellows::cuda::executor exec(coll.stream());
    auto c = M::make(M::examples[i], exec);
    auto st = c.make_state({0, "fc", shp});
    bellows::test::device_array<float> g(bellows::testing::normal_floats(shp.size(), rank + 1));
    (void)c.reduce(st, g.span(), coll);  // the first step sizes what it sizes
    const std::uint64_t before = bellows_emulation::launched;
    (void)c.reduce(st, g.span(), coll);
    launches[rank] = bellows_emulation::launched - before;
  });
  return launches;
}

}  // namespace

TEST_CASE("cuda launches: kernels per step of every device compressor, no more than its device body launched") {
  const bellows::shape matrix{64, 48}, vector{300};
  std::size_t cases = 0;
  bellows::for_each_method(bellows::compressor_methods{}, [&]<class M>(std::type_identity<M>) {
    if constexpr (M::on_device) {
      for (std::size_t i = 0; i < std::size(M::examples); ++i) {
        const bound* b = nullptr;
        for (const bound& d : device_bodies)
          if (d.method == M::name && d.example == i) b = &d;
        INFO(M::name, " example ", i, " has no bound: measure it against its device body");
        REQUIRE(b != nullptr);
        for (const auto& [what, shp, most] : {std::tuple{std::string("matrix"), matrix, b->matrix},
                                              std::tuple{std::string("vector"), vector, b->vector}}) {
          for (const std::uint64_t n : launches_of<M>(i, shp)) {
            INFO(M::name, " example ", i, " ", what, ": ", n, " launches per step, the device body ", most);
            CHECK(n <= most);
          }
          ++cases;
        }
      }
    }
  });
  CHECK(cases == std::size(device_bodies) * 2);
}
#else
TEST_CASE("cuda launches: counted under the emulation only" * doctest::skip(true)) {}
#endif
