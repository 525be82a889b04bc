// SPDX-License-Identifier: Apache-2.0
#include <bellows/collectives/counting.hpp>
#include <bellows/collectives/local.hpp>
#include <bellows/compressors/identity.hpp>
#include <bellows/compressors/powersgd.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../support/random.hpp"
#include "powersgd_torch_reference.hpp"

namespace {

using bellows::collectives::local;
using bellows::collectives::local_group;
using matrix = std::vector<double>;  // row-major

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

/// A state's array (host memory on the CPU) as a vector, to keep and compare.
std::vector<float> values_of(const bellows::cpu::float_array& a) { return {a.span().begin(), a.span().end()}; }

/// Eigenvalues of a symmetric k x k matrix by cyclic Jacobi rotations, in double.
std::vector<double> jacobi_eigenvalues(matrix a, std::size_t k) {
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (std::size_t p = 0; p < k; ++p)
      for (std::size_t q = p + 1; q < k; ++q) off += a[p * k + q] * a[p * k + q];
    if (off < 1e-30) break;
    for (std::size_t p = 0; p < k; ++p)
      for (std::size_t q = p + 1; q < k; ++q) {
        if (std::abs(a[p * k + q]) < 1e-300) continue;
        const double theta = (a[q * k + q] - a[p * k + p]) / (2 * a[p * k + q]);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::abs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (std::size_t r = 0; r < k; ++r) {  // columns p, q
          const double x = a[r * k + p], y = a[r * k + q];
          a[r * k + p] = c * x - s * y;
          a[r * k + q] = s * x + c * y;
        }
        for (std::size_t r = 0; r < k; ++r) {  // rows p, q
          const double x = a[p * k + r], y = a[q * k + r];
          a[p * k + r] = c * x - s * y;
          a[q * k + r] = s * x + c * y;
        }
      }
  }
  std::vector<double> ev(k);
  for (std::size_t i = 0; i < k; ++i) ev[i] = a[i * k + i];
  std::sort(ev.begin(), ev.end());
  return ev;
}

/// The squared Frobenius error of the best rank-r approximation of an n x m matrix: the sum of
/// the m - r smallest eigenvalues of M^T M.
double best_error2(const std::vector<float>& M, std::size_t n, std::size_t m, std::size_t r) {
  matrix g(m * m, 0.0);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < m; ++j)
      for (std::size_t t = 0; t < n; ++t) g[i * m + j] += static_cast<double>(M[t * m + i]) * M[t * m + j];
  const auto ev = jacobi_eigenvalues(g, m);
  double s = 0;
  for (std::size_t i = 0; i + r < m; ++i) s += std::max(0.0, ev[i]);
  return s;
}

/// A x B^T with A n x k and B m x k standard normal, column k scaled by decay^k.
std::vector<float> low_rank(std::size_t n, std::size_t m, std::size_t k, double decay, std::uint64_t seed) {
  const auto a = bellows::testing::normal_floats(n * k, seed);
  const auto b = bellows::testing::normal_floats(m * k, seed + 1);
  std::vector<float> M(n * m);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) {
      double s = 0;
      for (std::size_t t = 0; t < k; ++t) s += std::pow(decay, static_cast<double>(t)) * a[i * k + t] * b[j * k + t];
      M[i * m + j] = static_cast<float>(s);
    }
  return M;
}

