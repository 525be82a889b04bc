// SPDX-License-Identifier: Apache-2.0
#include <bellows/collectives/counting.hpp>
#include <bellows/collectives/local.hpp>
#include <bellows/compressors/qsgd.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../support/random.hpp"

namespace {

using bellows::collectives::local;
using bellows::collectives::local_group;

struct storage {
  std::vector<std::uint64_t> words;
  explicit storage(std::size_t bytes) : words((bytes + 7) / 8) {}
  std::span<std::byte> bytes() { return std::as_writable_bytes(std::span(words)); }
};

/// Decodes one payload of `in` encoded at `step` by `rank`.
std::vector<float> round_trip(const bellows::qsgd<>& c, bellows::qsgd<>::state& st, const std::vector<float>& in,
                              std::uint64_t step, std::size_t rank = 0) {
  st.step = step;
  storage buf(c.max_payload_bytes(st));
  const auto payload = c.encode(st, in, buf.bytes(), rank);
  std::vector<float> out(in.size(), 0.0f);
  REQUIRE(c.decode_add(st, payload, out) == bellows::step_status::ok);
  return out;
}

}  // namespace

TEST_CASE("qsgd: unbiased, with the variance bound of the paper, for every bit width") {
  bellows::cpu::executor exec(1);
  const std::size_t d = 512, n = 2 * d;
  const int trials = 400;
  const auto v = bellows::testing::normal_floats(n, 1);
  for (unsigned bits : {2u, 4u, 8u}) {
    CAPTURE(bits);
    const bellows::qsgd<> c({.bits = bits, .bucket = d}, exec);
    auto st = c.make_state({0, "fc", bellows::shape{n}});
    const double s = static_cast<double>((1u << (bits - 1)) - 1);
    std::vector<double> mean(n, 0.0);
    double squared_error = 0;  // sum over trials of ||decoded - v||^2
    for (int t = 0; t < trials; ++t) {
      const auto dec = round_trip(c, st, v, static_cast<std::uint64_t>(t), 3);
      for (std::size_t i = 0; i < n; ++i) {
        mean[i] += dec[i] / trials;
        squared_error += (dec[i] - static_cast<double>(v[i])) * (dec[i] - static_cast<double>(v[i]));
      }
    }
    for (std::size_t b = 0; b < n / d; ++b) {
      double norm2 = 0;
      for (std::size_t i = b * d; i < (b + 1) * d; ++i) norm2 += static_cast<double>(v[i]) * v[i];
      const double level = std::sqrt(norm2) / s;  // the spacing of the levels
      // Each decoded value lies in one interval [a, a + level] around v_i: by Hoeffding, the mean
      // of `trials` of them is within level * sqrt(ln(2/delta) / (2 trials)) of its expectation
      // except with probability delta; delta = 1e-9 per element.
      const double bound = level * std::sqrt(std::log(2e9) / (2.0 * trials));
      double bias2 = 0;
      for (std::size_t i = b * d; i < (b + 1) * d; ++i) {
        CHECK(std::abs(mean[i] - v[i]) <= bound);
        bias2 += (mean[i] - v[i]) * (mean[i] - v[i]);
      }
      // A systematic bias would show in the mean square: each element's variance is at most
      // level^2 / 4, so E[(mean - v)^2] <= level^2 / (4 trials); allow 1.5 times that on average.
      CHECK(bias2 / d <= 1.5 * level * level / (4.0 * trials));
    }
    // Variance: E||Q(v) - v||^2 <= min(d / s^2, sqrt(d) / s) ||v||^2 per bucket (Alistarh et al.).
    double norm2 = 0;
    for (float x : v) norm2 += static_cast<double>(x) * x;
    const double dd = static_cast<double>(d);
    CHECK(squared_error / trials <= std::min(dd / (s * s), std::sqrt(dd) / s) * norm2);
  }
}

TEST_CASE("qsgd: round trip within one level for every width, zero buckets, a short last bucket") {
  bellows::cpu::executor exec(1);
  for (unsigned bits : {2u, 4u, 8u}) {
    for (auto norm : {bellows::qsgd_norm::l2, bellows::qsgd_norm::max_abs}) {
      CAPTURE(bits);
      const std::size_t n = 1000, d = 512;  // buckets of 512 and 488
      const bellows::qsgd<> c({.bits = bits, .bucket = d, .norm = norm}, exec);
      auto st = c.make_state({1, "emb", bellows::shape{10, 100}});
      auto v = bellows::testing::normal_floats(n, bits);
      std::fill(v.begin(), v.begin() + 512, 0.0f);  // the first bucket is all zero
      const auto dec = round_trip(c, st, v, 0);
      const double s = static_cast<double>((1u << (bits - 1)) - 1);
      double scale = 0;
      for (std::size_t i = 512; i < n; ++i)
        scale = norm == bellows::qsgd_norm::l2 ? scale + static_cast<double>(v[i]) * v[i]
                                               : std::max(scale, static_cast<double>(std::abs(v[i])));
      if (norm == bellows::qsgd_norm::l2) scale = std::sqrt(scale);
      for (std::size_t i = 0; i < 512; ++i) CHECK(dec[i] == 0.0f);
      for (std::size_t i = 512; i < n; ++i) {
        CHECK(std::abs(dec[i] - v[i]) <= scale / s * (1 + 1e-5));
        CHECK((dec[i] == 0.0f || std::signbit(dec[i]) == std::signbit(v[i])));
      }
      // Payload size: header, 2 scales, the codes, padded to 8 bytes.
      storage buf(c.max_payload_bytes(st));
      const auto payload = c.encode(st, v, buf.bytes(), 0);
      CHECK(payload.size() == bellows::wire::header_bytes + (8 + (n * bits + 7) / 8 + 7) / 8 * 8);
      CHECK(payload.size() == c.max_payload_bytes(st));
    }
  }
}

