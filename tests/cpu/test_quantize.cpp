// SPDX-License-Identifier: Apache-2.0
#include <bellows/cpu/quantize.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "../support/bits.hpp"
#include "../support/random.hpp"

namespace {

using bellows::bucket_norm;
using bellows::code_layout;

/// The code of element i, straight from docs/spec.md#qsgd with word i of the stream (scalar Philox).
std::uint32_t reference_code(float v, float scale, std::uint32_t s, unsigned bits, const bellows::philox::stream& rng,
                             std::size_t i) {
  if (scale == 0.0f) return 0;
  const float u = bellows::philox::to_uniform(rng.word(i));
  const auto level = std::min<std::int32_t>(
      static_cast<std::int32_t>(std::abs(v) * (static_cast<float>(s) / scale) + u), static_cast<std::int32_t>(s));
  const std::uint32_t sign = level != 0 && std::signbit(v) ? 1u << (bits - 1) : 0u;
  return sign | static_cast<std::uint32_t>(level);
}

std::uint32_t code_at(const std::vector<std::uint8_t>& codes, std::size_t i, unsigned bits) {
  return (codes[i * bits / 8] >> (i * bits % 8)) & ((1u << bits) - 1);
}

struct packed {
  std::vector<float> scales;
  std::vector<std::uint8_t> codes;
  bool finite;
};

packed pack(bellows::cpu::executor& exec, const std::vector<float>& v, const code_layout& l, bucket_norm norm,
            const bellows::philox::stream& rng) {
  packed p{std::vector<float>(l.buckets()), std::vector<std::uint8_t>(l.code_bytes(), 0xAB), false};
  p.finite = bellows::cpu::quantize_pack(exec, v, l, norm, rng, p.scales, p.codes);
  return p;
}

}  // namespace

TEST_CASE("quantize_pack: codes are SPEC's, word i of the stream for element i, for every width and bucket") {
  bellows::cpu::executor one(1), three(3);
  const bellows::philox::stream rng{9, 4, 2, 1};
  for (unsigned bits : {2u, 4u, 8u}) {
    for (std::size_t bucket : {1u, 3u, 32u, 100u, 512u}) {
      for (std::size_t n : {1u, 31u, 1000u, 70001u}) {
        for (bucket_norm norm : {bucket_norm::l2, bucket_norm::max_abs}) {
          CAPTURE(bits);
          CAPTURE(bucket);
          CAPTURE(n);
          const code_layout l{bits, bucket, n};
          auto v = bellows::testing::normal_floats(n, n + bits);
          if (n > 600) std::fill(v.begin() + 200, v.begin() + 400, 0.0f);  // whole zero buckets
          const packed a = pack(one, v, l, norm, rng);
          const packed b = pack(three, v, l, norm, rng);
          CHECK(a.finite);
          CHECK(a.scales == b.scales);
          CHECK(a.codes == b.codes);
          std::size_t wrong = 0;
          for (std::size_t i = 0; i < n; ++i) {
            const std::size_t k = i / bucket;
            // The scale: the norm of the bucket (checked in double) and never below its largest |v|.
            double ss = 0, top = 0;
            for (std::size_t t = k * bucket; t < std::min(n, (k + 1) * bucket); ++t) {
              ss += static_cast<double>(v[t]) * v[t];
              top = std::max(top, static_cast<double>(std::abs(v[t])));
            }
            const double want = norm == bucket_norm::l2 ? std::sqrt(ss) : top;
            if (i % bucket == 0) {
              CHECK(std::abs(a.scales[k] - want) <= 1e-6 * want);
              CHECK(a.scales[k] >= top);
            }
            wrong += code_at(a.codes, i, bits) != reference_code(v[i], a.scales[k], l.levels(), bits, rng, i);
          }
          CHECK(wrong == 0);
          // Bits past the last code are zero.
          if (n * bits % 8 != 0) CHECK((a.codes.back() >> (n * bits % 8)) == 0);
        }
      }
    }
  }
}

