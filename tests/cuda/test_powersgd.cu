// SPDX-License-Identifier: Apache-2.0
// powersgd<cuda::executor> over the NCCL collective, one rank per device, against
// powersgd<cpu::executor> over the local collective with the same ranks and inputs: statuses,
// traffic, step counters and layers averaged dense bit for bit, NaN and overflowing steps
// included; compressed layers within a bound on the products' rounding (below); rank changes;
// what it refuses; checkpoints that cross backends.
//
// Tolerance of compressed layers. Both backends run the same algorithm; only the order of the
// sums in P = M Q and Q = M^T P (and in the allreduces) differs. An entry of either product is
// within gamma(k) sum |terms| of the exact one, gamma(k) = k u / (1 - k u), u = 2^-24, k the
// length of the sum (tests/cuda/test_skinny_gemm.cu); with orthonormal factors, sum |terms| <=
// ||M||_F, so the two backends' P and Q differ by at most 2 gamma(max(n, m)) ||M||_F per entry.
// The orthogonalisation of P divides by its column norms: to first order it multiplies that
// difference by the condition number of P. Here P = M Q with M Gaussian (plus a memory of the
// same scale) and n >= 6 r' or Q square: its condition number is about (sqrt(n) + sqrt(r')) /
// (sqrt(n) - sqrt(r')) <= 2.5 (Marchenko-Pastur); the bound takes 10. The output P Q^T and
// e = M - P Q^T carry the same absolute error, and each later step adds its own while
// inheriting the earlier ones through e and the warm query. So after s steps an output, memory
// or query entry of the device is within
//   s * 10 * 4 gamma(max(n, m)) * max ||M||_F
// of the CPU's in the Frobenius norm of the difference, ||M||_F taken over the ranks' and the
// sum's matrices of every step (rebuilt in double from the CPU's outputs). It is a worst-case
// bound: the differences seen are at most some 10^-3 of it. A wrong step (no division by W, an old
// query, a skipped vote) is wrong by a good fraction of ||M||_F, a hundred times the bound or more.
#include <bellows/collectives/local.hpp>
#include <bellows/collectives/nccl.cuh>
#include <bellows/compressors/powersgd.hpp>
#include <bellows/compressors/powersgd.cuh>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "../support/random.hpp"
#include "compressor_ranks.cuh"
#include "device_test.cuh"
#include "nccl_ranks.cuh"

