// SPDX-License-Identifier: Apache-2.0
// EF-signSGD against a scalar reference written here from its definition (docs/signsgd.md), not
// from the library's kernels: payload bytes, scales, averages over 1, 2 and 3 ranks, error
// memories, non-finite steps, every validation failure, checkpoints, parameters, thread counts.
#include <bellows/collectives/local.hpp>
#include <bellows/compressors/signsgd.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "../support/allocation_counter.hpp"
#include "../support/random.hpp"

namespace {

using bellows::step_status;
using bellows::collectives::local;
using bellows::collectives::local_group;

constexpr std::size_t sizes[] = {0, 1, 7, 31, 32, 1023, 1024, 1025, 4097, 100003};
constexpr std::size_t buckets[] = {0, 1, 64, 100, 1024, 3000};

// ---- the reference, from the definition ------------------------------------------------------

namespace ref {

std::size_t bucket_count(std::size_t n, std::size_t bucket) {
  if (n == 0) return 0;
  return bucket == 0 ? 1 : (n + bucket - 1) / bucket;
}

std::size_t bucket_of(std::size_t i, std::size_t bucket) { return bucket == 0 ? 0 : i / bucket; }

/// mean |p| of p[lo, hi) in the order of the definition.
float scale(const std::vector<float>& p, std::size_t lo, std::size_t hi) {
  double total = 0.0;
  for (std::size_t c0 = lo; c0 < hi; c0 += 1024) {
    const std::size_t c1 = std::min(hi, c0 + 1024);
    float lane[32] = {};
    for (std::size_t i = c0; i < c1; ++i) lane[(i - c0) % 32] = lane[(i - c0) % 32] + std::fabs(p[i]);
    for (std::size_t d = 16; d >= 1; d /= 2)
      for (std::size_t j = 0; j < d; ++j) lane[j] = lane[j] + lane[j + d];
    total = total + static_cast<double>(lane[0]);
  }
  return static_cast<float>(total / static_cast<double>(hi - lo));
}

struct payload {
  std::vector<float> scales;
  std::vector<std::uint8_t> signs;
  bool finite = true;
  std::vector<std::byte> bytes;  ///< the whole wire payload
};

payload encode(const std::vector<float>& p, std::size_t bucket) {
  const std::size_t n = p.size(), nb = bucket_count(n, bucket), len = bucket == 0 ? n : bucket;
  payload q;
  for (std::size_t b = 0; b < nb; ++b) {
    q.scales.push_back(scale(p, b * len, std::min(n, (b + 1) * len)));
    q.finite = q.finite && std::isfinite(q.scales.back());
  }
  q.signs.assign((n + 7) / 8, 0);
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] < 0.0f) q.signs[i / 8] = static_cast<std::uint8_t>(q.signs[i / 8] | (1u << (i % 8)));
  const std::size_t body = (4 * nb + q.signs.size() + 7) / 8 * 8;
  q.bytes.assign(40 + body, std::byte{0});
  const auto put = [&](std::size_t at, auto v) { std::memcpy(q.bytes.data() + at, &v, sizeof(v)); };
  put(0, std::uint32_t{0x53574C42u});  // "BLWS"
  put(4, std::uint16_t{1});
  put(6, std::uint8_t{5});
  put(7, static_cast<std::uint8_t>(q.finite ? 0u : 2u));
  put(8, std::uint64_t{n});
  put(16, std::uint64_t{nb});
  put(24, static_cast<std::uint32_t>(bucket));
  put(28, std::uint32_t{0});
  put(32, std::uint64_t{body});
  if (nb != 0) std::memcpy(q.bytes.data() + 40, q.scales.data(), 4 * nb);
  if (n != 0) std::memcpy(q.bytes.data() + 40 + 4 * nb, q.signs.data(), q.signs.size());
  return q;
}

float value(const payload& q, std::size_t i, std::size_t bucket) {
  const float s = q.scales[bucket_of(i, bucket)];
  return (q.signs[i / 8] >> (i % 8) & 1u) != 0 ? -s : s;
}

/// One step of every rank: the averages (the same on all) and each rank's next memory; `ok`
/// false when some rank's payload is not finite.
struct step {
  bool ok = true;
  std::vector<float> out;
  std::vector<std::vector<float>> memory;
};

