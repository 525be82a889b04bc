// SPDX-License-Identifier: Apache-2.0
// Today's bits of every device compressor, pinned, as tests/compressors/test_pinned_bits.cpp
// pins the CPU's: for each example configuration of each method of compressors/list.hpp that
// has a device compressor (M::on_device), on the three seeded layers of
// tests/support/pinned_bits.hpp and W = 1, 2 and 3 ranks, four steps of X<cuda::executor> on
// device memory are digested: every byte each rank sent through the collective, each step's
// status, traffic and output, the error memory and the checkpoint record after the last step.
//
// The ranks are the local collective's threads, each on device rank % device count, exchanging
// through collectives::staged (as the Fashion-MNIST demo's --backend cuda does), which lets W
// differ from the device count. The recording collective sits under the staging: it sees the
// device buffers of each allreduce_sum and allgather_slots as staged copies them to the host,
// byte for byte, and of a gathered slot the payload its header measures.
//
// Every example of every such method runs.
//
// Identity, top-k, rand-k, QSGD and EF-signSGD give the CPU's bits: each device run is held to the CPU's
// run of the same case, whose digests the CPU's table pins, so the device table leaves them out.
// PowerSGD's device products sum in another order than the CPU's (tests/cuda/test_powersgd.cu),
// so its bits are its own; and on a GPU its query's normals come from the device's libm, a float
// ulp or so from the host's (tests/cuda/test_philox.cu), so its rows are the emulation's bits and
// are checked only under the emulation (tests/emulation), where both use one libm.
#include <bellows/collectives/local.hpp>
#include <bellows/collectives/staged.cuh>
#include <bellows/compressors/identity.cuh>
#include <bellows/compressors/list.hpp>
#include <bellows/compressors/powersgd.cuh>
#include <bellows/compressors/qsgd.cuh>
#include <bellows/compressors/randk.cuh>
#include <bellows/compressors/signsgd.cuh>
#include <bellows/compressors/topk.cuh>
#include <bellows/concepts.hpp>
#include <bellows/core/checkpoint.hpp>
#include <bellows/cuda/executor.cuh>

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "../support/examples.hpp"
#include "../support/pinned_bits.hpp"
#include "device_test.cuh"

