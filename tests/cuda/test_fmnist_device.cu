// SPDX-License-Identifier: Apache-2.0
// fmnist_demo --backend cuda (examples/fmnist/device.hpp): the demo's comparison with the
// compressed runs averaged through the device Synchronizer, against the same comparison on the
// CPU, on a sliver of the real data. Top-k runs (Accordion and static) give the CPU's epochs bit
// for bit: losses, accuracies, traffic and levels. PowerSGD's products sum in another order on
// the device, so its Accordion run keeps the CPU's traffic and is within a point of its accuracy.
// Skips without the dataset-fashion-mnist package, as the other demo tests do. Built against the
// CUDA emulation only (tests/CMakeLists.txt): nvcc compiles the same device.cu into fmnist_demo.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <vector>

#include "../examples/fmnist_data.hpp"
#include "device_test.cuh"
#include "fmnist/device.cu"

namespace {

bool same_epochs(const fmnist::run_result& a, const fmnist::run_result& b) {
  if (a.epochs.size() != b.epochs.size()) return false;
  for (std::size_t e = 0; e < a.epochs.size(); ++e) {
    const fmnist::epoch_report &x = a.epochs[e].report, &y = b.epochs[e].report;
    if (x.train_loss != y.train_loss || x.test_loss != y.test_loss || x.test_accuracy != y.test_accuracy ||
        !(x.sent == y.sent) || x.high_levels != y.high_levels || x.skipped_steps != y.skipped_steps ||
        a.epochs[e].levels != b.epochs[e].levels)
      return false;
  }
  return a.weights == b.weights;
}

}  // namespace

TEST_CASE("fmnist demo --backend cuda: the compressed runs average on the device as on the CPU" *
          doctest::skip(bellows::test::no_device())) {
  const fmnist::dataset* data = fmnist::testing::real_data();
  if (data == nullptr) return;
  using fmnist::method;
  using fmnist::policy;
  // 3 epochs of 128 images (64 under a sanitizer) on 2 workers, batch 16, no learning-rate decay,
  // and an eta so large that the second check puts every layer on the high level: epoch 2 runs
  // high.
  fmnist::comparison_config config = fmnist::testing::small_comparison(3, fmnist::testing::sanitized ? 64 : 128,
                                                                       {{method::topk, policy::accordion, 0},
                                                                        {method::topk, policy::static_high, 0},
                                                                        {method::powersgd, policy::accordion, 0}});
  config.train.schedule.milestones.clear();
  config.accordion.eta = 1e6f;
  config.seeds = {1};
  config.train.workers = 2;
  config.topk_low_ratio = 0.2;  // both levels exchange sparse payloads (2 ranks: 2 k 8 < 4 n)
  const std::vector<fmnist::run_result> cpu = fmnist::run_comparison(*data, config);
  config.on_device = true;
  const std::vector<fmnist::run_result> device = fmnist::run_comparison(*data, config);
  REQUIRE(device.size() == cpu.size());
  for (std::size_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(same_epochs(device[r], cpu[r]));
  }
  const fmnist::run_result &psgd = device[2], &psgd_cpu = cpu[2];
  REQUIRE(psgd.epochs.size() == psgd_cpu.epochs.size());
  for (std::size_t e = 0; e < psgd.epochs.size(); ++e) {
    CAPTURE(e);
    CHECK(psgd.epochs[e].report.sent == psgd_cpu.epochs[e].report.sent);
    CHECK(std::abs(psgd.epochs[e].report.test_accuracy - psgd_cpu.epochs[e].report.test_accuracy) <= 0.01);
  }
  // the scenario exercises Accordion: the layers ran at the high level in the last epoch
  CHECK(cpu[0].epochs.back().report.high_levels != 0);
  CHECK(cpu[2].epochs.back().report.high_levels != 0);
}