namespace powersgd_test {

using bellows::step_status;
using bellows::test::rank_trace;

struct config {
  const char* what;
  bellows::shape shape;
  bellows::powersgd_params params;
  bool nan_step = false;  ///< the last rank's input at step 1 holds a NaN
  float column = 0.0f;    ///< when not 0, the input is this in column 0 of every row, 0 elsewhere
};

inline constexpr std::size_t steps = 4;

std::size_t ranks() { return static_cast<std::size_t>(bellows::cuda::device_count()); }

std::vector<float> gradient(const config& c, std::size_t step, std::size_t rank) {
  std::vector<float> g = bellows::testing::normal_floats(c.shape.size(), 100 * step + rank + 3);
  if (c.column != 0.0f)
    for (std::size_t x = 0; x < g.size(); ++x) g[x] = x % c.shape.cols() == 0 ? c.column : 0.0f;
  if (c.nan_step && step == 1 && rank + 1 == ranks()) g[g.size() / 2] = std::numeric_limits<float>::quiet_NaN();
  return g;
}

bellows::layer_info layer_of(const config& c) { return {4, "fc", c.shape}; }

/// What a run left besides the trace: the final query and r'.
struct run_result {
  std::vector<rank_trace> traces;
  std::vector<std::vector<float>> query;
  std::vector<std::size_t> rank;
};

/// The compressor of step s: the configuration's, or one of rank_at[s] (as Accordion switches
/// a layer between two instances).
bellows::powersgd_params params_at(const config& c, const std::vector<std::size_t>& rank_at, std::size_t s) {
  bellows::powersgd_params p = c.params;
  if (!rank_at.empty()) p.rank = rank_at[s];
  return p;
}

/// `count` steps of powersgd<cpu::executor> on `ranks()` threads over the local collective;
/// before(step, compressor, state) runs before each step.
template <class Before>
run_result run_on_cpu(const config& c, std::size_t count, Before before, const std::vector<std::size_t>& rank_at = {}) {
  run_result out{std::vector<rank_trace>(ranks()), std::vector<std::vector<float>>(ranks()),
                 std::vector<std::size_t>(ranks())};
  bellows::collectives::local_group group(ranks());
  group.run([&](bellows::collectives::local& comm) {
    bellows::cpu::executor exec(1);
    bellows::powersgd<bellows::cpu::executor> ps(c.params, exec);
    auto st = ps.make_state(layer_of(c));
    rank_trace& t = out.traces[comm.rank()];
    for (std::size_t s = 0; s < count; ++s) {
      before(s, ps, st);
      std::vector<float> g = gradient(c, s, comm.rank());
      bellows::powersgd<bellows::cpu::executor> at(params_at(c, rank_at, s), exec);
      const bellows::reduce_result r = at.reduce(st, g, comm);
      t.status.push_back(r.status);
      t.sent.push_back(r.sent);
      t.out.push_back(g);
    }
    t.memory = bellows::test::memory_of(st.memory);
    t.step = st.step;
    out.query[comm.rank()] = bellows::test::memory_of(st.query);
    out.rank[comm.rank()] = st.rank;
  });
  return out;
}

/// The same with powersgd<cuda::executor> on every device over NCCL.
template <class Before>
run_result run_on_device(const config& c, std::size_t count, Before before,
                         const std::vector<std::size_t>& rank_at = {}) {
  run_result out{std::vector<rank_trace>(ranks()), std::vector<std::vector<float>>(ranks()),
                 std::vector<std::size_t>(ranks())};
  bellows::test::on_every_device([&](std::size_t rank, bellows::collectives::nccl& coll) {
    bellows::cuda::executor exec(coll.stream());
    bellows::powersgd<bellows::cuda::executor> ps(c.params, exec);
    auto st = ps.make_state(layer_of(c));
    rank_trace& t = out.traces[rank];
    for (std::size_t s = 0; s < count; ++s) {
      before(s, ps, st);
      bellows::test::device_array<float> g(gradient(c, s, rank));
      bellows::powersgd<bellows::cuda::executor> at(params_at(c, rank_at, s), exec);
      const bellows::reduce_result r = at.reduce(st, g.span(), coll);
      t.status.push_back(r.status);
      t.sent.push_back(r.sent);
      t.out.push_back(g.host());
    }
    t.memory = bellows::test::memory_of(st.memory);
    t.step = st.step;
    out.query[rank] = bellows::test::memory_of(st.query);
    out.rank[rank] = st.rank;
  });
  return out;
}

const auto no_change = [](std::size_t, auto&, auto&) {};

double gamma(std::size_t k) {
  const double ku = static_cast<double>(k) * 0x1p-24;
  return ku / (1.0 - ku);
}

/// ||x||_F over the finite elements.
double norm_of(const std::vector<double>& x) {
  double sq = 0;
  for (double v : x) sq += std::isfinite(v) ? v * v : 0.0;
  return std::sqrt(sq);
}

/// The bound of the file's comment for the steps of `cpu`, whose memory e is rebuilt from its
/// outputs (e = M - out after a compressed step that ran, zero after a dense one or without a
/// memory), starting from `e0` (empty: zero).
double tolerance(const config& c, const run_result& cpu, const std::vector<float>& e0 = {}) {
  const std::size_t size = c.shape.size(), count = cpu.traces[0].out.size();
  std::vector<std::vector<double>> e(ranks(), e0.empty() ? std::vector<double>(size, 0.0)
                                                         : std::vector<double>(e0.begin(), e0.end()));
  double norm = 0;
  for (std::size_t s = 0; s < count; ++s) {
    std::vector<double> sum(size, 0.0);
    for (std::size_t r = 0; r < ranks(); ++r) {
      const std::vector<float> g = gradient(c, s, r);
      std::vector<double> m(size);
      for (std::size_t x = 0; x < size; ++x) m[x] = static_cast<double>(g[x]) + e[r][x];
      norm = std::max(norm, norm_of(m));
      for (std::size_t x = 0; x < size; ++x) sum[x] += m[x];
      if (cpu.traces[r].status[s] != step_status::ok) continue;
      const bool dense = cpu.traces[r].sent[s].kept == size;
      for (std::size_t x = 0; x < size; ++x)
        e[r][x] = dense || c.params.feedback == bellows::feedback::none ? 0.0 : m[x] - cpu.traces[r].out[s][x];
    }
    norm = std::max(norm, norm_of(sum));
  }
  const std::size_t k = std::max(c.shape.rows(), c.shape.cols());
  return static_cast<double>(count) * 10.0 * 4.0 * gamma(k) * norm;
}

/// ||a - b||_F (infinite for different sizes or a NaN on one side only).
double distance(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double sq = 0;
  for (std::size_t x = 0; x < a.size(); ++x) {
    if (std::isnan(a[x]) != std::isnan(b[x])) return std::numeric_limits<double>::infinity();
    if (!std::isnan(a[x])) sq += (static_cast<double>(a[x]) - b[x]) * (static_cast<double>(a[x]) - b[x]);
  }
  return std::sqrt(sq);
}

/// Statuses, traffic, steps and r' exact; outputs, memories and queries within `tol` in the
/// Frobenius norm of their difference (0: bit for bit).
void check_close(const run_result& got, const run_result& want, double tol) {
  REQUIRE(got.traces.size() == want.traces.size());
  for (std::size_t r = 0; r < got.traces.size(); ++r) {
    CAPTURE(r);
    const rank_trace &g = got.traces[r], &w = want.traces[r];
    CHECK(g.status == w.status);
    CHECK(g.sent == w.sent);
    CHECK(g.step == w.step);
    CHECK(got.rank[r] == want.rank[r]);
    REQUIRE(g.out.size() == w.out.size());
    for (std::size_t s = 0; s < g.out.size(); ++s) {
      CAPTURE(s);
      if (tol == 0)
        CHECK(bellows::test::same_bytes(g.out[s], w.out[s]));
      else
        CHECK(distance(g.out[s], w.out[s]) <= tol);
    }
    if (tol == 0) {
      CHECK(bellows::test::same_bytes(g.memory, w.memory));
      CHECK(bellows::test::same_bytes(got.query[r], want.query[r]));
    } else {
      CHECK(distance(g.memory, w.memory) <= tol);
      CHECK(distance(got.query[r], want.query[r]) <= tol);
    }
  }
}

/// The output of each step that ran is identical across ranks.
void check_ranks_agree(const run_result& got) {
  for (std::size_t r = 1; r < got.traces.size(); ++r)
    for (std::size_t s = 0; s < got.traces[r].out.size(); ++s)
      if (got.traces[0].status[s] == step_status::ok)
        CHECK(bellows::test::same_bytes(got.traces[r].out[s], got.traces[0].out[s]));
}

}  // namespace powersgd_test