TEST_CASE("quantize_range: the baseline and the AVX2 build write the same bytes") {
#if BELLOWS_X86_VERSIONS
  if (!__builtin_cpu_supports("avx2")) {
    MESSAGE("no AVX2 here: only the baseline build runs");
    return;
  }
  namespace d = bellows::cpu::detail;
  const bellows::philox::stream rng{77, 1, 5, 0};
  for (std::size_t bucket : {3u, 100u, 512u}) {
    CAPTURE(bucket);
    auto v = bellows::testing::normal_floats(70001, bucket);
    // magnitudes from 2^-20 to 2^20 across buckets, a zero bucket, and a bucket of one large value
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::ldexp(v[i], static_cast<int>(i / bucket % 41) - 20);
    std::fill(v.begin() + 600, v.begin() + 900, 0.0f);
    for (bucket_norm norm : {bucket_norm::l2, bucket_norm::max_abs}) {
      const auto run = [&]<unsigned Bits>(bool avx2) {
        const code_layout l{Bits, bucket, v.size()};
        std::vector<float> scales(l.buckets());
        std::vector<std::uint8_t> codes(l.code_bytes());
        const auto body = [&] {
          d::quantize_range<Bits>(v, l, norm, rng, bellows::cpu::philox_lanes_for_this_cpu(), scales, codes.data(), 0,
                                  l.buckets());
        };
        if (avx2)
          d::run_avx2(body);
        else
          body();
        return std::pair{scales, codes};
      };
      CHECK(run.operator()<2>(false) == run.operator()<2>(true));
      CHECK(run.operator()<4>(false) == run.operator()<4>(true));
      CHECK(run.operator()<8>(false) == run.operator()<8>(true));
    }
  }
#else
  MESSAGE("not an x86-64 GCC or Clang build: there is no AVX2 build");
#endif
}

TEST_CASE("unpack_dequantize: decodes every code to sign * level * (scale / s), written or added") {
  bellows::cpu::executor one(1), three(3);
  const bellows::philox::stream rng{1, 0, 0, 0};
  for (unsigned bits : {2u, 4u, 8u}) {
    for (std::size_t bucket : {1u, 7u, 64u, 512u}) {
      const std::size_t n = 5000;
      CAPTURE(bits);
      CAPTURE(bucket);
      const code_layout l{bits, bucket, n};
      const auto v = bellows::testing::normal_floats(n, bits * bucket);
      const packed p = pack(one, v, l, bucket_norm::l2, rng);
      std::vector<float> out(n, 7.0f), acc(n, 1.0f), acc3(n, 1.0f);
      bellows::cpu::unpack_dequantize(one, p.scales, p.codes, l, out, false);
      bellows::cpu::unpack_dequantize(one, p.scales, p.codes, l, acc, true);
      bellows::cpu::unpack_dequantize(three, p.scales, p.codes, l, acc3, true);
      CHECK(acc == acc3);
      const float s = static_cast<float>(l.levels());
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t c = code_at(p.codes, i, bits);
        const float mag = static_cast<float>(c & ((1u << (bits - 1)) - 1)) * (p.scales[i / bucket] / s);
        const float want = (c >> (bits - 1)) ? -mag : mag;
        CHECK(out[i] == want);
        CHECK(acc[i] == 1.0f + want);
        // Round trip: within one level of the input.
        CHECK(std::abs(out[i] - v[i]) <= p.scales[i / bucket] / s * 1.0001f);
      }
    }
  }
}