/// One PowerSGD step in double for W ranks' matrices from a given query q (m x r column-major),
/// as docs/spec.md#powersgd writes it; returns out (identical on every rank).
std::vector<double> reference_step(const std::vector<std::vector<float>>& Ms, std::size_t n, std::size_t m,
                                   std::vector<double> q, std::size_t r) {
  const auto orth = [](std::vector<double>& c, std::size_t rows, std::size_t rank) {
    for (std::size_t j = 0; j < rank; ++j) {
      double nn = 0;
      for (std::size_t i = 0; i < rows; ++i) nn += c[j * rows + i] * c[j * rows + i];
      nn = std::sqrt(nn);
      if (nn == 0) continue;
      for (std::size_t i = 0; i < rows; ++i) c[j * rows + i] /= nn;
      for (std::size_t l = j + 1; l < rank; ++l) {
        double d = 0;
        for (std::size_t i = 0; i < rows; ++i) d += c[j * rows + i] * c[l * rows + i];
        for (std::size_t i = 0; i < rows; ++i) c[l * rows + i] -= d * c[j * rows + i];
      }
    }
  };
  orth(q, m, r);
  std::vector<double> p(n * r, 0.0), q2(m * r, 0.0), out(n * m, 0.0);
  for (const auto& M : Ms)
    for (std::size_t k = 0; k < r; ++k)
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < m; ++j) p[k * n + i] += M[i * m + j] * q[k * m + j];
  orth(p, n, r);
  for (const auto& M : Ms)
    for (std::size_t k = 0; k < r; ++k)
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < m; ++j) q2[k * m + j] += M[i * m + j] * p[k * n + i];
  for (double& v : q2) v /= static_cast<double>(Ms.size());
  for (std::size_t k = 0; k < r; ++k)
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < m; ++j) out[i * m + j] += p[k * n + i] * q2[k * m + j];
  return out;
}

double frobenius2(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return s;
}

}  // namespace

TEST_CASE("powersgd: a matrix of rank <= r is reconstructed in one step, leaving no error") {
  bellows::cpu::executor exec(1);
  bellows::archetypes::collective solo;
  for (std::size_t r : {1u, 2u, 4u}) {
    for (std::size_t k = 1; k <= r; ++k) {
      CAPTURE(r);
      CAPTURE(k);
      bellows::powersgd<> c({.rank = r}, exec);
      auto st = c.make_state({5, "fc", bellows::shape{60, 45}});
      REQUIRE(st.compressed());
      const auto M = low_rank(60, 45, k, 0.7, 10 * r + k);
      auto x = M;
      REQUIRE(c.reduce(st, x, solo).status == bellows::step_status::ok);
      double norm2 = 0;
      for (float v : M) norm2 += static_cast<double>(v) * v;
      CHECK(frobenius2(x, M) <= 1e-10 * norm2);
      double e2 = 0;
      for (float v : st.memory.span()) e2 += static_cast<double>(v) * v;
      CHECK(e2 <= 1e-10 * norm2);
    }
  }
}

TEST_CASE("powersgd: with warm start, the error on a fixed matrix approaches the best rank-r error") {
  bellows::cpu::executor exec(1);
  bellows::archetypes::collective solo;
  const std::size_t n = 48, m = 32;
  const auto M = low_rank(n, m, m, 0.8, 3);  // full rank, singular values decaying
  for (std::size_t r : {1u, 2u, 4u}) {
    CAPTURE(r);
    bellows::powersgd<> c({.rank = r, .feedback = bellows::feedback::none}, exec);
    auto st = c.make_state({0, "w", bellows::shape{n, m}});
    const double best = best_error2(M, n, m, r);
    double first = 0, last = 0;
    for (int s = 0; s < 60; ++s) {
      auto x = M;
      REQUIRE(c.reduce(st, x, solo).status == bellows::step_status::ok);
      (s == 0 ? first : last) = frobenius2(x, M);
    }
    CHECK(first > 1.05 * best);  // one step from a random query is not yet there
    CHECK(last >= best * (1 - 1e-4));
    CHECK(last <= best * 1.01);
  }
}