TEST_CASE("qsgd: reduce averages the ranks' decoded payloads; its traffic is the allgather's") {
  bellows::cpu::executor exec(1);
  const std::size_t w = 3, n = 2000;
  local_group group(w);
  std::vector<std::vector<float>> outs(w);
  std::atomic<int> right{0};
  group.run([&](local& inner) {
    bellows::collectives::counting<local> comm(inner);
    bellows::qsgd<> c({.bits = 4, .bucket = 256, .seed = 11}, exec);
    auto st = c.make_state({2, "fc", bellows::shape{n}});
    auto x = bellows::testing::normal_floats(n, comm.rank());
    const auto res = c.reduce(st, x, comm);
    outs[comm.rank()] = x;
    if (res.status == bellows::step_status::ok && st.step == 1 &&
        c.rounds(st, w)[0].op == bellows::collective_op::allgather && res.sent.bytes == comm.allgather().bytes_sent &&
        comm.allreduce().calls == 0 && res.sent.bytes == c.max_payload_bytes(st))
      ++right;
  });
  CHECK(right == static_cast<int>(w));
  const bellows::qsgd<> c({.bits = 4, .bucket = 256, .seed = 11}, exec);
  auto st = c.make_state({2, "fc", bellows::shape{n}});
  std::vector<double> want(n, 0.0);
  for (std::size_t r = 0; r < w; ++r) {
    const auto dec = round_trip(c, st, bellows::testing::normal_floats(n, r), 0, r);
    for (std::size_t i = 0; i < n; ++i) want[i] += dec[i];
  }
  for (std::size_t i = 0; i < n; ++i) {
    CHECK(outs[0][i] == outs[2][i]);
    CHECK(std::abs(outs[0][i] - want[i] / w) <= 1e-6);
  }
}

TEST_CASE("qsgd: with error feedback, e = m - (local decoded m); NaN or Inf changes nothing") {
  bellows::cpu::executor exec(1);
  local_group group(2);
  std::atomic<int> right{0};
  group.run([&](local& comm) {
    bellows::qsgd<> c({.bits = 2, .bucket = 64, .feedback = bellows::feedback::residual}, exec);
    auto st = c.make_state({0, "fc", bellows::shape{500}});
    bool ok = st.memory.enabled();
    auto g0 = bellows::testing::normal_floats(500, comm.rank());
    auto x = g0;
    ok &= c.reduce(st, x, comm).status == bellows::step_status::ok;
    // Step 0: e was 0, so m = g0; the contribution is g0 quantised at step 0 by this rank.
    auto probe = c.make_state({0, "fc", bellows::shape{500}});
    const auto dec = round_trip(c, probe, g0, 0, comm.rank());
    for (std::size_t i = 0; i < 500; ++i) ok &= st.memory.values()[i] == g0[i] - dec[i];
    const std::vector<float> e(st.memory.values().begin(), st.memory.values().end());
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
      auto g = bellows::testing::normal_floats(500, 7);
      if (comm.rank() == 1) g[499] = bad;
      const auto before = g;
      ok &= c.reduce(st, g, comm).status == bellows::step_status::non_finite;
      ok &= std::memcmp(g.data(), before.data(), 500 * sizeof(float)) == 0;
      ok &= std::equal(e.begin(), e.end(), st.memory.values().begin()) && st.step == 1;
    }
    // save and load carry the step and the memory.
    bellows::checkpoint_writer w;
    c.save(st, w);
    auto fresh = c.make_state({0, "fc", bellows::shape{500}});
    bellows::checkpoint_reader r(w.bytes());
    c.load(fresh, r);
    ok &= fresh.step == 1 && std::equal(e.begin(), e.end(), fresh.memory.values().begin());
    if (ok) ++right;
  });
  CHECK(right == 2);
}