step reduce(const std::vector<std::vector<float>>& g, const std::vector<std::vector<float>>& e, std::size_t bucket,
            bool with_memory) {
  const std::size_t w = g.size(), n = g[0].size();
  std::vector<std::vector<float>> m(w);
  std::vector<payload> q(w);
  step s;
  for (std::size_t r = 0; r < w; ++r) {
    m[r] = g[r];
    if (with_memory)
      for (std::size_t i = 0; i < n; ++i) m[r][i] = g[r][i] + e[r][i];
    q[r] = encode(m[r], bucket);
    s.ok = s.ok && q[r].finite;
  }
  if (!s.ok) return s;
  s.out.assign(n, 0.0f);
  for (std::size_t i = 0; i < n; ++i) {
    float sum = 0.0f;
    for (std::size_t r = 0; r < w; ++r) sum = sum + value(q[r], i, bucket);
    s.out[i] = sum / static_cast<float>(w);
  }
  s.memory.resize(w);
  for (std::size_t r = 0; r < w; ++r) {
    if (!with_memory) continue;
    s.memory[r].resize(n);
    for (std::size_t i = 0; i < n; ++i) s.memory[r][i] = m[r][i] - value(q[r], i, bucket);
  }
  return s;
}

}  // namespace ref

// ---- helpers ---------------------------------------------------------------------------------

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

struct storage {
  std::vector<std::uint64_t> words;
  explicit storage(std::size_t bytes) : words((bytes + 7) / 8) {}
  std::span<std::byte> bytes() { return std::as_writable_bytes(std::span(words)); }
};

/// Test data: normal values with zeros, -0.0, ties of magnitude and values of both signs.
std::vector<float> data(std::size_t n, std::uint64_t seed) {
  std::vector<float> v = bellows::testing::normal_floats(n, seed);
  for (std::size_t i = 0; i < n; i += 13) v[i] = 0.0f;
  for (std::size_t i = 5; i < n; i += 17) v[i] = -0.0f;
  for (std::size_t i = 3; i < n; i += 11) v[i] = (i % 2 != 0) ? 0.5f : -0.5f;
  return v;
}

bellows::layer_info layer(std::size_t n) { return {7, "fc", bellows::shape{n}}; }

}  // namespace

TEST_CASE("signsgd: payload bytes and scales equal the reference for every size, bucket and thread count") {
  bellows::cpu::executor one(1), two(2);
  for (std::size_t n : sizes)
    for (std::size_t bucket : buckets) {
      CAPTURE(n);
      CAPTURE(bucket);
      const std::vector<float> p = data(n, n * 31 + bucket);
      const ref::payload want = ref::encode(p, bucket);
      for (bellows::cpu::executor* exec : {&one, &two}) {
        const bellows::signsgd<> c({.bucket = bucket}, *exec);
        const auto st = c.make_state(layer(n));
        REQUIRE(c.max_payload_bytes(st) == want.bytes.size());
        storage buf(c.max_payload_bytes(st));
        const auto got = c.encode(st, p, buf.bytes(), 0);
        REQUIRE(got.size() == want.bytes.size());
        CHECK(std::memcmp(got.data(), want.bytes.data(), got.size()) == 0);
        CHECK(same_bits(std::span(reinterpret_cast<const float*>(got.data() + 40), want.scales.size()), want.scales));
        CHECK(c.validate(st, got) == step_status::ok);
        // decode_add adds the decoded values to what the accumulator held
        std::vector<float> acc(n, 0.25f), expect(n);
        for (std::size_t i = 0; i < n; ++i) expect[i] = 0.25f + ref::value(want, i, bucket);
        CHECK(c.decode_add(st, got, acc) == step_status::ok);
        CHECK(same_bits(acc, expect));
      }
    }
}

TEST_CASE("signsgd: buckets longer than a task (2^16 elements) equal the reference") {
  bellows::cpu::executor one(1), two(2);
  const std::size_t n = 200001;
  for (std::size_t bucket :
       {std::size_t{0}, std::size_t{65537}, std::size_t{70000}, std::size_t{131072}, std::size_t{1} << 20}) {
    CAPTURE(bucket);
    const std::vector<float> p = data(n, bucket);
    const ref::payload want = ref::encode(p, bucket);
    for (bellows::cpu::executor* exec : {&one, &two}) {
      const bellows::signsgd<> c({.bucket = bucket}, *exec);
      const auto st = c.make_state(layer(n));
      storage buf(c.max_payload_bytes(st));
      const auto got = c.encode(st, p, buf.bytes(), 0);
      REQUIRE(got.size() == want.bytes.size());
      CHECK(std::memcmp(got.data(), want.bytes.data(), got.size()) == 0);
    }
  }
}