using namespace powersgd_test;

TEST_CASE("cuda powersgd: statuses, traffic, steps exact; dense layers bit for bit; the rest within the bound" *
          doctest::skip(bellows::test::no_device())) {
  using bellows::feedback;
  using bellows::shape;
  const std::vector<config> configs = {
      {"64x48 rank 1", shape{64, 48}, {.rank = 1, .seed = 1}},
      {"64x48 rank 2, a new query each step, no memory, eps",
       shape{64, 48},
       {.rank = 2, .warm_start = false, .orthogonalization_eps = 1e-3f, .feedback = feedback::none, .seed = 2}},
      {"257x33 rank 4 (three row tiles), NaN step", shape{257, 33}, {.rank = 4, .seed = 3}, true},
      {"257x33 rank 2, a new query each step", shape{257, 33}, {.rank = 2, .warm_start = false, .seed = 9}, true},
      {"6x4x5 rank 2", shape{6, 4, 5}, {.rank = 2, .seed = 4}},
      {"30x4 rank 8: r' = 4 = m", shape{30, 4}, {.rank = 8, .min_compression_rate = 0.5f, .seed = 5}, true},
      {"30x4 rank 8: dense", shape{30, 4}, {.rank = 8, .seed = 6}, true},
      {"1x100: dense", shape{1, 100}, {.rank = 1, .seed = 7}, true},
      {"100: dense, 1-D", shape{100}, {.rank = 2, .feedback = feedback::none}, true},
  };
  for (const config& c : configs) {
    CAPTURE(std::string(c.what));
    const run_result want = run_on_cpu(c, steps, no_change);
    const run_result got = run_on_device(c, steps, no_change);
    const bool dense = want.rank[0] == 0;
    const double tol = dense ? 0.0 : tolerance(c, want);
    CAPTURE(tol);
    check_close(got, want, tol);
    check_ranks_agree(got);
    if (c.nan_step) {
      for (std::size_t r = 0; r < ranks(); ++r) {
        CHECK(got.traces[r].status[1] == step_status::non_finite);
        CHECK(bellows::test::same_bytes(got.traces[r].out[1], gradient(c, 1, r)));  // left as it was
        CHECK(got.traces[r].step == steps - 1);
      }
    }
    // the traffic of a step, as docs/spec.md#powersgd counts it
    const std::size_t n = c.shape.rank() < 2 ? c.shape.size() : c.shape.rows();
    const std::size_t m = c.shape.rank() < 2 ? 1 : c.shape.cols(), r = want.rank[0];
    const std::uint64_t kept = dense ? c.shape.size() : (n + m) * r;
    CHECK(want.traces[0].sent[0].kept == kept);
  }
}

