// SPDX-License-Identifier: Apache-2.0
// The device QSGD codes and scales equal the CPU's byte for byte, and so do the decoded values.
#include <bellows/cpu/quantize.hpp>
#include <bellows/cuda/quantize.cuh>
#include <bellows/cpu/executor.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "device_test.cuh"

using bellows::test::same_bytes;

namespace {

/// Normal data with runs of zeros, a huge and a tiny bucket (the double-precision sums), and
/// optionally one non-finite element.
std::vector<float> gradient(std::size_t n, std::size_t bucket, unsigned seed, float bad) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t b = i / bucket;
    v[i] = b % 5 == 1 ? 0.0f : b % 5 == 2 ? d(gen) * 1e30f : b % 5 == 3 ? d(gen) * 1e-30f : d(gen);
  }
  if (bad != 0.0f && n > 0) v[n / 2] = bad;
  return v;
}

/// Quantises on both backends, compares scales, codes, the flag and both decodings.
void compare(std::size_t n, std::size_t bucket, unsigned bits, bellows::bucket_norm norm, float bad) {
  CAPTURE(n);
  CAPTURE(bucket);
  CAPTURE(bits);
  CAPTURE(static_cast<int>(norm));
  CAPTURE(bad);
  static bellows::cpu::executor host(2);
  static bellows::cuda::executor dev;
  const bellows::code_layout layout{bits, bucket, n};
  const bellows::philox::stream rng{0x5eedULL, 7, 3, 1};
  const std::vector<float> in = gradient(n, bucket, 11 + bits, bad);

  std::vector<float> scales(layout.buckets());
  std::vector<std::uint8_t> codes(layout.code_bytes());
  const bool finite = bellows::cpu::quantize_pack(host, in, layout, norm, rng, scales, codes);

  bellows::test::device_array<float> d_in(in), d_scales(layout.buckets());
  bellows::test::device_array<std::uint8_t> d_codes(layout.code_bytes());
  bellows::test::device_array<unsigned> flag(std::vector<unsigned>{0u});
  bellows::cuda::quantize_pack(dev, d_in.span(), layout, norm, rng, d_scales.span(), d_codes.span(), flag.data());
  CHECK(flag.host()[0] == (finite ? 0u : 1u));
  CHECK(same_bytes(d_scales.host(), scales));
  if (!finite) return;  // the codes are meaningless
  CHECK(same_bytes(d_codes.host(), codes));
  // Codes that start at an odd address (inside a payload, say) are written byte by byte.
  bellows::test::device_array<std::uint8_t> shifted(layout.code_bytes() + 1);
  bellows::cuda::quantize_pack(dev, d_in.span(), layout, norm, rng, d_scales.span(), shifted.span().subspan(1),
                               flag.data());
  const std::vector<std::uint8_t> got = shifted.host();
  CHECK(same_bytes(std::vector<std::uint8_t>(got.begin() + 1, got.end()), codes));

  std::vector<float> out(n, 0.5f), summed(n, 0.5f);
  bellows::cpu::unpack_dequantize(host, scales, codes, layout, out, false);
  bellows::cpu::unpack_dequantize(host, scales, codes, layout, summed, true);
  bellows::test::device_array<float> d_out(std::vector<float>(n, 0.5f)), d_summed(std::vector<float>(n, 0.5f));
  bellows::cuda::unpack_dequantize(dev, d_scales.span(), d_codes.span(), layout, d_out.span(), false);
  bellows::cuda::unpack_dequantize(dev, d_scales.span(), d_codes.span(), layout, d_summed.span(), true);
  CHECK(same_bytes(d_out.host(), out));
  CHECK(same_bytes(d_summed.host(), summed));
}

}  // namespace

TEST_CASE("cuda quantize_pack and unpack_dequantize: the CPU's bytes, every width, norm and edge" *
          doctest::skip(bellows::test::no_device())) {
  for (unsigned bits : {2u, 4u, 8u})
    for (auto norm : {bellows::bucket_norm::l2, bellows::bucket_norm::max_abs})
      for (std::size_t bucket : {std::size_t{1}, std::size_t{7}, std::size_t{512}, std::size_t{1000}})
        // the large case has over 10^5 buckets either way (a warp per 4 buckets: 8 * 10^6 threads at
        // 10^6 buckets of 1, too many for the emulated run under AddressSanitizer)
        for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{4 * 512 + 5},
                              bucket < 512 ? std::size_t{100'003} : std::size_t{1'000'003}})
          compare(n, bucket, bits, norm, 0.0f);
}

TEST_CASE("cuda quantize_pack: NaN and Inf give the CPU's scales and raise the flag" *
          doctest::skip(bellows::test::no_device())) {
  for (unsigned bits : {2u, 8u})
    for (auto norm : {bellows::bucket_norm::l2, bellows::bucket_norm::max_abs})
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()})
        compare(10'000, 512, bits, norm, bad);
}
