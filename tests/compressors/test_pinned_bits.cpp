// SPDX-License-Identifier: Apache-2.0
// Today's bits of every CPU compressor, pinned: for each example configuration of each method of
// compressors/list.hpp (a new one joins by joining the list, and fails until its rows are
// pinned), on three seeded layers and W = 1, 2 and 3 ranks of the local collective, four steps
// are digested (tests/support/pinned_bits.hpp): every byte each rank sent through the
// collective, each step's status, traffic and output, the error memory and the checkpoint record
// after the last step. A change that alters any of these bits fails here, naming the example,
// the layer and W; a deliberate one prints the new rows with BELLOWS_PRINT_DIGESTS=1 and updates
// the table below in the same commit (docs/reliability.md#pinned-bits).
#include <bellows/concepts.hpp>
#include <bellows/cpu/executor.hpp>

#include <doctest/doctest.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "../support/examples.hpp"
#include "../support/pinned_bits.hpp"

namespace {

using bellows::testing::pinned_row;

using pinned_cases = bellows::testing::every_example<bellows::testing::pinned_case>;

// The digests of today's CPU compressors, by method, example and layer: W = 1, 2, 3.
constexpr pinned_row pinned[] = {
    {"identity", 0, "vector", {0xed70ff59246d1dfcu, 0x084841ff25be7840u, 0x9db29edff8b8fe10u}},
    {"identity", 0, "matrix", {0x239e2e61e2155bdbu, 0xd4021f55181946e8u, 0xfe07ba4350077b98u}},
    {"identity", 0, "odd", {0xd6a6592f69ccb9aau, 0xe67fd8d755f0935eu, 0x031b807c31081222u}},
    {"topk", 0, "vector", {0xa20d5409d828f487u, 0x3e59392e214ab075u, 0xf9cc9f41b14aeaa7u}},
    {"topk", 0, "matrix", {0x62144f1363cfd653u, 0x7903c4b5bc3a17c8u, 0xd800232799ce8f21u}},
    {"topk", 0, "odd", {0x2cb0aaae1411151du, 0x3273e8a46f965aa8u, 0xe7a58162f0424772u}},
    {"topk", 1, "vector", {0x732e296a200d3d4fu, 0x8b055a2309826924u, 0x0aa77b3c47ebf422u}},
    {"topk", 1, "matrix", {0xce808373f73bca46u, 0x9585f9470606c4f1u, 0x35b0ece0770508f9u}},
    {"topk", 1, "odd", {0xa57b19d682cb4750u, 0xea4fd53be098cab0u, 0x88acc5c2d888cb15u}},
    {"topk", 2, "vector", {0x0ddac678a59f5d01u, 0x01cb3523d562fb10u, 0x4ada012b9e35fbd5u}},
    {"topk", 2, "matrix", {0x8584d2734bcdd798u, 0xbdadd258f0da6e8bu, 0x0dce3e4e5f22ff75u}},
    {"topk", 2, "odd", {0x849b5ca928706dc9u, 0xca45be501a11501au, 0xb34a54c9c981a836u}},
    {"topk", 3, "vector", {0x57c10771e9f9eddeu, 0x99748058ba176880u, 0x3e7f2aa9508d19b6u}},
    {"topk", 3, "matrix", {0x970136a939188c9du, 0x6c694085a8c342a3u, 0x49528d28c213b822u}},
    {"topk", 3, "odd", {0x3f09e5cc1ad08476u, 0xa58f2028fa187f33u, 0x85ecb4054cc1e086u}},
    {"topk", 4, "vector", {0x13f993802f480eddu, 0x773e3beb5bcb84dau, 0xaf4a2e85ebf4c734u}},
    {"topk", 4, "matrix", {0xf4f7005530eaa3b8u, 0x1b635978459f47a6u, 0x6e8f732f9a2c6522u}},
    {"topk", 4, "odd", {0x15e75a16523e9dfcu, 0xbd3b63627f96c1f7u, 0xc5bcd7e08b5ffd9au}},
    {"topk", 5, "vector", {0x464570126ad4c592u, 0xd4a205281fa0bd7du, 0xeed250adb41914f1u}},
    {"topk", 5, "matrix", {0x3a954d45fbc65ce8u, 0x5ec0ab8ab6ab058eu, 0x8f5390d2097f98f0u}},
    {"topk", 5, "odd", {0x27e8ee878d02a32au, 0xa97c0c9b98666891u, 0x6f971abc16852735u}},
    {"randk", 0, "vector", {0x5f4b3c59dc87accfu, 0x8b46444dc3bb7778u, 0x01a98b88b4b7da9fu}},
    {"randk", 0, "matrix", {0x6df7b941f0b9fb2eu, 0x3c37edc88d1b17f2u, 0xc450be9ef8af79d3u}},
    {"randk", 0, "odd", {0x8a99eeb076d4e7cbu, 0xbd50dc3e92fddaa0u, 0xbe9f5c4090feb37du}},
    {"randk", 1, "vector", {0x59b866282023bddbu, 0x1ac2e8896c9d20dbu, 0xc9d9dd29d416fcdeu}},
    {"randk", 1, "matrix", {0x18e419a6b908d4eau, 0x54364f8e6013fbf1u, 0xc52bc39b11f83588u}},
    {"randk", 1, "odd", {0xad4a2a96d1802bb9u, 0x13b5aa2c38d108f5u, 0x12b85cc5e2d102f0u}},
    {"randk", 2, "vector", {0x3675d377c8eedb3bu, 0x10a00238cf77d2f9u, 0xb291740c82a9903eu}},
    {"randk", 2, "matrix", {0xa2997d74e6461893u, 0xc6f3944e904279c8u, 0x4926d6842f5810d3u}},
    {"randk", 2, "odd", {0xf3edca7a6acb3d00u, 0x935f03a284a1d13bu, 0xf63723eaf12c7a89u}},
    {"randk", 3, "vector", {0x30d705b474296cc2u, 0x4e23f6daf506f6a6u, 0xaf35f46f005ae984u}},
    {"randk", 3, "matrix", {0x0a762bb3198b6fb1u, 0xcaad78ee88a93c93u, 0x7415f9cbe486cf53u}},
    {"randk", 3, "odd", {0xe13d4bc1d5d992dbu, 0x7c8b478c9dbf3302u, 0x52d77f8ff62bc3f2u}},
    {"qsgd", 0, "vector", {0x4eb0a13770d0321fu, 0x97754272d68437d9u, 0xb227cc3a91eed606u}},
    {"qsgd", 0, "matrix", {0xb86632afccfc820eu, 0xd7a8b99900e3c3aau, 0xe427bb99ffa77d96u}},
    {"qsgd", 0, "odd", {0xf13ad50ed4f9ef40u, 0x464bb1add9e74811u, 0x025841b766c5887eu}},
    {"qsgd", 1, "vector", {0xd01a06db8d9c75cfu, 0x0354922919cbe5b5u, 0xd665ce1af1d46b34u}},
    {"qsgd", 1, "matrix", {0xe752cc321b5028d1u, 0xfec24bea602e6ed5u, 0xb54a9b334b3c52f8u}},
    {"qsgd", 1, "odd", {0x0609dd6921ada2cbu, 0xe2523fff91ef3345u, 0x7a3883d7b15d11d9u}},
    {"qsgd", 2, "vector", {0xa60bd3ac2ff61564u, 0xf4fa363f26b10120u, 0x0459b192477ba91cu}},
    {"qsgd", 2, "matrix", {0x253134150370837au, 0x241bd74c62e54949u, 0x36a5be5d4a0cbc40u}},
    {"qsgd", 2, "odd", {0xca241b658039dfbcu, 0xe7f51a521b941ef4u, 0x3fd3111797825102u}},
    {"qsgd", 3, "vector", {0x267b2a331f25fe78u, 0xe02ae88e21054532u, 0xdfa969d101eba86bu}},
    {"qsgd", 3, "matrix", {0x912bc07ebe35976cu, 0x4695ed7804c53ab5u, 0x1e8c2c3d6eadb1fbu}},
    {"qsgd", 3, "odd", {0x5a71a91634b7cec3u, 0x2ebb27333c1a2130u, 0x3dbf519f9517d52eu}},
    {"powersgd", 0, "vector", {0x76174be330ac94d5u, 0xe48d5b139b61157fu, 0x120232c3ffbeb983u}},
    {"powersgd", 0, "matrix", {0x5dea50b9c906c437u, 0xf43a7d1e749f9002u, 0xaf89f5fa0d2cb572u}},
    {"powersgd", 0, "odd", {0xc708311e5c5910cfu, 0xc486e58f3a64620bu, 0x442e2cd186bcced0u}},
    {"powersgd", 1, "vector", {0x76174be330ac94d5u, 0xe48d5b139b61157fu, 0x120232c3ffbeb983u}},
    {"powersgd", 1, "matrix", {0xa4664490e8685fcdu, 0x14e6ff4e61d33139u, 0x3ffa1cc9d695fa9cu}},
    {"powersgd", 1, "odd", {0xc708311e5c5910cfu, 0xc486e58f3a64620bu, 0x442e2cd186bcced0u}},
    {"powersgd", 2, "vector", {0x76174be330ac94d5u, 0xe48d5b139b61157fu, 0x120232c3ffbeb983u}},
    {"powersgd", 2, "matrix", {0xc09d4b543ebaabceu, 0x4f1da7dfa2604eeau, 0xd456eed5ecbe95c5u}},
    {"powersgd", 2, "odd", {0x78bf3b2359a9a30bu, 0x384fd1d1c27f5a77u, 0x630da06005a4d5afu}},
    {"signsgd", 0, "vector", {0xe556d7c09e2edd44u, 0x80c974b50bb8bb19u, 0x22baad1caf5e80edu}},
    {"signsgd", 0, "matrix", {0xd0d43d21d8482dccu, 0xccc4b5c0fbb22bddu, 0x7d0df70617b0599au}},
    {"signsgd", 0, "odd", {0x65c47c54050e3f86u, 0x216636906e04abadu, 0xb36127f53dd01ec3u}},
    {"signsgd", 1, "vector", {0xfee60281e9efcb1fu, 0xdf2a56ed8ced739fu, 0xaf5bc1d3516dc87cu}},
    {"signsgd", 1, "matrix", {0xe45d5fd5599370f9u, 0x49d194ee96318acdu, 0xb96d5eeafb91ba14u}},
    {"signsgd", 1, "odd", {0x3fb9f0524f3d8aeau, 0x5c7cb95233717be6u, 0x831429071b851d61u}},
    {"signsgd", 2, "vector", {0x02daa1b3cb8e5a6eu, 0x061487a9cbbf40b7u, 0xc75106722b48b866u}},
    {"signsgd", 2, "matrix", {0x4d73fb342c26d1f5u, 0xf5816106318288f8u, 0xe675aa3ec6cda286u}},
    {"signsgd", 2, "odd", {0x08f45a7bb9df7595u, 0xcee6401781c0ae0fu, 0x876a9b00bd10dbc2u}},
    {"signsgd", 3, "vector", {0x495797a30b0585bcu, 0x2e49e5f6495aa87fu, 0x0aafe6a3ea687547u}},
    {"signsgd", 3, "matrix", {0x7e6a4a63c5aef105u, 0xc4a5f518f05ef9d5u, 0xcc611ab979c37a74u}},
    {"signsgd", 3, "odd", {0x0bc78daeb5564127u, 0x2a81c1ceb6c18e9fu, 0xddbb11ff114e942cu}},
};

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("pinned bits: the CPU compressor's payloads, outputs, memory and checkpoint", Case,
                          pinned_cpu) {
  using M = typename Case::method;
  for (const bellows::layer_info& layer : bellows::testing::pinned_layers) {
    std::array<std::uint64_t, std::size(bellows::testing::pinned_ranks)> got{};
    for (std::size_t i = 0; i < got.size(); ++i)
      got[i] = bellows::testing::digest_on_cpu<M>(Case::params, layer, bellows::testing::pinned_ranks[i]);
    bellows::testing::check_pinned(pinned, M::name, Case::example, layer.name, got);
  }
  // The runs compress: a compressor that leaves some layers uncompressed compresses one of these.
  using C = typename M::template compressor<bellows::cpu::executor>;
  if constexpr (bellows::SelectiveCompressor<C>) {
    bellows::cpu::executor exec(1);
    const C c = M::make(Case::params, exec);
    bool compresses = false;
    for (const bellows::layer_info& layer : bellows::testing::pinned_layers)
      compresses = compresses || c.compresses(c.make_state(layer));
    CHECK(compresses);
  }
}

TEST_CASE_TEMPLATE_APPLY(pinned_cpu, pinned_cases);

TEST_CASE("pinned bits: the CPU table has one row per example and layer, and no other") {
  bellows::testing::check_rows(pinned, bellows::compressor_methods{}, [](auto) { return true; });
}