TEST_CASE("signsgd: the scalar and AVX2 encode kernels give the same bits") {
  const std::vector<float> p = data(5000, 3);
  const auto& widest = bellows::cpu::detail::sign_encoders_for_this_cpu();
  const auto& base = bellows::cpu::detail::sign_encoders_baseline;
  for (std::size_t len : {0u, 1u, 31u, 32u, 33u, 100u, 1000u, 1024u}) {
    CAPTURE(len);
    CHECK(std::bit_cast<std::uint32_t>(widest.chunk_sum(p.data() + 3, len)) ==
          std::bit_cast<std::uint32_t>(base.chunk_sum(p.data() + 3, len)));
  }
  for (std::size_t n : {1u, 8u, 9u, 31u, 32u, 33u, 64u, 100u, 4999u}) {
    CAPTURE(n);
    std::vector<std::uint8_t> a((n + 7) / 8, 0xAA), b((n + 7) / 8, 0x55);
    widest.pack_signs(p.data(), n, 0, a.size(), a.data());
    base.pack_signs(p.data(), n, 0, b.size(), b.data());
    CHECK(a == b);
  }
}

TEST_CASE("signsgd: the scalar and AVX2 decode kernels give the same bits") {
#if BELLOWS_X86_VERSIONS
  if (!__builtin_cpu_supports("avx2")) return;
  using bellows::cpu::detail::decode_mode;
  const std::size_t n = 96;
  std::vector<std::uint8_t> signs(n / 8);
  for (std::size_t k = 0; k < signs.size(); ++k) signs[k] = static_cast<std::uint8_t>(37 * k + 11);
  const std::vector<float> m = data(n, 8);
  const auto both = [&]<decode_mode Mode>(float s) {
    std::vector<float> a = data(n, 9), b = a;
    bellows::cpu::detail::decode_bytes_scalar<Mode>(signs.data(), 8, n, s, a.data() + 8, m.data() + 8);
    bellows::cpu::detail::decode_bytes_avx2<Mode>(signs.data(), 8, n, s, b.data() + 8, m.data() + 8);
    return same_bits(a, b);
  };
  for (float s : {0.0f, 0.75f, 3e38f}) {
    CAPTURE(s);
    CHECK(both.operator()<decode_mode::write>(s));
    CHECK(both.operator()<decode_mode::first>(s));
    CHECK(both.operator()<decode_mode::add>(s));
    CHECK(both.operator()<decode_mode::residual>(s));
  }
#endif
}

TEST_CASE("signsgd: a zero scale with sign bits set decodes to -0.0; the average sums it from +0") {
  // No encoder sends this (a bucket of zeros has no negative element), but the format allows it.
  bellows::cpu::executor exec(1);
  const bellows::sign_layout l{0, 8};
  const std::vector<float> scales = {0.0f};
  const std::vector<std::uint8_t> signs = {0xFF};
  const bellows::sign_arrays part{scales, signs};
  std::vector<float> out(8, 5.0f);
  bellows::cpu::sign_average(exec, {&part, 1}, l, out);
  for (float x : out) CHECK(std::bit_cast<std::uint32_t>(x) == 0u);  // 0.0f + -0.0f is +0
  bellows::cpu::sign_decode(exec, part, l, out, false);
  for (float x : out) CHECK(std::bit_cast<std::uint32_t>(x) == 0x80000000u);
}

