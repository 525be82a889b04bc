// SPDX-License-Identifier: Apache-2.0
// synchronizer<C<cuda::executor>, basic_accordion<cuda::executor>, cuda::executor> over the NCCL
// collective, one rank per device, against synchronizer<C<cpu::executor>, accordion> over the
// local collective with the same ranks, layers and gradients, for some epochs:
//  - every step's statuses, every epoch's levels, each layer's traffic, steps and skipped steps,
//    the measured gradient norms and Accordion's state equal the CPU's exactly (the detector
//    reads the raw gradients, which both backends sum and measure in one order);
//  - with top-k 1% <-> 10% every output and the checkpoint bytes are the CPU's, bit for bit;
//  - with PowerSGD 4 <-> 1 (each level switch changes a layer's rank) the outputs are the CPU's
//    within the products' rounding (bound below), the rest exactly;
//  - NaN and Inf on one rank, in observed epochs (the vote) and outside them (the compressors'
//    own agreement); a learning-rate decay; level_change keep and reset; static_policy;
//  - a checkpoint taken on one backend resumes on the other and the run goes on as the
//    uninterrupted one; a corrupted payload raises the CPU validation's wire_error on every rank.
#include <bellows/collectives/local.hpp>
#include <bellows/collectives/nccl.cuh>
#include <bellows/collectives/staged.cuh>
#include <bellows/compressors/identity.cuh>
#include <bellows/compressors/list.hpp>
#include <bellows/compressors/powersgd.cuh>
#include <bellows/compressors/powersgd.hpp>
#include <bellows/compressors/qsgd.cuh>
#include <bellows/compressors/qsgd.hpp>
#include <bellows/compressors/randk.cuh>
#include <bellows/compressors/randk.hpp>
#include <bellows/compressors/signsgd.cuh>
#include <bellows/compressors/signsgd.hpp>
#include <bellows/compressors/topk.cuh>
#include <bellows/compressors/topk.hpp>
#include <bellows/regime/accordion.cuh>
#include <bellows/regime/accordion.hpp>
#include <bellows/regime/static_policy.hpp>
#include <bellows/sync/synchronizer.cuh>
#include <bellows/sync/synchronizer.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../support/random.hpp"
#include "compressor_ranks.cuh"
#include "device_test.cuh"
#include "nccl_ranks.cuh"

namespace {

using bellows::regime;
using bellows::step_status;

/// A run: the model's layers, epochs of `steps` steps from `first` to `last` (exclusive), the
/// detector's parameters and learning rates, and which gradients go bad.
struct scenario {
  std::vector<bellows::shape> shapes = {bellows::shape{24, 32}, bellows::shape{24}, bellows::shape{16, 24}};
  std::size_t first = 0, last = 7, steps = 3;
  bellows::accordion_params accordion{.eta = 0.5f, .interval = 1};
  bellows::level_change change = bellows::level_change::keep;
  bool measure_norms = true;

  /// The learning rate of epoch e: a decay x0.1 from epoch 5.
  [[nodiscard]] static float lr(std::size_t epoch) { return epoch < 5 ? 0.1f : 0.01f; }