TEST_CASE("powersgd: W ranks compute SPEC's step from the same initial query, and equal one rank on equal inputs") {
  const std::size_t n = 24, m = 20, r = 3;
  const bellows::shape shp{n, m};
  for (std::size_t w : {1u, 2u, 3u}) {
    CAPTURE(w);
    std::vector<std::vector<float>> Ms;
    for (std::size_t k = 0; k < w; ++k) Ms.push_back(bellows::testing::normal_floats(n * m, 50 + k));
    bellows::cpu::executor exec(1);
    const bellows::powersgd<> maker({.rank = r, .seed = 77}, exec);
    const auto q0 = values_of(maker.make_state({2, "conv", shp}).query);
    const auto want = reference_step(Ms, n, m, {q0.begin(), q0.end()}, r);
    std::vector<std::vector<float>> outs(w), same(w);
    local_group group(w);
    group.run([&](local& comm) {
      bellows::powersgd<> c({.rank = r, .seed = 77}, exec);
      auto st = c.make_state({2, "conv", shp});
      auto x = Ms[comm.rank()];
      (void)c.reduce(st, x, comm);
      outs[comm.rank()] = x;
      auto st2 = c.make_state({2, "conv", shp});
      auto y = Ms[0];  // every rank the same input
      (void)c.reduce(st2, y, comm);
      same[comm.rank()] = y;
    });
    group.run([&](local&) {});
    local_group solo_group(1);
    std::vector<float> single = Ms[0];
    solo_group.run([&](local& comm) {
      bellows::powersgd<> c({.rank = r, .seed = 77}, exec);
      auto st = c.make_state({2, "conv", shp});
      (void)c.reduce(st, single, comm);
    });
    for (std::size_t k = 0; k < w; ++k) {
      CHECK(same_bits(outs[k], outs[0]));
      for (std::size_t i = 0; i < n * m; ++i) {
        CHECK(std::abs(outs[k][i] - want[i]) <= 1e-4);
        CHECK(std::abs(same[k][i] - single[i]) <= 1e-4);
      }
    }
  }
}

TEST_CASE("powersgd: save and load mid-run continue bit for bit") {
  bellows::cpu::executor exec(1);
  bellows::archetypes::collective solo;
  const bellows::layer_info layer{1, "conv2", bellows::shape{16, 8, 3, 3}};
  for (bool warm : {true, false}) {
    CAPTURE(warm);
    bellows::powersgd<> c({.rank = 3, .warm_start = warm, .seed = 5}, exec);
    auto st = c.make_state(layer);
    for (int s = 0; s < 3; ++s) {
      auto x = bellows::testing::normal_floats(layer.size(), static_cast<std::uint64_t>(s));
      (void)c.reduce(st, x, solo);
    }
    bellows::checkpoint_writer w;
    c.save(st, w);
    std::vector<std::vector<float>> first;
    for (int s = 3; s < 6; ++s) {
      auto x = bellows::testing::normal_floats(layer.size(), static_cast<std::uint64_t>(s));
      (void)c.reduce(st, x, solo);
      first.push_back(x);
    }
    bellows::powersgd<> c2({.rank = 3, .warm_start = warm, .seed = 5}, exec);
    auto restored = c2.make_state(layer);
    bellows::checkpoint_reader rd(w.bytes());
    c2.load(restored, rd);
    rd.finish();
    CHECK(restored.step == 3);
    for (int s = 3; s < 6; ++s) {
      auto x = bellows::testing::normal_floats(layer.size(), static_cast<std::uint64_t>(s));
      (void)c2.reduce(restored, x, solo);
      CHECK(same_bits(x, first[static_cast<std::size_t>(s - 3)]));
    }
    CHECK(same_bits(restored.memory.span(), st.memory.span()));
    // A checkpoint of another layer shape, or cut short, is refused and changes nothing.
    auto other = c2.make_state({1, "fc", bellows::shape{16, 100}});
    bellows::checkpoint_reader rd2(w.bytes());
    CHECK_THROWS_AS(c2.load(other, rd2), bellows::wire_error);
    bellows::checkpoint_reader cut(w.bytes().first(w.bytes().size() - 4));
    const auto before = values_of(restored.query);
    CHECK_THROWS_AS(c2.load(restored, cut), bellows::wire_error);
    CHECK(values_of(restored.query) == before);
  }
}