TEST_CASE("cuda powersgd: a step whose finite input overflows the summed factors is skipped on every rank" *
          doctest::skip(bellows::test::no_device())) {
  // M is c = 3e37 in column 0 of every row: P = M Q is c q_0 per row (|q_0| < 1, finite), and so
  // is its sum over three ranks and its norm; P normalised is 1 / 8 per row, so Q = M^T P is 8 c
  // in row 0 per rank and the summed Q, 24 c, overflows: the second check skips the step.
  const config c{"overflow", bellows::shape{64, 48}, {.rank = 1, .seed = 8}, false, 3e37f};
  const run_result want = run_on_cpu(c, 2, no_change);
  const run_result got = run_on_device(c, 2, no_change);
  for (std::size_t r = 0; r < ranks(); ++r) {
    CHECK(want.traces[r].status == std::vector<step_status>{step_status::non_finite, step_status::non_finite});
    CHECK(got.traces[r].status == want.traces[r].status);
    CHECK(got.traces[r].sent == want.traces[r].sent);
    CHECK(bellows::test::same_bytes(got.traces[r].out[0], gradient(c, 0, r)));
    CHECK(got.traces[r].step == 0);
    CHECK(bellows::test::same_bytes(got.traces[r].memory, std::vector<float>(c.shape.size(), 0.0f)));
    CHECK(bellows::test::same_draw(got.query[r], want.query[r]));  // the first draw, untouched
  }
}