TEST_CASE("quantize_pack: zero buckets encode zeros; NaN or Inf report a non-finite scale") {
  bellows::cpu::executor one(1);
  const bellows::philox::stream rng{3, 1, 1, 1};
  const code_layout l{4, 16, 40};  // buckets of 16, 16 and a short one of 8
  std::vector<float> v(40, 0.0f);
  v[20] = -0.0f;
  packed p = pack(one, v, l, bucket_norm::l2, rng);
  CHECK(p.finite);
  for (float s : p.scales) CHECK(s == 0.0f);
  for (std::uint8_t c : p.codes) CHECK(c == 0);
  // Values too small to carry a scale (below 2^-100) quantise to zero as well.
  std::fill(v.begin(), v.end(), 1e-35f);
  p = pack(one, v, l, bucket_norm::max_abs, rng);
  for (float s : p.scales) CHECK(s == 0.0f);
  // A large bucket whose float sum of squares overflows is summed in double: finite scale.
  std::fill(v.begin(), v.end(), 1e20f);
  p = pack(one, v, l, bucket_norm::l2, rng);
  CHECK(p.finite);
  CHECK(std::abs(p.scales[0] - 4e20f) <= 1e15f);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    for (bucket_norm norm : {bucket_norm::l2, bucket_norm::max_abs}) {
      v = bellows::testing::normal_floats(40, 1);
      v[37] = bad;  // in the short last bucket
      p = pack(one, v, l, norm, rng);
      CHECK_FALSE(p.finite);
      CHECK(std::isfinite(p.scales[0]));
      CHECK_FALSE(std::isfinite(p.scales[2]));
    }
  }
}

TEST_CASE("quantize kernels refuse arrays that do not fit the layout") {
  bellows::cpu::executor one(1);
  const code_layout l{8, 4, 10};
  std::vector<float> v(10), scales(3), wrong_scales(2);
  std::vector<std::uint8_t> codes(10), short_codes(9);
  const bellows::philox::stream rng{};
  CHECK_THROWS_AS((void)bellows::cpu::quantize_pack(one, v, l, bucket_norm::l2, rng, wrong_scales, codes),
                  bellows::error);
  CHECK_THROWS_AS((void)bellows::cpu::quantize_pack(one, v, l, bucket_norm::l2, rng, scales, short_codes),
                  bellows::error);
  CHECK_THROWS_AS(bellows::cpu::unpack_dequantize(one, scales, codes, code_layout{3, 4, 10}, v, false), bellows::error);
  CHECK(code_layout{2, 512, 5}.code_bytes() == 2);
  CHECK(code_layout{4, 512, 5}.code_bytes() == 3);
  CHECK(code_layout{8, 512, 1025}.buckets() == 3);
  CHECK(code_layout{8, 512, 1}.levels() == 127);
  CHECK(code_layout{4, 512, 1}.levels() == 7);
  CHECK(code_layout{2, 512, 1}.levels() == 1);
}

TEST_CASE("average_dequantize: the rank-order sum of W decoded payloads from 0, divided by W, in one pass") {
  bellows::cpu::executor one(1), three(3);
  struct shape {
    unsigned bits;
    std::size_t bucket, n;
  };
  // Buckets that are and are not multiples of a code block (and larger than a tile); n = 0 and 1;
  // layers of many tasks.
  const shape shapes[] = {{2, 1, 1},
                          {4, 7, 5000},
                          {8, 64, 5000},
                          {2, 512, 5000},
                          {8, 1000, 5000},
                          {4, 33, 0},
                          {8, 512, 4097},
                          {8, 512, (1u << 20) + 77},
                          {4, 100, (1u << 20) + 3},
                          {8, 5000, 12345}};
  for (const shape& sh : shapes)
    for (std::size_t w : {1u, 2u, 3u, 5u}) {
      CAPTURE(sh.bits);
      CAPTURE(sh.bucket);
      CAPTURE(sh.n);
      CAPTURE(w);
      const code_layout l{sh.bits, sh.bucket, sh.n};
      std::vector<packed> payloads;
      std::vector<bellows::code_arrays> parts;
      for (std::size_t r = 0; r < w; ++r) {
        auto v = bellows::testing::normal_floats(sh.n, 100 + r);
        if (sh.n > 2 * sh.bucket)
          std::fill(v.begin() + static_cast<std::ptrdiff_t>(sh.bucket),
                    v.begin() + static_cast<std::ptrdiff_t>(2 * sh.bucket), 0.0f);  // a zero bucket
        payloads.push_back(
            pack(one, v, l, r % 2 ? bucket_norm::max_abs : bucket_norm::l2, {7, 3, 1, static_cast<std::uint32_t>(r)}));
      }
      for (const packed& p : payloads) parts.push_back({p.scales, p.codes});
      // Reference: element by element, from the codes, in double-checked float steps.
      const float s = static_cast<float>(l.levels());
      std::vector<float> want(sh.n);
      for (std::size_t i = 0; i < sh.n; ++i) {
        float sum = 0.0f;
        for (const packed& p : payloads) {
          const std::uint32_t c = code_at(p.codes, i, sh.bits);
          const float mag = static_cast<float>(c & ((1u << (sh.bits - 1)) - 1)) * (p.scales[i / sh.bucket] / s);
          sum += (c >> (sh.bits - 1)) ? -mag : mag;
        }
        want[i] = sum / static_cast<float>(w);
      }
      // The output aligned, and one float off; garbage in it before the call.
      std::vector<float> storage(sh.n + 1, 7.0f), again(sh.n + 1, -3.0f);
      const std::span<float> aligned(storage.data(), sh.n), shifted(again.data() + 1, sh.n);
      bellows::cpu::average_dequantize(one, parts, l, aligned);
      bellows::cpu::average_dequantize(three, parts, l, shifted);
      CHECK(bellows::testing::same_bits(aligned, want));
      CHECK(bellows::testing::same_bits(shifted, want));
      CHECK(storage[sh.n] == 7.0f);  // nothing written past the output
      CHECK(again[0] == -3.0f);
    }
}