TEST_CASE("powersgd: a record of an uncompressed layer loaded into a compressed state sizes its dense step") {
  // The state holds the compressed workspace (n r' + 1 floats); the record says rank 0, and the
  // compressor that then steps leaves the layer uncompressed, so the step needs n m + 1.
  bellows::cpu::executor exec(1);
  bellows::archetypes::collective solo;
  const bellows::layer_info layer{0, "fc", bellows::shape{64, 48}};
  bellows::powersgd<> low({.rank = 2}, exec), dense({.rank = 2, .min_compression_rate = 1000.0f}, exec);
  auto st = low.make_state(layer);
  auto flat = dense.make_state(layer);
  REQUIRE(st.compressed());
  REQUIRE_FALSE(flat.compressed());
  auto g = bellows::testing::normal_floats(layer.size(), 8);
  REQUIRE(dense.reduce(flat, g, solo).status == bellows::step_status::ok);
  bellows::checkpoint_writer w;
  dense.save(flat, w);
  bellows::checkpoint_reader rd(w.bytes());
  low.load(st, rd);
  CHECK_FALSE(st.compressed());
  CHECK(st.step == 1);
  CHECK(st.exchange.size() == layer.size() + 1);
  auto x = bellows::testing::normal_floats(layer.size(), 9);
  const auto want = x;  // one rank, no memory: the average is the gradient
  CHECK(dense.reduce(st, x, solo).status == bellows::step_status::ok);
  CHECK(same_bits(x, want));
}

TEST_CASE("powersgd: all-zero gradients give zeros, never NaN, and the query recovers afterwards") {
  bellows::cpu::executor exec(1);
  for (float eps : {0.0f, 1e-8f}) {
    local_group group(2);
    std::atomic<int> right{0};
    group.run([&](local& comm) {
      bellows::powersgd<> c({.rank = 2, .orthogonalization_eps = eps}, exec);
      auto st = c.make_state({0, "fc", bellows::shape{30, 20}});
      bool ok = true;
      for (int s = 0; s < 3; ++s) {
        std::vector<float> x(600, 0.0f);
        ok &= c.reduce(st, x, comm).status == bellows::step_status::ok;
        for (float v : x) ok &= v == 0.0f;
        for (float v : st.memory.span()) ok &= v == 0.0f;
        for (float v : st.query.span()) ok &= std::isfinite(v);
      }
      // A rank-1 gradient after the zeros is still found exactly.
      const auto M = low_rank(30, 20, 1, 1.0, 9);
      auto x = M;
      ok &= c.reduce(st, x, comm).status == bellows::step_status::ok;
      double norm2 = 0;
      for (float v : M) norm2 += static_cast<double>(v) * v;
      ok &= frobenius2(x, M) <= 1e-10 * norm2;
      if (ok) ++right;
    });
    CHECK(right == 2);
  }
}

TEST_CASE("powersgd: layers under the compression-rate rule and 1-D tensors are averaged uncompressed") {
  bellows::cpu::executor exec(1);
  const bellows::powersgd<> probe({.rank = 4}, exec);
  // (n + m) r' * 2 < n m decides: 8x8 at rank 4 is not worth it (128 >= 64), 64x64 is.
  CHECK(probe.effective_rank({0, "a", bellows::shape{8, 8}}, 4) == 0);
  CHECK(probe.effective_rank({0, "b", bellows::shape{64, 64}}, 4) == 4);
  CHECK(probe.effective_rank({0, "c", bellows::shape{1000}}, 1) == 0);
  CHECK(probe.effective_rank({0, "d", bellows::shape{}}, 1) == 0);
  const bellows::powersgd<> lenient({.rank = 8, .min_compression_rate = 0.5f}, exec);
  CHECK(lenient.effective_rank({0, "e", bellows::shape{3, 1000}}, 8) == 3);  // r' = min(r, n, m)
  for (const bellows::shape& shp : {bellows::shape{8, 8}, bellows::shape{1000}, bellows::shape{7, 1}}) {
    const std::size_t n = shp.size(), w = 3;
    std::vector<float> expected = bellows::testing::normal_floats(n, 0);
    for (std::size_t r = 1; r < w; ++r) {
      const auto x = bellows::testing::normal_floats(n, r);
      for (std::size_t i = 0; i < n; ++i) expected[i] += x[i];
    }
    for (float& v : expected) v /= static_cast<float>(w);
    local_group group(w);
    std::atomic<int> right{0};
    group.run([&](local& inner) {
      bellows::collectives::counting<local> comm(inner);
      bellows::powersgd<> c({.rank = 4}, exec);
      auto st = c.make_state({0, "bias", shp});
      auto x = bellows::testing::normal_floats(n, comm.rank());
      const auto res = c.reduce(st, x, comm);
      const bool ok =
          !st.compressed() && !c.compresses(st) && st.memory.span().empty() &&
          c.rounds(st, w) == bellows::exchange_rounds{{bellows::collective_op::allreduce_sum, 4 * (n + 1)}} &&
          x == expected && res.sent == bellows::traffic{4 * (n + 1), n + 1, n} && comm.allreduce().calls == 1;
      if (ok) ++right;
    });
    CHECK(right == static_cast<int>(w));
  }
}