TEST_CASE("signsgd: reduce over 1, 2 and 3 ranks equals the reference: averages, memories, steps") {
  for (std::size_t w : {1u, 2u, 3u})
    for (std::size_t n : sizes)
      for (std::size_t bucket : buckets) {
        if (w == 3 && n == 100003 && bucket != 0 && bucket != 1) continue;  // keep the run time short
        const bellows::feedback fb = (n + bucket) % 3 == 0 ? bellows::feedback::none : bellows::feedback::residual;
        CAPTURE(w);
        CAPTURE(n);
        CAPTURE(bucket);
        const bool memory = fb != bellows::feedback::none;
        constexpr std::size_t steps = 2;
        // the reference, step by step
        std::vector<std::vector<float>> e(w, std::vector<float>(n, 0.0f));
        std::vector<ref::step> want;
        for (std::size_t s = 0; s < steps; ++s) {
          std::vector<std::vector<float>> g(w);
          for (std::size_t r = 0; r < w; ++r) g[r] = data(n, 100 * s + r + n);
          want.push_back(ref::reduce(g, e, bucket, memory));
          REQUIRE(want.back().ok);
          if (memory) e = want.back().memory;
        }
        std::atomic<std::size_t> right{0};
        local_group group(w);
        group.run([&](local& comm) {
          bellows::cpu::executor exec(1 + comm.rank() % 2);  // thread counts differ between ranks
          bellows::signsgd<> c({.bucket = bucket, .feedback = fb}, exec);
          auto st = c.make_state(layer(n));
          bool ok = true;
          for (std::size_t s = 0; s < steps; ++s) {
            std::vector<float> g = data(n, 100 * s + comm.rank() + n);
            const auto res = c.reduce(st, g, comm);
            ok &= res.status == step_status::ok && st.step == s + 1;
            ok &= res.sent == bellows::traffic{c.max_payload_bytes(st), ref::bucket_count(n, bucket) + n, n};
            ok &= same_bits(g, want[s].out);
            if (memory) ok &= same_bits(st.memory.values(), want[s].memory[comm.rank()]);
          }
          ok &= st.memory.enabled() == memory;
          if (ok) ++right;
        });
        CHECK(right == w);
      }
}

TEST_CASE("signsgd: zeros, -0.0 and ties") {
  bellows::cpu::executor exec(1);
  const bellows::signsgd<> c({.bucket = 0, .feedback = bellows::feedback::none}, exec);
  auto st = c.make_state(layer(5));
  const std::vector<float> p = {0.0f, -0.0f, 1.0f, -1.0f, 2.0f};
  storage buf(c.max_payload_bytes(st));
  const auto payload = c.encode(st, p, buf.bytes(), 0);
  float s = 0;
  std::memcpy(&s, payload.data() + 40, 4);
  CHECK(s == 0.8f);                                    // (0 + 0 + 1 + 1 + 2) / 5
  CHECK(static_cast<unsigned>(payload[44]) == 0x08u);  // only element 3 is negative; -0.0 is not
  std::vector<float> acc(5, 0.0f);
  CHECK(c.decode_add(st, payload, acc) == step_status::ok);
  CHECK(acc == std::vector<float>{0.8f, 0.8f, 0.8f, -0.8f, 0.8f});
  // an all-zero layer: scale +0, no sign bits, decoded +0, memory 0
  bellows::signsgd<> ef({.bucket = 2}, exec);
  auto zst = ef.make_state(layer(5));
  std::vector<float> z = {0.0f, -0.0f, 0.0f, -0.0f, 0.0f};
  local_group(1).run([&](local& comm) { CHECK(ef.reduce(zst, z, comm).status == step_status::ok); });
  for (float x : z) CHECK(std::bit_cast<std::uint32_t>(x) == 0u);
  for (float x : zst.memory.values()) CHECK(x == 0.0f);
  // one element: exact (mean |x| of one element and its sign)
  auto one = ef.make_state(layer(1));
  std::vector<float> x = {-3.25f};
  local_group(1).run([&](local& comm) { CHECK(ef.reduce(one, x, comm).status == step_status::ok); });
  CHECK(x[0] == -3.25f);
  CHECK(one.memory.values()[0] == 0.0f);
}

TEST_CASE("signsgd: NaN or Inf on one rank makes the step non_finite everywhere and changes nothing") {
  const std::size_t w = 3, n = 2500;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    CAPTURE(bad);
    std::atomic<std::size_t> right{0};
    local_group group(w);
    group.run([&](local& comm) {
      bellows::cpu::executor exec(1);
      bellows::signsgd<> c({.bucket = 100}, exec);
      auto st = c.make_state(layer(n));
      std::vector<float> g0 = data(n, comm.rank());
      bool ok = c.reduce(st, g0, comm).status == step_status::ok;
      const std::vector<float> e(st.memory.values().begin(), st.memory.values().end());
      std::vector<float> g = data(n, 10 + comm.rank());
      if (comm.rank() == 1) g[1234] = bad;
      const std::vector<float> before = g;
      const auto res = c.reduce(st, g, comm);
      ok &= res.status == step_status::non_finite && st.step == 1;
      ok &= std::memcmp(g.data(), before.data(), n * sizeof(float)) == 0;
      ok &= same_bits(st.memory.values(), e);
      // its payload is flagged, and a receiver's decode_add reports it without writing
      storage buf(c.max_payload_bytes(st));
      const auto payload = c.encode(st, before, buf.bytes(), comm.rank());
      std::vector<float> acc(n, 1.0f);
      ok &= c.validate(st, payload) == (comm.rank() == 1 ? step_status::non_finite : step_status::ok);
      if (comm.rank() == 1) ok &= c.decode_add(st, payload, acc) == step_status::non_finite && acc[0] == 1.0f;
      if (ok) ++right;
    });
    CHECK(right == w);
  }
}

