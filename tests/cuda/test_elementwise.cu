// SPDX-License-Identifier: Apache-2.0
// The device elementwise kernels give the CPU kernels' bits, and flag non-finite elements.
#include <bellows/cpu/elementwise.hpp>
#include <bellows/cuda/elementwise.cuh>
#include <bellows/cpu/executor.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <vector>

#include "device_test.cuh"

using bellows::test::same_bytes;

namespace {

std::vector<float> seeded(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

}  // namespace

TEST_CASE("cuda elementwise: the CPU kernels' bits, at n = 0, 1 and beyond one grid" *
          doctest::skip(bellows::test::no_device())) {
  bellows::cpu::executor host(2);
  bellows::cuda::executor dev;
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{5'000'003}}) {
    CAPTURE(n);
    const std::vector<float> a = seeded(n, 1), b = seeded(n, 2);
    bellows::test::device_array<float> da(a), db(b), out(n);

    std::vector<float> want(n);
    bellows::cpu::add(host, want, a, b);
    bellows::cuda::add(dev, out.span(), da.span(), db.span());
    CHECK(same_bytes(out.host(), want));

    bellows::cpu::subtract(host, want, a, b);
    bellows::cuda::subtract(dev, out.span(), da.span(), db.span());
    CHECK(same_bytes(out.host(), want));

    bellows::cpu::divide(host, want, a, 3.0f);
    bellows::cuda::divide(dev, out.span(), da.span(), 3.0f);
    CHECK(same_bytes(out.host(), want));

    std::vector<float> x = a;
    bellows::cpu::add_into(host, x, b);
    bellows::cpu::scale(host, x, 0.7f);
    bellows::cpu::divide(host, x, 3.0f);
    bellows::cuda::add_into(dev, da.span(), db.span());
    bellows::cuda::scale(dev, da.span(), 0.7f);
    bellows::cuda::divide(dev, da.span(), 3.0f);
    CHECK(same_bytes(da.host(), x));

    bellows::cuda::fill(dev, out.span(), -2.5f);
    CHECK(same_bytes(out.host(), std::vector<float>(n, -2.5f)));

    // gated by a verdict in device memory: the bits above when it is 0, nothing when it is not
    for (const float verdict : {0.0f, 2.0f}) {
      bellows::test::device_array<float> skip(std::vector<float>{verdict}), gated(std::vector<float>(n, 4.0f));
      std::vector<float> expect(n, 4.0f);
      if (verdict == 0.0f) bellows::cpu::divide(host, expect, a, 3.0f);
      bellows::cuda::divide(dev, gated.span(), bellows::test::device_array<float>(a).span(), 3.0f, skip.span().data());
      CHECK(same_bytes(gated.host(), expect));
      bellows::cuda::fill(dev, gated.span(), 7.0f, skip.span().data());
      CHECK(same_bytes(gated.host(), verdict == 0.0f ? std::vector<float>(n, 7.0f) : expect));
    }
  }
}

TEST_CASE("cuda compensate: m = g + e and a flag for NaN and Inf, wherever they are, as the CPU's" *
          doctest::skip(bellows::test::no_device())) {
  bellows::cuda::executor dev;
  bellows::cpu::executor host(2);
  const std::size_t n = 100'001;
  std::vector<float> g = seeded(n, 3), e = seeded(n, 4), want(n), on_cpu(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = g[i] + e[i];
  float cpu_flag = 0.0f;
  bellows::cpu::compensate(host, on_cpu, g, e, &cpu_flag);
  CHECK(same_bytes(on_cpu, want));
  CHECK(cpu_flag == 0.0f);
  bellows::test::device_array<float> dg(g), de(e), m(n);
  bellows::test::device_array<float> flag(std::vector<float>{0.0f});
  bellows::test::device_array<unsigned> word(std::vector<unsigned>{0u});
  bellows::cuda::compensate(dev, m.span(), dg.span(), de.span(), flag.data());
  CHECK(same_bytes(m.host(), want));
  CHECK(flag.host()[0] == 0.0f);
  bellows::cuda::flag_non_finite(dev, dg.span(), word.data());
  CHECK(word.host()[0] == 0u);

  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    for (std::size_t at : {std::size_t{0}, n - 1}) {
      std::vector<float> g2 = g;
      g2[at] = bad;
      bellows::test::device_array<float> dg2(g2);
      bellows::test::device_array<float> f1(std::vector<float>{0.0f});
      bellows::test::device_array<unsigned> f2(std::vector<unsigned>{0u});
      bellows::cuda::compensate(dev, m.span(), dg2.span(), de.span(), f1.data());
      bellows::cuda::flag_non_finite(dev, dg2.span(), f2.data());
      CHECK(f1.host()[0] == 1.0f);
      CHECK(f2.host()[0] == 1u);
      float f_cpu = 0.0f;
      bellows::cpu::compensate(host, on_cpu, g2, e, &f_cpu);
      CHECK(f_cpu == 1.0f);
    }
  }
}