TEST_CASE("powersgd: (n + m) r' floats and one vote in two allreduces") {
  bellows::cpu::executor exec(1);
  local_group group(2);
  std::atomic<int> right{0};
  group.run([&](local& inner) {
    bellows::collectives::counting<local> comm(inner);
    bellows::powersgd<> c({.rank = 4}, exec);
    auto st = c.make_state({0, "fc", bellows::shape{100, 30}});
    auto x = bellows::testing::normal_floats(3000, comm.rank());
    const auto res = c.reduce(st, x, comm);
    const std::uint64_t floats = (100 + 30) * 4 + 1;
    if (res.sent == bellows::traffic{4 * floats, floats, 130 * 4} && comm.allreduce().calls == 2 &&
        comm.allreduce().bytes_sent == 4 * floats &&
        c.rounds(st, 2) == bellows::exchange_rounds{{bellows::collective_op::allreduce_sum, 4 * (100 * 4 + 1)},
                                                    {bellows::collective_op::allreduce_sum, 4 * 30 * 4}})
      ++right;
  });
  CHECK(right == 2);
}

TEST_CASE("powersgd: a non-finite step changes neither e, Q nor the step counter") {
  bellows::cpu::executor exec(1);
  local_group group(2);
  std::atomic<int> right{0};
  group.run([&](local& comm) {
    bellows::powersgd<> c({.rank = 2}, exec);
    auto st = c.make_state({0, "fc", bellows::shape{40, 30}});
    auto x = bellows::testing::normal_floats(1200, comm.rank());
    (void)c.reduce(st, x, comm);
    const auto e = std::vector<float>(st.memory.span().begin(), st.memory.span().end());
    const auto q = values_of(st.query);
    auto bad = bellows::testing::normal_floats(1200, 9 + comm.rank());
    if (comm.rank() == 0) bad[1199] = std::numeric_limits<float>::infinity();
    const auto input = bad;
    const auto res = c.reduce(st, bad, comm);
    if (res.status == bellows::step_status::non_finite && st.step == 1 && same_bits(bad, input) &&
        same_bits(st.memory.span(), e) && same_bits(st.query.span(), q))
      ++right;
  });
  CHECK(right == 2);
}