namespace {

using bellows::testing::pinned_row;

template <class... Cases>
auto on_device_only(std::tuple<Cases...>) -> decltype(std::tuple_cat(
    std::declval<std::conditional_t<Cases::method::on_device, std::tuple<Cases>, std::tuple<>>>()...));

/// Every example of every listed method that has a device compressor.
using device_cases =
    decltype(on_device_only(std::declval<bellows::testing::every_example<bellows::testing::pinned_case>>()));

/// Whether M's device compressor sums in its own order, so that its bits are not the CPU's.
template <class M>
constexpr bool own_sums() {
  return M::name == std::string_view("powersgd");
}

/// Whether the device's own bits (own_sums) are pinned where this test runs: under the emulation
/// only.
#if defined(__CUDACC__)
constexpr bool own_bits_pinned = false;
#else
constexpr bool own_bits_pinned = true;
#endif

/// The digest of `pinned_steps` steps of M's device compressor with `params` on `ranks` ranks.
template <class M>
std::uint64_t digest_on_device(const typename M::params& params, const bellows::layer_info& layer, std::size_t ranks) {
  using bellows::testing::rank_digest;
  std::vector<rank_digest> digests(ranks);
  const auto devices = static_cast<std::size_t>(bellows::cuda::device_count());
  bellows::collectives::local_group group(ranks);
  group.run([&](bellows::collectives::local& comm) {
    const std::size_t rank = comm.rank();
    BELLOWS_CUDA_CHECK(cudaSetDevice(static_cast<int>(rank % devices)));
    cudaStream_t stream = nullptr;
    BELLOWS_CUDA_CHECK(cudaStreamCreate(&stream));
    {
      rank_digest& d = digests[rank];
      bellows::cuda::executor exec(stream);
      bellows::testing::recording<bellows::collectives::local> recorded(comm, d.sent);
      bellows::collectives::staged<bellows::testing::recording<bellows::collectives::local>> coll(recorded, stream);
      auto c = M::make(params, exec);
      auto st = c.make_state(layer);
      for (std::size_t s = 0; s < bellows::testing::pinned_steps; ++s) {
        const bellows::test::device_array<float> g(bellows::testing::pinned_gradient(layer, rank, s));
        const bellows::reduce_result r = c.reduce(st, g.span(), coll);
        d.step(r, g.host());
      }
      std::vector<float> memory;
      if constexpr (requires { bellows::test::memory_of(st.memory); }) memory = bellows::test::memory_of(st.memory);
      bellows::checkpoint_writer record;
      if constexpr (bellows::CheckpointedCompressor<decltype(c)>) c.save(st, record);
      d.finish(memory, record.bytes());
    }
    BELLOWS_CUDA_CHECK(cudaStreamDestroy(stream));
  });
  return bellows::testing::digest_of(digests);
}

// The digests of today's device compressors that sum in their own order (the emulation's), by
// method, example and layer: W = 1, 2, 3.
constexpr pinned_row pinned[] = {
    {"powersgd", 0, "vector", {0x76174be330ac94d5u, 0xe48d5b139b61157fu, 0x120232c3ffbeb983u}},
    {"powersgd", 0, "matrix", {0x55f51ffd692df742u, 0x3b48dd8a51584d0bu, 0xf50a6787e0da33c2u}},
    {"powersgd", 0, "odd", {0xc708311e5c5910cfu, 0xc486e58f3a64620bu, 0x442e2cd186bcced0u}},
    {"powersgd", 1, "vector", {0x76174be330ac94d5u, 0xe48d5b139b61157fu, 0x120232c3ffbeb983u}},
    {"powersgd", 1, "matrix", {0x8e02a3a8a4724465u, 0x694f63b11cd14bfcu, 0xe0ae51776aae8c43u}},
    {"powersgd", 1, "odd", {0xc708311e5c5910cfu, 0xc486e58f3a64620bu, 0x442e2cd186bcced0u}},
    {"powersgd", 2, "vector", {0x76174be330ac94d5u, 0xe48d5b139b61157fu, 0x120232c3ffbeb983u}},
    {"powersgd", 2, "matrix", {0x75faee1c4a02bdbeu, 0x475aa3e1172fbcafu, 0x497d19083ac1c294u}},
    {"powersgd", 2, "odd", {0x3a395b3cf0eaf247u, 0x8d7ce2b077870148u, 0x3e644aad1beb0ed9u}},
};

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("pinned bits: the device compressor's payloads, outputs, memory and checkpoint" *
                              doctest::skip(bellows::test::no_device()),
                          Case, pinned_device) {
  using M = typename Case::method;
  for (const bellows::layer_info& layer : bellows::testing::pinned_layers) {
    std::array<std::uint64_t, std::size(bellows::testing::pinned_ranks)> got{};
    for (std::size_t i = 0; i < got.size(); ++i) {
      const std::size_t w = bellows::testing::pinned_ranks[i];
      got[i] = digest_on_device<M>(Case::params, layer, w);
      if constexpr (!own_sums<M>())
        CHECK_MESSAGE(got[i] == bellows::testing::digest_on_cpu<M>(Case::params, layer, w), M::name, " example ",
                      Case::example, ", layer ", layer.name, ", W = ", w, ": the device's bits are not the CPU's");
    }
    if constexpr (own_sums<M>()) {
      if constexpr (own_bits_pinned)
        bellows::testing::check_pinned(pinned, M::name, Case::example, layer.name, got);
      else
        MESSAGE(M::name, " example ", Case::example, ", layer ", layer.name,
                ": the pinned bits are the emulation's, not checked on a GPU");
    }
  }
}

TEST_CASE_TEMPLATE_APPLY(pinned_device, device_cases);

TEST_CASE("pinned bits: the device table has one row per example and layer of each device compressor that sums "
          "in its own order" *
          doctest::skip(bellows::test::no_device())) {
  bellows::testing::check_rows(pinned, bellows::compressor_methods{},
                               []<class M>(std::type_identity<M>) { return M::on_device && own_sums<M>(); });
}