namespace {

/// A collective over `local` that, after each allgather, writes `value` at byte `offset` of rank
/// `victim`'s block, or cuts or extends that block by 8 bytes.
struct corrupting {
  local& inner;
  std::size_t victim, offset;
  std::vector<std::byte> value;
  long resize = 0;  ///< -8: the block loses its last 8 bytes; +8: gains 8 zero bytes

  [[nodiscard]] std::size_t rank() const noexcept { return inner.rank(); }
  [[nodiscard]] std::size_t size() const noexcept { return inner.size(); }
  void allreduce_sum(std::span<float> v) { inner.allreduce_sum(v); }
  void allgather(std::span<const std::byte> mine, bellows::gather_buffer& out) {
    inner.allgather(mine, out);
    if (resize != 0) {
      std::vector<std::vector<std::byte>> blocks;
      std::vector<std::size_t> lengths;
      for (std::size_t r = 0; r < out.blocks(); ++r) {
        blocks.emplace_back(out.block(r).begin(), out.block(r).end());
        if (r == victim) blocks.back().resize(blocks.back().size() + static_cast<std::size_t>(resize));
        lengths.push_back(blocks.back().size());
      }
      out.resize(lengths);
      for (std::size_t r = 0; r < out.blocks(); ++r) std::ranges::copy(blocks[r], out.block(r).begin());
      return;
    }
    std::memcpy(out.block(victim).data() + offset, value.data(), value.size());
  }
};

template <class T>
std::vector<std::byte> bytes_of(T v) {
  std::vector<std::byte> b(sizeof(T));
  std::memcpy(b.data(), &v, sizeof(T));
  return b;
}

}  // namespace