TEST_CASE("cuda powersgd: rank changes keep the memory and the shared columns of Q, as on the CPU" *
          doctest::skip(bellows::test::no_device())) {
  // 64 x 48 at rank 2 -> rank 30 (left uncompressed: the memory goes out with g, then is zero)
  // -> rank 1 (the first column kept) -> rank 4 (three columns drawn) -> rank 2, each step's
  // compressor another instance, as Accordion switches a layer.
  const config c{"rank changes", bellows::shape{64, 48}, {.rank = 2, .seed = 10}};
  const std::vector<std::size_t> rank_at = {2, 2, 30, 1, 1, 4, 4, 2};
  const run_result want = run_on_cpu(c, rank_at.size(), no_change, rank_at);
  const run_result got = run_on_device(c, rank_at.size(), no_change, rank_at);
  for (std::size_t s = 0; s < rank_at.size(); ++s) {
    CAPTURE(s);
    const std::size_t r = rank_at[s] == 30 ? 0 : rank_at[s];
    CHECK(want.traces[0].sent[s].kept == (r == 0 ? c.shape.size() : (64 + 48) * r));
  }
  check_close(got, want, tolerance(c, want));
  check_ranks_agree(got);

  // Right after the dense step the memory is zero on both, bit for bit, and Q is kept for later.
  const std::vector<std::size_t> until_dense = {2, 2, 30};
  const run_result dense_cpu = run_on_cpu(c, 3, no_change, until_dense);
  const run_result dense_dev = run_on_device(c, 3, no_change, until_dense);
  for (std::size_t r = 0; r < ranks(); ++r) {
    CHECK(bellows::test::same_bytes(dense_dev.traces[r].memory, std::vector<float>(c.shape.size(), 0.0f)));
    CHECK(bellows::test::same_bytes(dense_cpu.traces[r].memory, dense_dev.traces[r].memory));
    CHECK(dense_dev.rank[r] == 0);
    CHECK(dense_dev.query[r].size() == 2 * 48);
  }

  // set_rank on a state: the first columns kept bit for bit, new ones the first draw's.
  bellows::cuda::executor dev;
  bellows::cpu::executor host(1);
  bellows::powersgd<bellows::cuda::executor> ps({.rank = 2, .seed = 10}, dev);
  bellows::powersgd<> on_host({.rank = 2, .seed = 10}, host);
  auto st = ps.make_state(layer_of(c));
  auto host_st = on_host.make_state(layer_of(c));
  const std::vector<float> first = bellows::test::memory_of(st.query);
  CHECK(bellows::test::same_draw(first, bellows::test::memory_of(host_st.query)));
  ps.set_rank(st, 1);
  on_host.set_rank(host_st, 1);
  CHECK(bellows::test::same_bytes(bellows::test::memory_of(st.query),
                                  std::vector<float>(first.begin(), first.begin() + 48)));
  ps.set_rank(st, 4);
  on_host.set_rank(host_st, 4);
  const std::vector<float> four = bellows::test::memory_of(st.query);
  CHECK(st.rank == 4);
  CHECK(bellows::test::same_draw(four, bellows::test::memory_of(host_st.query)));
  CHECK(bellows::test::same_bytes(std::vector<float>(four.begin(), four.begin() + 48),
                                  std::vector<float>(first.begin(), first.begin() + 48)));
  ps.set_rank(st, 30);
  CHECK(st.rank == 0);
  CHECK(bellows::test::memory_of(st.query).size() == 4 * 48);
  CHECK(bellows::test::memory_of(st.memory).size() == c.shape.size());
}

TEST_CASE("cuda powersgd: wrong parameters, streams and sizes are refused before anything runs" *
          doctest::skip(bellows::test::no_device())) {
  using device_powersgd = bellows::powersgd<bellows::cuda::executor>;
  CHECK_THROWS_WITH_AS(device_powersgd({.rank = 0}), doctest::Contains("rank must be >= 1"), bellows::error);
  CHECK_THROWS_WITH_AS(device_powersgd({.min_compression_rate = 0.0f}), doctest::Contains("min_compression_rate"),
                       bellows::error);
  CHECK_THROWS_WITH_AS(device_powersgd({.orthogonalization_eps = -1.0f}), doctest::Contains("orthogonalization_eps"),
                       bellows::error);
  const config c{"refusals", bellows::shape{40, 30}, {.rank = 2}};
  std::atomic<std::size_t> right{0};
  bellows::test::on_every_device([&](std::size_t rank, bellows::collectives::nccl& coll) {
    cudaStream_t other = nullptr;
    BELLOWS_CUDA_CHECK(cudaStreamCreate(&other));
    bool ok = true;
    {
      bellows::cuda::executor elsewhere(other), exec(coll.stream());
      device_powersgd away(c.params, elsewhere), here(c.params, exec);
      auto st = here.make_state(layer_of(c));
      bellows::test::device_array<float> g(gradient(c, 0, rank)), short_g(1199);
      const auto refused = [&](auto&& call, const char* says) {
        try {
          call();
          return false;
        } catch (const bellows::error& err) {
          return std::string(err.what()).find(says) != std::string::npos;
        }
      };
      ok &= refused([&] { (void)away.reduce(st, g.span(), coll); }, "different streams");
      ok &= refused([&] { (void)here.reduce(st, short_g.span(), coll); }, "the buffer 1199");
      ok &= refused([&] { here.set_rank(st, 0); }, "rank must be >= 1");
      ok &= st.step == 0 && st.rank == 2 && here.reduce(st, g.span(), coll).status == step_status::ok && st.step == 1;
    }
    BELLOWS_CUDA_CHECK(cudaStreamDestroy(other));
    if (ok) ++right;
  });
  CHECK(right == ranks());
}