TEST_CASE("powersgd: a rank change keeps the shared columns of Q and draws the others as a first draw would") {
  bellows::cpu::executor exec(1);
  bellows::archetypes::collective solo;
  const bellows::layer_info layer{4, "conv", bellows::shape{64, 32, 3, 3}};
  const bellows::powersgd<> r4({.rank = 4, .seed = 3}, exec), r2({.rank = 2, .seed = 3}, exec);
  const auto fresh4 = values_of(r4.make_state(layer).query);
  auto st = r2.make_state(layer);
  const std::size_t m = layer.shape.cols();
  CHECK(std::equal(st.query.span().begin(), st.query.span().end(), fresh4.begin()));  // drawn alike
  auto x = bellows::testing::normal_floats(layer.size(), 1);
  bellows::powersgd<> low({.rank = 4, .seed = 3}, exec), high({.rank = 2, .seed = 3}, exec);
  (void)high.reduce(st, x, solo);
  const auto evolved = values_of(st.query);
  const auto e = std::vector<float>(st.memory.span().begin(), st.memory.span().end());
  low.set_rank(st, 4);
  CHECK(st.rank == 4);
  CHECK(std::equal(evolved.begin(), evolved.end(), st.query.span().begin()));
  CHECK(std::equal(st.query.span().begin() + static_cast<std::ptrdiff_t>(2 * m), st.query.span().end(),
                   fresh4.begin() + static_cast<std::ptrdiff_t>(2 * m)));
  CHECK(same_bits(st.memory.span(), e));
  // Running a state through an instance of another rank switches it the same way (Accordion).
  auto st2 = r2.make_state(layer);
  auto y = bellows::testing::normal_floats(layer.size(), 1);
  (void)high.reduce(st2, y, solo);
  auto z = bellows::testing::normal_floats(layer.size(), 2);
  auto z2 = z;
  (void)low.reduce(st, z, solo);
  (void)low.reduce(st2, z2, solo);
  CHECK(st2.rank == 4);
  CHECK(same_bits(z, z2));
  high.set_rank(st, 1);
  CHECK(st.query.size() == m);
  CHECK(high.compresses(st));
}

TEST_CASE("powersgd: bad configuration raises bellows::error naming the value") {
  CHECK_THROWS_WITH_AS(bellows::powersgd<>({.rank = 0}), doctest::Contains("rank must be >= 1, got 0"), bellows::error);
  CHECK_THROWS_WITH_AS(bellows::powersgd<>({.min_compression_rate = -1.0f}), doctest::Contains("got -1"),
                       bellows::error);
  CHECK_THROWS_WITH_AS(bellows::powersgd<>({.orthogonalization_eps = std::numeric_limits<float>::quiet_NaN()}),
                       doctest::Contains("got nan"), bellows::error);
  CHECK_THROWS_WITH_AS(bellows::powersgd<>({.feedback = static_cast<bellows::feedback>(9)}),
                       "powersgd: feedback must be none, residual or scaled, got the value 9", bellows::error);
  bellows::powersgd<> c({.rank = 2});
  auto st = c.make_state({0, "fc.weight", bellows::shape{50, 40}});
  CHECK_THROWS_WITH_AS(c.set_rank(st, 0), doctest::Contains("fc.weight"), bellows::error);
}

TEST_CASE("powersgd: two steps agree with PyTorch's hook arithmetic from the same query") {
  // powersgd_torch_reference.hpp holds g, the initial Q and torch's out and e after each of two
  // steps (error feedback, warm start, one rank), made by powersgd_torch_reference.py. torch
  // orthogonalises by QR above rank 2: its columns may differ in sign, P Q^T does not.
  namespace ref = powersgd_torch_reference;
  const std::size_t n = ref::rows, m = ref::cols;
  struct torch_case {
    std::size_t rank;
    const float *q0, *out1, *e1, *out2, *e2;
  };
  const torch_case cases[] = {{1, ref::q0_rank1, ref::out1_rank1, ref::e1_rank1, ref::out2_rank1, ref::e2_rank1},
                              {3, ref::q0_rank3, ref::out1_rank3, ref::e1_rank3, ref::out2_rank3, ref::e2_rank3}};
  bellows::cpu::executor exec(1);
  bellows::archetypes::collective solo;
  for (const torch_case& t : cases) {
    CAPTURE(t.rank);
    bellows::powersgd<> c({.rank = t.rank}, exec);
    auto st = c.make_state({0, "fc", bellows::shape{n, m}});
    REQUIRE(st.query.size() == m * t.rank);
    std::copy_n(t.q0, m * t.rank, st.query.span().begin());
    const float* g[] = {ref::g1, ref::g2};
    const float* out[] = {t.out1, t.out2};
    const float* e[] = {t.e1, t.e2};
    for (std::size_t s = 0; s < 2; ++s) {
      CAPTURE(s);
      std::vector<float> x(g[s], g[s] + n * m);
      REQUIRE(c.reduce(st, x, solo).status == bellows::step_status::ok);
      for (std::size_t i = 0; i < n * m; ++i) {
        CHECK(std::abs(x[i] - out[s][i]) <= 2e-5);
        CHECK(std::abs(st.memory.span()[i] - e[s][i]) <= 2e-5);
      }
    }
  }
}