TEST_CASE("signsgd: every validation failure raises wire_error and nothing is written") {
  // 21 elements in buckets of 8: 3 scales (12 bytes), 3 sign bytes (5 bits used of the last),
  // 1 byte of padding: body of 16 bytes
  const std::size_t n = 21, bucket = 8, scales_at = 40, signs_at = 52;
  bellows::cpu::executor exec(1);
  const bellows::signsgd<> c({.bucket = bucket}, exec);
  auto st = c.make_state(layer(n));
  REQUIRE(c.max_payload_bytes(st) == 56);
  struct patch {
    std::size_t offset;
    std::vector<std::byte> value;
    const char* says;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<patch> patches = {
      {0, bytes_of(std::uint32_t{0x53574C43u}), "magic"},
      {4, bytes_of(std::uint16_t{2}), "version"},
      {6, bytes_of(std::uint8_t{3}), "codec"},
      {7, bytes_of(std::uint8_t{1}), "elements in"},    // index64
      {7, bytes_of(std::uint8_t{4}), "flag"},           // an unknown flag
      {8, bytes_of(std::uint64_t{22}), "elements in"},  // n
      {16, bytes_of(std::uint64_t{2}), "elements in"},  // count
      {24, bytes_of(std::uint32_t{7}), "bucket parameter"},
      {24, bytes_of(std::uint32_t{0}), "bucket parameter"},
      {28, bytes_of(std::uint32_t{1}), "reserved"},
      {32, bytes_of(std::uint64_t{24}), "body bytes"},
      {scales_at, bytes_of(nan), "scale"},
      {scales_at + 4, bytes_of(inf), "scale"},
      {scales_at + 8, bytes_of(-1.0f), "scale"},
      {scales_at + 4, bytes_of(-std::numeric_limits<float>::denorm_min()), "scale"},
      {signs_at + 2, bytes_of(std::uint8_t{0x20}), "unused bits"},
      {signs_at + 3, bytes_of(std::uint8_t{1}), "padding"},
  };
  const std::vector<float> x = data(n, 4);
  storage good(c.max_payload_bytes(st));
  const auto payload = c.encode(st, x, good.bytes(), 0);
  for (const patch& p : patches) {
    CAPTURE(p.offset);
    CAPTURE(p.says);
    storage copy(payload.size());
    std::memcpy(copy.bytes().data(), payload.data(), payload.size());
    std::memcpy(copy.bytes().data() + p.offset, p.value.data(), p.value.size());
    const auto bad = copy.bytes().first(payload.size());
    CHECK_THROWS_WITH_AS((void)c.validate(st, bad), doctest::Contains(p.says), bellows::wire_error);
    std::vector<float> acc(n, 2.0f);
    CHECK_THROWS_AS((void)c.decode_add(st, bad, acc), bellows::wire_error);
    CHECK(acc == std::vector<float>(n, 2.0f));
  }
  // truncated and extended bodies
  for (long delta : {-8L, 8L}) {
    CAPTURE(delta);
    storage copy(payload.size() + 8);
    std::memcpy(copy.bytes().data(), payload.data(), payload.size());
    const auto bad = copy.bytes().first(static_cast<std::size_t>(static_cast<long>(payload.size()) + delta));
    CHECK_THROWS_AS((void)c.validate(st, bad), bellows::wire_error);
    std::vector<float> acc(n, 2.0f);
    CHECK_THROWS_AS((void)c.decode_add(st, bad, acc), bellows::wire_error);
    CHECK(acc == std::vector<float>(n, 2.0f));
  }
  // through reduce: every rank raises, and neither the input, the memory nor the step change
  const std::size_t w = 3;
  std::vector<patch> through = {patches[5], patches[12], patches[15]};
  through.push_back({0, {}, "body bytes"});  // truncated
  through.push_back({0, {}, "body bytes"});  // extended
  for (std::size_t k = 0; k < through.size(); ++k) {
    CAPTURE(k);
    std::atomic<std::size_t> right{0};
    local_group group(w);
    group.run([&](local& comm) {
      bellows::cpu::executor one(1);
      bellows::signsgd<> ef({.bucket = bucket}, one);
      auto s = ef.make_state(layer(n));
      std::vector<float> g0 = data(n, comm.rank());
      bool ok = ef.reduce(s, g0, comm).status == step_status::ok;
      const std::vector<float> e(s.memory.values().begin(), s.memory.values().end());
      corrupting lossy{comm, 2, through[k].offset, through[k].value};
      if (k == through.size() - 2) lossy.resize = -8;
      if (k == through.size() - 1) lossy.resize = 8;
      std::vector<float> g = data(n, 5 + comm.rank());
      const std::vector<float> before = g;
      try {
        (void)ef.reduce(s, g, lossy);
        ok = false;
      } catch (const bellows::wire_error&) {
      }
      ok &= s.step == 1 && same_bits(g, before) && same_bits(s.memory.values(), e);
      if (ok) ++right;
    });
    CHECK(right == w);
  }
}

TEST_CASE("signsgd: checkpoints round trip; a mismatched or cut record is refused and changes nothing") {
  bellows::cpu::executor exec(1);
  bellows::signsgd<> c({.bucket = 64}, exec);
  auto st = c.make_state(layer(300));
  std::vector<float> g = data(300, 1);
  local_group(1).run([&](local& comm) { CHECK(c.reduce(st, g, comm).status == step_status::ok); });
  CHECK(std::any_of(st.memory.values().begin(), st.memory.values().end(), [](float v) { return v != 0.0f; }));
  bellows::checkpoint_writer w;
  c.save(st, w);
  auto fresh = c.make_state(layer(300));
  bellows::checkpoint_reader r(w.bytes());
  c.load(fresh, r);
  CHECK(fresh.step == 1);
  CHECK(same_bits(fresh.memory.values(), st.memory.values()));
  // a record for another layer size
  auto other = c.make_state(layer(301));
  bellows::checkpoint_reader r2(w.bytes());
  CHECK_THROWS_AS(c.load(other, r2), bellows::wire_error);
  CHECK(other.step == 0);
  CHECK(std::all_of(other.memory.values().begin(), other.memory.values().end(), [](float v) { return v == 0.0f; }));
  // a record without memory into a state with one
  const bellows::signsgd<> none({.bucket = 64, .feedback = bellows::feedback::none}, exec);
  auto nst = none.make_state(layer(300));
  bellows::checkpoint_writer wn;
  none.save(nst, wn);
  auto target = c.make_state(layer(300));
  bellows::checkpoint_reader rn(wn.bytes());
  CHECK_THROWS_AS(c.load(target, rn), bellows::wire_error);
  // a cut record
  bellows::checkpoint_reader cut(w.bytes().first(w.bytes().size() - 4));
  auto again = c.make_state(layer(300));
  CHECK_THROWS_AS(c.load(again, cut), bellows::wire_error);
  CHECK(again.step == 0);
}

TEST_CASE("signsgd: bad parameters and buffers are refused with bellows::error") {
  CHECK_THROWS_WITH_AS(bellows::signsgd<>({.bucket = std::size_t{1} << 32}), doctest::Contains("4294967296"),
                       bellows::error);
  CHECK_NOTHROW(bellows::signsgd<>({.bucket = (std::size_t{1} << 32) - 1}));
  CHECK_THROWS_WITH_AS(bellows::signsgd<>({.feedback = static_cast<bellows::feedback>(9)}),
                       doctest::Contains("feedback"), bellows::error);
  bellows::cpu::executor exec(1);
  const bellows::signsgd<> c({}, exec);
  auto st = c.make_state({0, "head.weight", bellows::shape{4, 4}});
  std::vector<float> x(15);
  bellows::archetypes::collective solo;
  CHECK_THROWS_WITH_AS((void)c.encode(st, x, {}, 0), doctest::Contains("head.weight"), bellows::error);
  CHECK_THROWS_WITH_AS((void)bellows::signsgd<>({}, exec).reduce(st, x, solo), doctest::Contains("head.weight"),
                       bellows::error);
  std::vector<float> y(16);
  CHECK_THROWS_WITH_AS((void)bellows::signsgd<>({.feedback = bellows::feedback::none}, exec).reduce(st, y, solo),
                       doctest::Contains("feedback"), bellows::error);
}

TEST_CASE("signsgd: the method descriptor") {
  using m = bellows::signsgd_method;
  static_assert(std::is_same_v<bellows::method_slot<5>::type, m>);
  CHECK(m::name == "signsgd");
  CHECK(m::codec.id == 5);
  CHECK(std::string(m::codec.name) == "signsgd");
  bellows::method_settings s;
  CHECK(m::configure(s).bucket == 0);
  CHECK(m::configure(s).feedback == bellows::feedback::residual);
  s.set("bucket", "64").set("error-feedback", "none");
  const auto p = m::configure(s);
  CHECK(p.bucket == 64);
  CHECK(p.feedback == bellows::feedback::none);
  const auto d = m::describe(p);
  REQUIRE(d.size() == 4);  // bucket, error_feedback, exchange, owner_memory
  CHECK(d[0].name == "bucket");
  CHECK(std::get<std::uint64_t>(d[0].value) == 64);
  CHECK(std::get<std::string_view>(d[1].value) == "none");
  CHECK(std::get<std::string_view>(d[2].value) == "gather");
  CHECK(std::get<std::string_view>(d[3].value) == "on");
  bellows::cpu::executor exec(1);
  for (const auto& ex : m::examples) {
    auto c = m::make(ex, exec);
    auto st = c.make_state(layer(130));
    std::vector<float> g = data(130, 2);
    bellows::archetypes::collective solo;
    CHECK(c.reduce(st, g, solo).status == step_status::ok);
  }
}

TEST_CASE("signsgd: steady-state steps allocate nothing, long buckets included") {
  for (std::size_t bucket : {std::size_t{0}, std::size_t{64}, std::size_t{70000}}) {
    CAPTURE(bucket);
    bellows::cpu::executor exec(2);
    local_group group(2);
    std::atomic<int> clean{0};
    group.run([&](local& comm) {
      bellows::signsgd<> c({.bucket = bucket}, exec);
      auto st = c.make_state(layer(150000));  // one bucket of 150000, or two of 70000 and one short
      std::vector<float> x = data(150000, comm.rank());
      for (int s = 0; s < 2; ++s) (void)c.reduce(st, x, comm);  // warm-up grows the buffers
      const std::size_t before = bellows::testing::allocations;
      for (int s = 0; s < 3; ++s) (void)c.reduce(st, x, comm);
      if (bellows::testing::allocations == before) ++clean;
    });
    CHECK(clean == 2);
  }
}