TEST_CASE("average_dequantize refuses no payload, or arrays that do not fit the layout") {
  bellows::cpu::executor one(1);
  const code_layout l{8, 4, 10};
  std::vector<float> scales(3, 1.0f), out(10);
  std::vector<std::uint8_t> codes(10), short_codes(9);
  const bellows::code_arrays good{scales, codes}, bad{scales, short_codes};
  CHECK_THROWS_AS(bellows::cpu::average_dequantize(one, {}, l, out), bellows::error);
  const bellows::code_arrays both[] = {good, bad};
  CHECK_THROWS_AS(bellows::cpu::average_dequantize(one, both, l, out), bellows::error);
  CHECK_THROWS_AS(bellows::cpu::average_dequantize(one, std::span(both, 1), l, std::span(out).first(9)),
                  bellows::error);
}

TEST_CASE("sum_codes8: the baseline, AVX2 and AVX-512 versions add the same bits") {
  namespace d = bellows::cpu::detail;
  std::vector<std::pair<const char*, d::sum_codes8_fn>> versions{{"baseline", &d::sum_codes8_baseline}};
#if BELLOWS_X86_VERSIONS
  if (__builtin_cpu_supports("avx2")) versions.emplace_back("avx2", &d::sum_codes8_avx2);
  if (__builtin_cpu_supports("avx512f")) versions.emplace_back("avx512", &d::sum_codes8_avx512);
#endif
  if (versions.size() == 1) MESSAGE("only the baseline version runs on this processor");
  std::mt19937 rng(5);
  const std::size_t buckets = 3, n = buckets * d::code_block;
  for (std::size_t w : {1u, 2u, 5u}) {
    CAPTURE(w);
    std::vector<std::vector<std::uint8_t>> codes(w, std::vector<std::uint8_t>(n));
    std::vector<std::vector<float>> scales(w, std::vector<float>(buckets));
    std::vector<bellows::code_arrays> parts;
    for (std::size_t r = 0; r < w; ++r) {
      for (auto& c : codes[r]) c = static_cast<std::uint8_t>(rng());  // every pattern, -0 (0x80) included
      codes[r][0] = 0x80;
      for (std::size_t b = 0; b < buckets; ++b)
        scales[r][b] = std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 7.0f, static_cast<int>(rng() % 60) - 30);
      parts.push_back({scales[r], codes[r]});
    }
    std::vector<float> start = bellows::testing::normal_floats(d::code_block, w);
    start[1] = -0.0f;
    for (std::size_t b = 0; b < buckets; ++b) {
      std::vector<float> want = start;
      d::sum_codes8_baseline(parts, b, b * d::code_block, 127.0f, want.data());
      for (const auto& [name, fn] : versions) {
        CAPTURE(name);
        std::vector<float> got = start;
        fn(parts, b, b * d::code_block, 127.0f, got.data());
        CHECK(bellows::testing::same_bits(got, want));
      }
    }
  }
}