TEST_CASE("powersgd: a rank larger than the matrix is r' = min(r, n, m); at full rank the average is exact") {
  bellows::cpu::executor exec(1);
  const bellows::shape shp{6, 9};
  const std::size_t n = shp.size(), w = 2;
  for (std::size_t rank :
       {std::size_t{6}, std::size_t{7}, std::size_t{1000}, std::numeric_limits<std::size_t>::max()}) {
    CAPTURE(rank);
    // By the default rule a full-rank factorisation never pays ((n + m) min(n, m) >= n m): the
    // layer is averaged uncompressed. A lenient rule compresses it at r' = 6 = min(n, m).
    const bellows::powersgd<> strict({.rank = rank}, exec);
    auto plain = strict.make_state({0, "w", shp});
    CHECK_FALSE(plain.compressed());
    const bellows::powersgd<> lenient({.rank = rank, .min_compression_rate = 0.5f}, exec);
    auto st = lenient.make_state({0, "w", shp});
    CHECK(st.rank == 6);
    CHECK(st.query.size() == 9 * 6);
    lenient.set_rank(st, rank);
    CHECK(st.rank == 6);
  }
  // Full rank reconstructs the mean of M exactly up to rounding.
  std::vector<float> expected(n, 0.0f);
  for (std::size_t r = 0; r < w; ++r) {
    const auto x = bellows::testing::normal_floats(n, 40 + r);
    for (std::size_t i = 0; i < n; ++i) expected[i] += x[i] / static_cast<float>(w);
  }
  local_group group(w);
  std::atomic<int> right{0};
  group.run([&](local& comm) {
    bellows::powersgd<> c({.rank = 100, .min_compression_rate = 0.5f}, exec);
    auto st = c.make_state({0, "w", shp});
    auto x = bellows::testing::normal_floats(n, 40 + comm.rank());
    bool ok = c.reduce(st, x, comm).status == bellows::step_status::ok && st.compressed() && st.rank == 6;
    // P (6 x 6, orthonormal) spans every column: P P^T (the mean of M) is the mean itself.
    for (std::size_t i = 0; i < n; ++i) ok = ok && std::abs(x[i] - expected[i]) < 1e-4f;
    if (ok) ++right;
  });
  CHECK(right == static_cast<int>(w));
  // A checkpoint that claims a rank beyond min(n, m) is refused, and the state keeps its rank.
  const bellows::powersgd<> c({.rank = 3, .min_compression_rate = 0.5f}, exec);
  auto st = c.make_state({0, "w", shp});
  bellows::checkpoint_writer bad;
  bad.put<std::uint64_t>(7);  // rank
  bad.put<std::uint64_t>(1);  // step
  bad.put<std::uint8_t>(0);   // no memory
  bad.put_array(std::span<const float>());
  bad.put<std::uint64_t>(7);  // query columns
  const std::vector<float> query(7 * 9, 1.0f);
  bad.put_array(std::span<const float>(query));
  bellows::checkpoint_reader in(bad.bytes());
  CHECK_THROWS_WITH_AS(c.load(st, in), doctest::Contains("checkpoint rank 7 (at most 6)"), bellows::wire_error);
  CHECK(st.rank == 3);
  CHECK(st.step == 0);
}