TEST_CASE("cuda powersgd: checkpoints cross backends; a bad one changes nothing" *
          doctest::skip(bellows::test::no_device())) {
  const config c{"checkpoint", bellows::shape{20, 12}, {.rank = 3, .seed = 12}};
  // A CPU record after two steps of one rank, with column 1 of Q zeroed: warm start draws it again.
  std::vector<std::byte> record;
  {
    bellows::collectives::local_group one(1);
    one.run([&](bellows::collectives::local& comm) {
      bellows::cpu::executor exec(1);
      bellows::powersgd<> ps(c.params, exec);
      auto st = ps.make_state(layer_of(c));
      for (std::size_t s = 0; s < 2; ++s) {
        std::vector<float> g = gradient(c, s, 5);
        (void)ps.reduce(st, g, comm);
      }
      std::fill_n(st.query.span().begin() + 12, 12, 0.0f);
      bellows::checkpoint_writer out;
      ps.save(st, out);
      record.assign(out.bytes().begin(), out.bytes().end());
    });
  }
  const auto load_first = [&](std::size_t s, auto& ps, auto& st) {
    if (s != 0) return;
    bellows::checkpoint_reader in(record);
    ps.load(st, in);
  };
  const run_result want = run_on_cpu(c, 2, load_first), got = run_on_device(c, 2, load_first);
  bellows::cpu::executor reader_exec(1);
  bellows::powersgd<> reader(c.params, reader_exec);
  auto loaded = reader.make_state(layer_of(c));
  bellows::checkpoint_reader record_in(record);
  reader.load(loaded, record_in);
  check_close(got, want, tolerance(c, want, bellows::test::memory_of(loaded.memory)));
  CHECK(got.traces[0].step == 4);

  std::atomic<std::size_t> right{0};
  bellows::test::on_every_device([&](std::size_t, bellows::collectives::nccl& coll) {
    bellows::cuda::executor exec(coll.stream());
    bellows::powersgd<bellows::cuda::executor> ps(c.params, exec);
    bellows::cpu::executor host(1);
    bellows::powersgd<> on_host(c.params, host);
    auto st = ps.make_state(layer_of(c));
    bellows::checkpoint_reader in(record);
    ps.load(st, in);
    // device -> CPU: the same record, byte for byte, and the same state
    bellows::checkpoint_writer saved;
    ps.save(st, saved);
    bool ok = std::ranges::equal(saved.bytes(), std::span<const std::byte>(record));
    auto host_st = on_host.make_state(layer_of(c));
    bellows::checkpoint_reader back(saved.bytes());
    on_host.load(host_st, back);
    ok &= host_st.step == 2 && host_st.rank == 3 &&
          bellows::test::same_bytes(bellows::test::memory_of(host_st.query), bellows::test::memory_of(st.query)) &&
          bellows::test::same_bytes(bellows::test::memory_of(host_st.memory), bellows::test::memory_of(st.memory));
    // a record of a higher rank than the layer allows: wire_error, nothing changed
    bellows::checkpoint_writer bad;
    bad.put<std::uint64_t>(13);
    bad.put<std::uint64_t>(9);
    bad.put<std::uint8_t>(0);
    bellows::checkpoint_reader bad_in(bad.bytes());
    try {
      ps.load(st, bad_in);
      ok = false;
    } catch (const bellows::wire_error&) {
    }
    bellows::checkpoint_writer again;
    ps.save(st, again);
    ok &= std::ranges::equal(again.bytes(), std::span<const std::byte>(record));
    // a dense layer's record (r' = 0, no memory) crosses too
    const config d{"dense", bellows::shape{1, 50}, {.rank = 1}};
    auto dense_st = ps.make_state(layer_of(d));
    const auto dense_host = on_host.make_state(layer_of(d));
    bellows::checkpoint_writer dense_out;
    on_host.save(dense_host, dense_out);
    bellows::checkpoint_reader dense_in(dense_out.bytes());
    ps.load(dense_st, dense_in);
    bellows::checkpoint_writer dense_again;
    ps.save(dense_st, dense_again);
    ok &= dense_st.rank == 0 && std::ranges::equal(dense_again.bytes(), dense_out.bytes());
    if (ok) ++right;
  });
  CHECK(right == ranks());
}