  /// Rank r's gradient of layer l at step s of epoch e: normals, four times larger for layer 0
  /// from epoch 3 on (its norm jumps: critical again), with a NaN (epoch 2) and an Inf (epoch 4)
  /// on the last rank.
  [[nodiscard]] std::vector<float> gradient(std::size_t e, std::size_t s, std::size_t r, std::size_t l) const {
    const std::size_t n = shapes[l].size();
    std::vector<float> g = bellows::testing::normal_floats(n, 1000 * e + 100 * s + 10 * r + l + 1);
    if (l == 0 && e >= 3)
      for (float& x : g) x *= 4.0f;
    if (r == 2 && e == 2 && s == 1 && l == 0) g[n / 2] = std::numeric_limits<float>::quiet_NaN();
    if (r == 2 && e == 4 && s == 0 && l == 2) g[1] = -std::numeric_limits<float>::infinity();
    return g;
  }
};

/// What one rank saw.
struct trace {
  std::vector<std::vector<step_status>> statuses;  ///< per step
  std::vector<std::vector<float>> outputs;         ///< per step and layer, in that order
  std::vector<std::vector<regime>> levels;         ///< per epoch ended
  std::vector<bellows::layer_telemetry> telemetry;
  bellows::accordion_state detector;
  std::vector<std::byte> checkpoint;  ///< at the end
};

/// Runs the scenario's epochs on one rank: `grads` holds the layers' gradients where the
/// backend wants them (set(l, host values), spans(), get(l) -> host values).
template <class Sync, class Coll, class Grads>
void drive(Sync& sync, Coll& coll, std::size_t rank, const scenario& sc, Grads& grads, trace& t) {
  for (std::size_t e = sc.first; e < sc.last; ++e) {
    for (std::size_t s = 0; s < sc.steps; ++s) {
      for (std::size_t l = 0; l < sc.shapes.size(); ++l) grads.set(l, sc.gradient(e, s, rank, l));
      const auto st = sync.step(grads.spans(), coll);
      t.statuses.emplace_back(st.begin(), st.end());
      for (std::size_t l = 0; l < sc.shapes.size(); ++l) t.outputs.push_back(grads.get(l));
    }
    const auto next = sync.end_epoch(scenario::lr(e + 1), coll);
    t.levels.emplace_back(next.begin(), next.end());
  }
  t.telemetry.assign(sync.telemetry().begin(), sync.telemetry().end());
  if constexpr (requires { sync.detector().state(); }) t.detector = sync.detector().state();
  t.checkpoint = sync.checkpoint(coll);
}

struct host_grads {
  std::vector<std::vector<float>> values;
  std::vector<std::span<float>> views;
  explicit host_grads(const scenario& sc) {
    for (const bellows::shape& s : sc.shapes) values.emplace_back(s.size());
    for (auto& v : values) views.emplace_back(v);
  }
  void set(std::size_t l, const std::vector<float>& g) { values[l] = g; }
  [[nodiscard]] std::span<const std::span<float>> spans() const { return views; }
  [[nodiscard]] std::vector<float> get(std::size_t l) const { return values[l]; }
};

struct device_grads {
  std::deque<bellows::test::device_array<float>> values;  // device_array does not move
  std::vector<std::span<float>> views;
  explicit device_grads(const scenario& sc) {
    for (const bellows::shape& s : sc.shapes) values.emplace_back(s.size());
    for (auto& v : values) views.push_back(v.span());
  }
  void set(std::size_t l, const std::vector<float>& g) {
    BELLOWS_CUDA_CHECK(cudaMemcpy(values[l].data(), g.data(), g.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  [[nodiscard]] std::span<const std::span<float>> spans() const { return views; }
  [[nodiscard]] std::vector<float> get(std::size_t l) const { return values[l].host(); }
};

std::size_t ranks() { return static_cast<std::size_t>(bellows::cuda::device_count()); }

template <class Sync>
void register_layers(Sync& sync, const scenario& sc) {
  for (std::size_t l = 0; l < sc.shapes.size(); ++l) sync.add_layer("layer" + std::to_string(l), sc.shapes[l]);
}

/// The scenario on the CPU over the local collective, one trace per rank; `resume` (per rank)
/// is restored before the first step.
template <template <class> class C, class Params>
std::vector<trace> on_cpu(const scenario& sc, const Params& low, const Params& high,
                          const std::vector<std::vector<std::byte>>& resume = {}) {
  std::vector<trace> traces(ranks());
  bellows::collectives::local_group group(ranks());
  group.run([&](bellows::collectives::local& comm) {
    bellows::cpu::executor exec(1);
    bellows::synchronizer<C<bellows::cpu::executor>, bellows::accordion> sync(
        C<bellows::cpu::executor>(low, exec), C<bellows::cpu::executor>(high, exec),
        bellows::accordion(sc.accordion, exec), exec);
    register_layers(sync, sc);
    sync.set_level_change(sc.change);
    sync.measure_gradient_norms(sc.measure_norms);
    if (!resume.empty()) sync.restore(resume[comm.rank()], comm);
    host_grads grads(sc);
    drive(sync, comm, comm.rank(), sc, grads, traces[comm.rank()]);
  });
  return traces;
}

/// One rank of the scenario on the device: the Synchronizer of C's levels and the device
/// Accordion on `exec`, over the DeviceCollective `coll` (on the executor's stream).
template <template <class> class C, class Params, class Coll>
void run_on_device(const scenario& sc, const Params& low, const Params& high,
                   const std::vector<std::vector<std::byte>>& resume, std::size_t rank, bellows::cuda::executor& exec,
                   Coll& coll, trace& t) {
  using detector = bellows::basic_accordion<bellows::cuda::executor>;
  bellows::synchronizer<C<bellows::cuda::executor>, detector, bellows::cuda::executor> sync(
      C<bellows::cuda::executor>(low, exec), C<bellows::cuda::executor>(high, exec), detector(sc.accordion, exec),
      exec);
  register_layers(sync, sc);
  sync.set_level_change(sc.change);
  sync.measure_gradient_norms(sc.measure_norms);
  if (!resume.empty()) sync.restore(resume[rank], bellows::rank_place{rank, ranks()});
  device_grads grads(sc);
  drive(sync, coll, rank, sc, grads, t);
}

/// The same on the device, over NCCL.
template <template <class> class C, class Params>
std::vector<trace> on_device(const scenario& sc, const Params& low, const Params& high,
                             const std::vector<std::vector<std::byte>>& resume = {}) {
  std::vector<trace> traces(ranks());
  bellows::test::on_every_device([&](std::size_t rank, bellows::collectives::nccl& coll) {
    bellows::cuda::executor exec(coll.stream());
    run_on_device<C>(sc, low, high, resume, rank, exec, coll, traces[rank]);
  });
  return traces;
}

/// The same on the device over the local collective's threads, staged through the host
/// (collectives::staged: the Fashion-MNIST demo's --backend cuda), each thread on a device of its
/// own where there are enough.
template <template <class> class C, class Params>
std::vector<trace> on_staged(const scenario& sc, const Params& low, const Params& high) {
  std::vector<trace> traces(ranks());
  bellows::collectives::local_group group(ranks());
  group.run([&](bellows::collectives::local& comm) {
    BELLOWS_CUDA_CHECK(cudaSetDevice(static_cast<int>(comm.rank() % ranks())));
    cudaStream_t stream = nullptr;
    BELLOWS_CUDA_CHECK(cudaStreamCreate(&stream));
    {
      bellows::cuda::executor exec(stream);
      bellows::collectives::staged<bellows::collectives::local> coll(comm, stream);
      run_on_device<C>(sc, low, high, {}, comm.rank(), exec, coll, traces[comm.rank()]);
    }
    BELLOWS_CUDA_CHECK(cudaStreamDestroy(stream));
  });
  return traces;
}

bool same_telemetry(const bellows::layer_telemetry& a, const bellows::layer_telemetry& b) {
  return a.name == b.name && a.participates == b.participates && a.level == b.level && a.last_status == b.last_status &&
         a.steps == b.steps && a.skipped == b.skipped && a.sent == b.sent &&
         std::memcmp(&a.grad_norm, &b.grad_norm, sizeof(float)) == 0;
}

/// Everything but the outputs and the checkpoint bytes, exactly.
void check_same_decisions(const std::vector<trace>& got, const std::vector<trace>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t r = 0; r < got.size(); ++r) {
    CAPTURE(r);
    CHECK(got[r].statuses == want[r].statuses);
    CHECK(got[r].levels == want[r].levels);
    CHECK(got[r].detector == want[r].detector);
    REQUIRE(got[r].telemetry.size() == want[r].telemetry.size());
    for (std::size_t l = 0; l < got[r].telemetry.size(); ++l) {
      CAPTURE(l);
      CHECK(same_telemetry(got[r].telemetry[l], want[r].telemetry[l]));
    }
  }
}

/// Bit for bit: the decisions, every output and the checkpoint.
void check_same_run(const std::vector<trace>& got, const std::vector<trace>& want) {
  check_same_decisions(got, want);
  for (std::size_t r = 0; r < got.size(); ++r) {
    CAPTURE(r);
    CHECK(bellows::test::same_bytes(got[r].checkpoint, want[r].checkpoint));
    REQUIRE(got[r].outputs.size() == want[r].outputs.size());
    for (std::size_t i = 0; i < got[r].outputs.size(); ++i) {
      CAPTURE(i);
      CHECK(bellows::test::same_bytes(got[r].outputs[i], want[r].outputs[i]));
    }
  }
}

/// The levels seen by rank 0, so that a test can say the scenario switched levels at all.
std::size_t switches(const trace& t) {
  std::size_t n = 0;
  for (std::size_t e = 1; e < t.levels.size(); ++e)
    for (std::size_t l = 0; l < t.levels[e].size(); ++l) n += t.levels[e][l] != t.levels[e - 1][l];
  return n;
}

const bellows::topk_params topk_low{.ratio = 0.10, .feedback = bellows::feedback::residual};
const bellows::topk_params topk_high{.ratio = 0.01, .feedback = bellows::feedback::residual};

}  // namespace

/// The scenario on both backends with C's two levels, under level_change keep and reset and
/// Accordion intervals 1 and 2 (so that the NaN and the Inf fall in observed epochs, where the
/// vote skips them, and in others, where the compressor's own exchange does): the same run,
/// bit for bit, and the scenario does what it claims.
template <template <class> class C, class Params>
void check_bitwise(const Params& low, const Params& high) {
  for (const auto change : {bellows::level_change::keep, bellows::level_change::reset}) {
    for (const std::size_t interval : {std::size_t{1}, std::size_t{2}}) {
      CAPTURE(bellows::to_string(change));
      CAPTURE(interval);
      scenario sc;
      sc.change = change;
      sc.accordion.interval = interval;
      const std::vector<trace> want = on_cpu<C>(sc, low, high);
      check_same_run(on_device<C>(sc, low, high), want);
      CHECK(switches(want[0]) >= 3);             // levels switch both ways
      CHECK(want[0].telemetry[0].skipped == 1);  // the NaN
      CHECK(want[0].telemetry[2].skipped == 1);  // the Inf
      CHECK(want[0].telemetry[1].skipped == 0);
    }
  }
}

TEST_CASE("cuda synchronizer: every listed device compressor that sums in the CPU's order runs as the CPU's" *
          doctest::skip(bellows::test::no_device())) {
  // compressors/list.hpp: each method with a device compressor (PowerSGD sums in its own order:
  // its case is below), at its first example with a residual memory where it has one, both
  // levels alike.
  bellows::for_each_method(bellows::compressor_methods{}, []<class M>(std::type_identity<M>) {
    if constexpr (M::on_device && M::name != std::string_view("powersgd")) {
      CAPTURE(M::name);
      auto params = M::examples[0];
      if constexpr (requires { params.feedback; }) params.feedback = bellows::feedback::residual;
      check_bitwise<M::template compressor>(params, params);
    }
  });
}

TEST_CASE("cuda synchronizer: top-k 10% <-> 1% with Accordion runs as the CPU's, bit for bit" *
          doctest::skip(bellows::test::no_device())) {
  check_bitwise<bellows::topk>(topk_low, topk_high);
}

TEST_CASE("cuda synchronizer: rand-k 10% <-> 1% and QSGD 8 <-> 2 bits with Accordion run as the CPU's" *
          doctest::skip(bellows::test::no_device())) {
  check_bitwise<bellows::randk>(bellows::randk_params{.ratio = 0.10, .feedback = bellows::feedback::residual},
                                bellows::randk_params{.ratio = 0.01, .feedback = bellows::feedback::residual});
  check_bitwise<bellows::qsgd>(bellows::qsgd_params{.bits = 8, .bucket = 64, .feedback = bellows::feedback::residual},
                               bellows::qsgd_params{.bits = 2, .bucket = 64, .feedback = bellows::feedback::residual});
}

TEST_CASE("cuda synchronizer: over the local collective's threads, staged through the host, as the CPU's" *
          doctest::skip(bellows::test::no_device())) {
  const scenario sc;
  check_same_run(on_staged<bellows::topk>(sc, topk_low, topk_high), on_cpu<bellows::topk>(sc, topk_low, topk_high));
}

TEST_CASE("cuda synchronizer: PowerSGD 4 <-> 1 decides, skips and counts as the CPU's, outputs within rounding" *
          doctest::skip(bellows::test::no_device())) {
  const bellows::powersgd_params low{.rank = 4}, high{.rank = 1};
  for (const auto change : {bellows::level_change::keep, bellows::level_change::reset}) {
    CAPTURE(bellows::to_string(change));
    scenario sc;
    sc.change = change;
    const std::vector<trace> want = on_cpu<bellows::powersgd>(sc, low, high);
    const std::vector<trace> got = on_device<bellows::powersgd>(sc, low, high);
    check_same_decisions(got, want);
    CHECK(switches(want[0]) >= 2);
    CHECK(!want[0].telemetry[1].participates);  // the 1-D layer is averaged dense, outside detection
    // Outputs. The products sum in another order on each backend (tests/cuda/test_powersgd.cu
    // derives the bound): after s steps an output is within s * 40 gamma(k) max ||M||_F of the
    // CPU's, gamma(k) = k u / (1 - k u), k = 32 the longest sum here, ||M||_F at most
    // (1 + 2) * 4 * sqrt(768) (a gradient four times normal plus a memory of the same order,
    // taken thrice for safety). The dense 1-D layer, and a skipped step's untouched input, are
    // the CPU's bit for bit.
    const double u = 0x1p-24, gamma = 32 * u / (1 - 32 * u), matrix = 3.0 * 4.0 * std::sqrt(768.0);
    for (std::size_t r = 0; r < got.size(); ++r) {
      REQUIRE(got[r].outputs.size() == want[r].outputs.size());
      for (std::size_t i = 0; i < got[r].outputs.size(); ++i) {
        CAPTURE(r);
        CAPTURE(i);
        const std::size_t step = i / sc.shapes.size() + 1, layer = i % sc.shapes.size();
        if (layer == 1 || want[r].statuses[step - 1][layer] != step_status::ok) {  // dense, or unchanged input
          CHECK(bellows::test::same_bytes(got[r].outputs[i], want[r].outputs[i]));
          continue;
        }
        double diff = 0.0;
        for (std::size_t j = 0; j < want[r].outputs[i].size(); ++j) {
          const double d = double{got[r].outputs[i][j]} - want[r].outputs[i][j];
          diff += d * d;
        }
        CHECK(std::sqrt(diff) <= static_cast<double>(step) * 40.0 * gamma * matrix);
      }
    }
  }
}

TEST_CASE("cuda synchronizer: a checkpoint taken on one backend resumes on the other" *
          doctest::skip(bellows::test::no_device())) {
  scenario whole, before, after;
  before.last = after.first = 3;  // mid-run, after the NaN step, before the jump in layer 0
  const std::vector<trace> want = on_cpu<bellows::topk>(whole, topk_low, topk_high);
  const std::vector<trace> cpu_first = on_cpu<bellows::topk>(before, topk_low, topk_high);
  const std::vector<trace> device_first = on_device<bellows::topk>(before, topk_low, topk_high);
  std::vector<std::vector<std::byte>> from_cpu, from_device;
  for (std::size_t r = 0; r < ranks(); ++r) {
    CHECK(bellows::test::same_bytes(device_first[r].checkpoint, cpu_first[r].checkpoint));
    from_cpu.push_back(cpu_first[r].checkpoint);
    from_device.push_back(device_first[r].checkpoint);
  }
  const std::vector<trace> cpu_to_device = on_device<bellows::topk>(after, topk_low, topk_high, from_cpu);
  const std::vector<trace> device_to_cpu = on_cpu<bellows::topk>(after, topk_low, topk_high, from_device);
  for (std::size_t r = 0; r < ranks(); ++r) {
    CAPTURE(r);
    for (const trace* resumed : {&cpu_to_device[r], &device_to_cpu[r]}) {
      // the resumed half's levels and outputs are the uninterrupted run's from epoch 3 on
      CHECK(resumed->levels == std::vector<std::vector<regime>>(want[r].levels.begin() + 3, want[r].levels.end()));
      const std::size_t skip = 3 * whole.steps * whole.shapes.size();
      REQUIRE(resumed->outputs.size() + skip == want[r].outputs.size());
      for (std::size_t i = 0; i < resumed->outputs.size(); ++i)
        CHECK(bellows::test::same_bytes(resumed->outputs[i], want[r].outputs[skip + i]));
      CHECK(bellows::test::same_bytes(resumed->checkpoint, want[r].checkpoint));
      CHECK(resumed->detector == want[r].detector);
    }
  }
}

#if defined(BELLOWS_EMULATED_CUDA)
namespace {

/// Every rank's waits for the stream in the second step of the Synchronizer `make` builds, on
/// the scenario's three layers (one bucket at the default budget; a layer each at 0).
template <class Make>
std::vector<std::uint64_t> step_waits(Make make, std::size_t bucket_bytes, bool norms = false) {
  const scenario sc;
  std::vector<std::uint64_t> waits(ranks());
  bellows::test::on_every_device([&](std::size_t rank, bellows::collectives::nccl& coll) {
    bellows::cuda::executor exec(coll.stream());
    auto sync = make(exec);
    register_layers(sync, sc);
    sync.set_bucket_bytes(bucket_bytes);
    sync.measure_gradient_norms(norms);
    device_grads grads(sc);
    for (std::size_t s = 0; s < 2; ++s) {  // the first step also checks the layers
      for (std::size_t l = 0; l < sc.shapes.size(); ++l) grads.set(l, sc.gradient(0, s, rank, l));
      const std::uint64_t before = bellows_emulated_waits();
      (void)sync.step(grads.spans(), coll);
      waits[rank] = bellows_emulated_waits() - before;
    }
  });
  return waits;
}

template <template <class> class C, class Params>
auto static_sync(const Params& p) {
  return [p](bellows::cuda::executor& exec) {
    using S = bellows::synchronizer<C<bellows::cuda::executor>, bellows::static_policy, bellows::cuda::executor>;
    return S(C<bellows::cuda::executor>(p, exec), C<bellows::cuda::executor>(p, exec),
             bellows::static_policy(regime::critical), exec);
  };
}

}  // namespace

TEST_CASE("cuda synchronizer: a step in one bucket waits for the stream once, whatever its compressor and the "
          "norms; a check epoch's vote once more") {
  using V = std::vector<std::uint64_t>;
  const std::size_t one = std::size_t{25} << 20, alone = 0;
  const V w1(ranks(), 1), w2(ranks(), 2), w3(ranks(), 3), w4(ranks(), 4), w5(ranks(), 5);
  // allreduce rounds: the bucket's one wait; a layer per bucket, each reduce's (PowerSGD's
  // compressed layers two: its verdict before Q)
  const bellows::powersgd_params ps{.rank = 2};
  CHECK(step_waits(static_sync<bellows::powersgd>(ps), one) == w1);
  CHECK(step_waits(static_sync<bellows::powersgd>(ps), alone) == w5);
  CHECK(step_waits(static_sync<bellows::identity>(bellows::identity_params{}), one) == w1);
  CHECK(step_waits(static_sync<bellows::identity>(bellows::identity_params{}), alone) == w3);
  // allgather rounds: the verdicts and counts come back with the bucket's wait (a layer per
  // bucket: each reduce's one)
  const bellows::qsgd_params q{.bits = 8, .bucket = 64};
  CHECK(step_waits(static_sync<bellows::qsgd>(q), one) == w1);
  CHECK(step_waits(static_sync<bellows::qsgd>(q), alone) == w3);
  CHECK(step_waits(static_sync<bellows::topk>(topk_low), one) == w1);
  CHECK(step_waits(static_sync<bellows::topk>(topk_low), alone) == w3);
  CHECK(step_waits(static_sync<bellows::signsgd>(bellows::signsgd_params{}), one) == w1);
  const bellows::randk_params per_rank{.ratio = 0.25, .mode = bellows::randk_mode::per_rank};
  CHECK(step_waits(static_sync<bellows::randk>(per_rank), one) == w1);
  // the norms come back with the step's last wait (a layer per bucket: one more)
  CHECK(step_waits(static_sync<bellows::powersgd>(ps), one, true) == w1);
  CHECK(step_waits(static_sync<bellows::qsgd>(q), one, true) == w1);
  CHECK(step_waits(static_sync<bellows::qsgd>(q), alone, true) == w4);
  // a check epoch of Accordion: the bucket's vote, read back before the exchange
  const auto accordion_sync = [&](bellows::cuda::executor& exec) {
    using D = bellows::basic_accordion<bellows::cuda::executor>;
    using C = bellows::powersgd<bellows::cuda::executor>;
    return bellows::synchronizer<C, D, bellows::cuda::executor>(C(ps, exec), C(ps, exec), D(scenario{}.accordion, exec),
                                                                exec);
  };
  CHECK(step_waits(accordion_sync, one) == w2);
}
#endif

TEST_CASE("cuda synchronizer: a static policy on the device runs as on the CPU" *
          doctest::skip(bellows::test::no_device())) {
  scenario sc;
  sc.last = 2;
  std::vector<trace> want(ranks()), got(ranks());
  for (const regime level : {regime::critical, regime::normal}) {
    CAPTURE(static_cast<int>(level));
    bellows::collectives::local_group group(ranks());
    group.run([&](bellows::collectives::local& comm) {
      bellows::cpu::executor exec(1);
      using C = bellows::topk<bellows::cpu::executor>;
      bellows::synchronizer<C, bellows::static_policy> sync(C(topk_low, exec), C(topk_high, exec),
                                                            bellows::static_policy(level), exec);
      register_layers(sync, sc);
      host_grads grads(sc);
      want[comm.rank()] = {};
      drive(sync, comm, comm.rank(), sc, grads, want[comm.rank()]);
    });
    bellows::test::on_every_device([&](std::size_t rank, bellows::collectives::nccl& coll) {
      bellows::cuda::executor exec(coll.stream());
      using C = bellows::topk<bellows::cuda::executor>;
      bellows::synchronizer<C, bellows::static_policy, bellows::cuda::executor> sync(
          C(topk_low, exec), C(topk_high, exec), bellows::static_policy(level), exec);
      register_layers(sync, sc);
      device_grads grads(sc);
      got[rank] = {};
      drive(sync, coll, rank, sc, grads, got[rank]);
    });
    check_same_run(got, want);
    CHECK(want[0].levels.back()[0] == level);
  }
}

TEST_CASE("cuda synchronizer: a corrupted payload raises the CPU validation's wire_error on every rank" *
          doctest::skip(bellows::test::no_device())) {
  const scenario sc;
  const std::size_t victim = ranks() - 1;
  bellows::test::check_every_rank([&](std::size_t rank, bellows::collectives::nccl& coll) {
    bellows::cuda::executor exec(coll.stream());
    using C = bellows::topk<bellows::cuda::executor>;
    using detector = bellows::basic_accordion<bellows::cuda::executor>;
    bellows::synchronizer<C, detector, bellows::cuda::executor> sync(C(topk_low, exec), C(topk_high, exec),
                                                                     detector(sc.accordion, exec), exec);
    register_layers(sync, sc);
    device_grads grads(sc);
    for (std::size_t l = 0; l < sc.shapes.size(); ++l) grads.set(l, sc.gradient(0, 0, rank, l));
    // the first index of the victim's payload of layer 0 becomes n: out of range
    bellows::test::corrupting lossy{coll, victim, bellows::wire::header_bytes, 768, 4};
    return bellows::test::raises<bellows::wire_error>([&] { (void)sync.step(grads.spans(), lossy); },
                                                      "rank " + std::to_string(victim)) &&
           sync.steps() == 0;
  });
}

TEST_CASE("cuda synchronizer: a corrupted payload in a bucket of EF-signSGD layers changes no state, though the "
          "layers after it are averaged before the wait" *
          doctest::skip(bellows::test::no_device())) {
  const scenario sc;
  const std::size_t victim = ranks() - 1;
  bellows::test::check_every_rank([&](std::size_t rank, bellows::collectives::nccl& coll) {
    bellows::cuda::executor exec(coll.stream());
    using C = bellows::signsgd<bellows::cuda::executor>;
    const bellows::signsgd_params p{};  // a memory, staged in the averaging pass
    bellows::synchronizer<C, bellows::static_policy, bellows::cuda::executor> sync(
        C(p, exec), C(p, exec), bellows::static_policy(regime::critical), exec);
    register_layers(sync, sc);
    device_grads grads(sc);
    for (std::size_t l = 0; l < sc.shapes.size(); ++l) grads.set(l, sc.gradient(0, 0, rank, l));
    bool ok = sync.step(grads.spans(), coll)[0] == bellows::step_status::ok;
    const std::vector<std::byte> before = sync.checkpoint(coll);
    for (std::size_t l = 0; l < sc.shapes.size(); ++l) grads.set(l, sc.gradient(0, 1, rank, l));
    // the header of the victim's payload of layer 0 (the bucket's first) names another codec
    bellows::test::corrupting lossy{coll, victim, 4, 0xFF, 1};
    ok &= bellows::test::raises<bellows::wire_error>([&] { (void)sync.step(grads.spans(), lossy); },
                                                     "rank " + std::to_string(victim));
    return ok && sync.steps() == 1 && sync.checkpoint(coll) == before;
  });
}

TEST_CASE("cuda accordion: alone, its observe() and end_epoch() decide as the CPU detector's" *
          doctest::skip(bellows::test::no_device())) {
  // one rank's detector on each backend, fed the same gradients, NaN included
  const scenario sc;
  std::vector<std::vector<regime>> want, got;
  std::vector<step_status> want_status, got_status;
  bellows::accordion_state want_state, got_state;
  {
    bellows::cpu::executor exec(1);
    bellows::accordion d(sc.accordion, exec);
    for (std::size_t l = 0; l < sc.shapes.size(); ++l)
      d.add_layer({static_cast<std::uint32_t>(l), "layer" + std::to_string(l), sc.shapes[l]});
    bellows::archetypes::collective one;
    for (std::size_t e = 0; e < sc.last; ++e) {
      for (std::size_t s = 0; s < sc.steps; ++s)
        for (std::size_t l = 0; l < sc.shapes.size(); ++l) want_status.push_back(d.observe(l, sc.gradient(e, s, 2, l)));
      const auto next = d.end_epoch(e, scenario::lr(e + 1), one);
      want.emplace_back(next.begin(), next.end());
    }
    want_state = d.state();
  }
  bellows::test::on_every_device([&](std::size_t rank, bellows::collectives::nccl&) {
    if (rank != 0) return;
    bellows::cuda::executor exec;
    bellows::basic_accordion<bellows::cuda::executor> d(sc.accordion, exec);
    for (std::size_t l = 0; l < sc.shapes.size(); ++l)
      d.add_layer({static_cast<std::uint32_t>(l), "layer" + std::to_string(l), sc.shapes[l]});
    bellows::archetypes::device_collective one;
    for (std::size_t e = 0; e < sc.last; ++e) {
      for (std::size_t s = 0; s < sc.steps; ++s)
        for (std::size_t l = 0; l < sc.shapes.size(); ++l) {
          bellows::test::device_array<float> g(sc.gradient(e, s, 2, l));
          got_status.push_back(d.observe(l, g.span()));
        }
      const auto next = d.end_epoch(e, scenario::lr(e + 1), one);
      got.emplace_back(next.begin(), next.end());
    }
    got_state = d.state();
  });
  CHECK(got_status == want_status);
  CHECK(std::count(want_status.begin(), want_status.end(), step_status::non_finite) == 2);
  CHECK(got == want);
  CHECK(got_state == want_state);
}