TEST_CASE("powersgd: a summed Q that overflows (finite M near the largest float) skips the step on every rank") {
  // Found by fuzz_checkpoint_stateful (a restored memory of 3e38): the step reported ok and
  // wrote Inf into the output and the memory. Here each rank's M has a column of 1e38: P is
  // finite (every row about 1e38 Q_00, normalised to 1/sqrt(10)), each rank's Q about 3.2e38,
  // and their sum overflows.
  constexpr std::size_t w = 2, rows = 10, cols = 24;
  local_group group(w);
  std::atomic<int> right{0};
  group.run([&](local& comm) {
    bellows::cpu::executor exec(1);
    bellows::powersgd<> c({.rank = 1}, exec);
    auto st = c.make_state({0, "fc", bellows::shape{rows, cols}});
    std::vector<float> x(rows * cols, 1.0f);
    for (std::size_t i = 0; i < rows; ++i) x[i * cols] = 1e38f;
    const auto input = x;
    const auto query = values_of(st.query);
    bool ok = st.compressed() && c.reduce(st, x, comm).status == bellows::step_status::non_finite;
    ok = ok && x == input && values_of(st.query) == query && st.step == 0;
    for (float e : st.memory.span()) ok = ok && e == 0.0f;
    auto fine = bellows::testing::normal_floats(rows * cols, comm.rank());
    ok = ok && c.reduce(st, fine, comm).status == bellows::step_status::ok && st.step == 1;
    if (ok) ++right;
  });
  CHECK(right == static_cast<int>(w));
}

TEST_CASE("powersgd: rescale multiplies a scaled memory by lr_old / lr_new and leaves a residual one") {
  for (const bellows::feedback kind : {bellows::feedback::scaled, bellows::feedback::residual}) {
    CAPTURE(bellows::to_string(kind));
    bellows::cpu::executor exec(1);
    bellows::powersgd<> c({.rank = 2, .feedback = kind}, exec);
    auto st = c.make_state({0, "fc", bellows::shape{24, 40}});
    auto g = bellows::testing::normal_floats(24 * 40, 11);
    bellows::archetypes::collective solo;
    REQUIRE(c.reduce(st, g, solo).status == bellows::step_status::ok);
    const auto before = values_of(st.memory);
    REQUIRE(!std::ranges::all_of(before, [](float e) { return e == 0.0f; }));
    std::vector<float> want = before;
    const float lr_old = 0.1f, lr_new = 0.03f;
    if (kind == bellows::feedback::scaled)
      for (float& e : want) e *= lr_old / lr_new;
    c.rescale(st, lr_old, lr_new);
    CHECK(same_bits(st.memory.span(), want));
    c.rescale(st, lr_new, lr_new);  // no change of rate
    CHECK(same_bits(st.memory.span(), want));
    CHECK_THROWS_WITH_AS(c.rescale(st, 0.0f, lr_new), doctest::Contains("must be > 0"), bellows::error);
    CHECK(same_bits(st.memory.span(), want));
  }
}

TEST_CASE("powersgd and identity on the CPU step through a collective that also has a stream") {
  // A DeviceCollective (NCCL stages host memory) is a Collective too: the CPU compressors written
  // once over the executor take it, and skip the device's check that both use one stream.
  bellows::cpu::executor exec(1);
  bellows::archetypes::device_collective solo;
  bellows::powersgd<> c({.rank = 2}, exec);
  auto st = c.make_state({0, "fc", bellows::shape{24, 40}});
  auto g = bellows::testing::normal_floats(24 * 40, 5);
  CHECK(c.reduce(st, g, solo).status == bellows::step_status::ok);
  bellows::identity<> id(exec);
  auto id_st = id.make_state({1, "bias", bellows::shape{40}});
  auto b = bellows::testing::normal_floats(40, 6);
  const auto want = b;
  CHECK(id.reduce(id_st, b, solo).status == bellows::step_status::ok);
  CHECK(b == want);  // one rank: the average is the input
}