TEST_CASE("qsgd: malformed payloads raise wire_error") {
  bellows::cpu::executor exec(1);
  const bellows::qsgd<> c({.bits = 2, .bucket = 8}, exec);
  auto st = c.make_state({0, "fc", bellows::shape{13}});  // 2 buckets, 26 bits: 4 code bytes
  storage buf(c.max_payload_bytes(st));
  const auto x = bellows::testing::normal_floats(13, 1);
  const auto payload = c.encode(st, x, buf.bytes(), 0);
  CHECK(c.validate(st, payload) == bellows::step_status::ok);
  const auto patched = [&](std::size_t offset, auto value) {
    storage copy(payload.size());
    std::memcpy(copy.bytes().data(), payload.data(), payload.size());
    std::memcpy(copy.bytes().data() + offset, &value, sizeof(value));
    return copy;
  };
  const std::size_t scales_at = bellows::wire::header_bytes, codes_at = scales_at + 8;
  auto other_bits = patched(24, std::uint32_t{4 | 8 << 8});
  auto other_bucket = patched(24, std::uint32_t{2 | 16 << 8});
  auto other_count = patched(16, std::uint64_t{3});
  auto negative_scale = patched(scales_at, -1.0f);
  auto nan_scale = patched(scales_at + 4, std::numeric_limits<float>::quiet_NaN());
  auto stray_bits = patched(codes_at + 3, std::uint8_t{0x40});  // bits 26.. of the last byte
  for (auto* bad : {&other_bits, &other_bucket, &other_count, &negative_scale, &nan_scale, &stray_bits})
    CHECK_THROWS_AS((void)c.validate(st, bad->bytes().first(payload.size())), bellows::wire_error);
  std::vector<float> acc(13, 2.0f);
  CHECK_THROWS_AS((void)c.decode_add(st, stray_bits.bytes().first(payload.size()), acc), bellows::wire_error);
  CHECK(acc == std::vector<float>(13, 2.0f));
}

TEST_CASE("qsgd: bad configuration raises bellows::error naming the value") {
  for (unsigned bits : {0u, 1u, 3u, 5u, 7u, 16u, 32u, 255u}) {
    CAPTURE(bits);
    const std::string expected = "bits must be 2, 4 or 8, got " + std::to_string(bits);
    CHECK_THROWS_WITH_AS(bellows::qsgd<>({.bits = bits}), doctest::Contains(expected.c_str()), bellows::error);
  }
  CHECK_THROWS_WITH_AS(bellows::qsgd<>({.bucket = 0}), doctest::Contains("got 0"), bellows::error);
  CHECK_THROWS_WITH_AS(bellows::qsgd<>({.bucket = std::size_t{1} << 24}), doctest::Contains("16777216"),
                       bellows::error);
  CHECK_THROWS_WITH_AS(bellows::qsgd<>({.norm = static_cast<bellows::qsgd_norm>(4)}),
                       "qsgd: norm must be l2 or max_abs, got the value 4", bellows::error);
  CHECK_THROWS_WITH_AS(bellows::qsgd<>({.feedback = static_cast<bellows::feedback>(9)}),
                       "qsgd: feedback must be none, residual or scaled, got the value 9", bellows::error);
  const bellows::qsgd<> c;
  auto st = c.make_state({0, "head.weight", bellows::shape{4, 4}});
  std::vector<float> x(15);
  bellows::archetypes::collective solo;
  CHECK_THROWS_WITH_AS((void)c.encode(st, x, {}, 0), doctest::Contains("head.weight"), bellows::error);
  CHECK_THROWS_WITH_AS((void)bellows::qsgd<>().reduce(st, x, solo), doctest::Contains("head.weight"), bellows::error);
  // A state made with one memory kind, used by a compressor of another (the device checks the same).
  std::vector<float> y(16), before = y;
  CHECK_THROWS_WITH_AS((void)bellows::qsgd<>({.feedback = bellows::feedback::residual}).reduce(st, y, solo),
                       "qsgd: layer 'head.weight' has a state made with feedback none, used by a compressor with "
                       "feedback residual",
                       bellows::error);
  CHECK(y == before);
}

TEST_CASE("qsgd: a layer of 2^34 elements or more is refused before anything is allocated; sizes below fit") {
  const bellows::qsgd<> c({.bits = 8, .bucket = 1});
  for (const bellows::shape& shp : {bellows::shape{std::size_t{1} << 34}, bellows::shape{std::size_t{1} << 33, 2},
                                    bellows::shape{std::size_t{1} << 62}}) {
    CAPTURE(shp.to_string());
    CHECK_THROWS_WITH_AS((void)c.make_state({0, "embedding", shp}), doctest::Contains("layer 'embedding'"),
                         bellows::error);
  }
  // Below the bound the packed bits, n b <= 2^37, and the payload (one scale per element at the
  // smallest bucket: 4 n + n + 40 bytes) are far from overflowing.
  const bellows::code_layout largest{8, 1, (std::size_t{1} << 34) - 1};
  CHECK(largest.code_bytes() == (std::size_t{1} << 34) - 1);
  CHECK(largest.buckets() == (std::size_t{1} << 34) - 1);
}
