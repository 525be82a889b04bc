// SPDX-License-Identifier: Apache-2.0
// Crash and resume of the Fashion-MNIST example: a child process trains with a checkpoint after
// every epoch and is killed by SIGKILL right after the save of epoch k; the run resumed from the
// file must end with the weights, accuracy, levels and traffic of a run never interrupted, bit
// for bit, and its results hold every epoch, those of the checkpoint included. A checkpoint of
// another training, truncated or missing is refused.
#include "fmnist/runs.hpp"

#include <doctest/doctest.h>

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "fmnist_data.hpp"

namespace {

/// 4 epochs of 8 steps of 4 workers x batch 16 (512 training and 128 test images), Accordion
/// checking every epoch and a learning-rate decay after epochs 2 and 3: seconds.
fmnist::comparison_config small(fmnist::run_spec spec) { return fmnist::testing::small_comparison(4, 512, {spec}); }

std::filesystem::path scratch(const char* name) {
  return std::filesystem::temp_directory_path() /
         (std::string("bellows_fmnist_resume_") + std::to_string(::getpid()) + "_" + name);
}

/// Trains `config` with a checkpoint at `path` in a child process that SIGKILLs itself as soon as
/// epoch `k` is saved (the progress callback runs after the save); returns the child's wait status.
int train_and_kill(const fmnist::dataset& data, fmnist::comparison_config config, const std::filesystem::path& path,
                   std::size_t k) {
  config.train.checkpoint = path;
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    try {
      (void)fmnist::run_comparison(data, config, [k](const fmnist::run_result& run) {
        if (run.epochs.back().report.epoch == k) std::raise(SIGKILL);
      });
    } catch (...) {
      ::_exit(4);
    }
    ::_exit(3);  // trained to the end: not killed
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

}  // namespace

TEST_CASE("fmnist resume: killed after the checkpoint of epoch k, resumed, the same end bit for bit") {
  const fmnist::dataset* data = fmnist::testing::real_data();
  if (data == nullptr) return;
  using fmnist::method, fmnist::policy;
  // PowerSGD carries error memories and queries, top-k error memories, Accordion its sums and
  // decisions; static high has its levels high in every epoch (Accordion's are all low in 4
  // epochs with decays from epochs 2 and 3). k = 1 resumes before the decay, k = 2 between the two. Under a sanitizer
  // (the model ~30x slower) PowerSGD with k = 1 only.
  const std::vector<fmnist::run_spec> specs = fmnist::testing::sanitized
                                                  ? std::vector<fmnist::run_spec>{{method::powersgd, policy::accordion}}
                                                  : std::vector<fmnist::run_spec>{{method::powersgd, policy::accordion},
                                                                                  {method::topk, policy::accordion},
                                                                                  {method::topk, policy::static_high}};
  const std::vector<std::size_t> kill_after =
      fmnist::testing::sanitized ? std::vector<std::size_t>{1} : std::vector<std::size_t>{1, 2};
  for (const fmnist::run_spec& spec : specs) {
    for (const std::size_t k : kill_after) {
      CAPTURE(spec.id());
      CAPTURE(k);
      const fmnist::comparison_config config = small(spec);
      const fmnist::run_result whole = fmnist::run_comparison(*data, config).at(0);
      REQUIRE(whole.epochs.size() == 4);

      const std::filesystem::path path = scratch("checkpoint");
      std::filesystem::remove(path);
      const int status = train_and_kill(*data, config, path, k);
      REQUIRE(WIFSIGNALED(status));
      CHECK(WTERMSIG(status) == SIGKILL);
      REQUIRE(std::filesystem::exists(path));

      fmnist::comparison_config again = config;
      again.train.resume = path;
      again.train.checkpoint = path;
      std::size_t trained = 0;
      const fmnist::run_result resumed =
          fmnist::run_comparison(*data, again, [&](const fmnist::run_result&) { ++trained; }).at(0);
      CHECK(trained == 4 - (k + 1));
      // The whole run: the checkpoint's epochs, then the trained ones.
      REQUIRE(resumed.epochs.size() == 4);
      CHECK(resumed.weights == whole.weights);
      CHECK(resumed.seconds > 0);
      const auto same_epochs = [&](const fmnist::run_result& got_run) {
        for (std::size_t e = 0; e < 4; ++e) {
          CAPTURE(e);
          const fmnist::epoch_record& got = got_run.epochs[e];
          const fmnist::epoch_record& want = whole.epochs[e];
          CHECK(got.report.epoch == e);
          CHECK(got.report.test_accuracy == want.report.test_accuracy);
          CHECK(got.report.test_loss == want.report.test_loss);
          CHECK(got.report.train_loss == want.report.train_loss);
          CHECK(got.report.sent == want.report.sent);  // cumulative: the traffic before the crash was restored
          CHECK(got.levels == want.levels);
        }
      };
      same_epochs(resumed);
      // The file now holds the finished run: resuming it trains nothing, gives the same weights
      // and still reports every epoch.
      trained = 0;
      const fmnist::run_result done =
          fmnist::run_comparison(*data, again, [&](const fmnist::run_result&) { ++trained; }).at(0);
      CHECK(trained == 0);
      CHECK(done.seconds > 0);  // the saved epochs' time
      REQUIRE(done.epochs.size() == 4);
      same_epochs(done);
      CHECK(done.weights == whole.weights);
      std::filesystem::remove(path);
    }
  }
}

TEST_CASE("fmnist resume: a checkpoint of another training, truncated or missing is refused") {
  const fmnist::dataset* data = fmnist::testing::real_data();
  if (data == nullptr) return;
  fmnist::comparison_config config = small({fmnist::method::topk, fmnist::policy::static_low});
  fmnist::set_epochs(config, 1);
  const std::filesystem::path path = scratch("refused");
  config.train.checkpoint = path;
  (void)fmnist::run_comparison(*data, config);
  config.train.checkpoint.clear();
  config.train.resume = path;

  fmnist::comparison_config other_seed = config;
  other_seed.seeds = {2};
  CHECK_THROWS_WITH_AS(fmnist::run_comparison(*data, other_seed),
                       doctest::Contains("not a checkpoint of this training"), bellows::wire_error);
  fmnist::comparison_config other_workers = config;
  other_workers.train.workers = 2;
  CHECK_THROWS_AS(fmnist::run_comparison(*data, other_workers), bellows::wire_error);
  fmnist::comparison_config other_method = config;  // the same layers, another compressor state
  other_method.runs = {{fmnist::method::powersgd, fmnist::policy::static_low}};
  CHECK_THROWS_AS(fmnist::run_comparison(*data, other_method), bellows::wire_error);

  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size - 1);
  CHECK_THROWS_WITH_AS(fmnist::run_comparison(*data, config), doctest::Contains("truncated"), bellows::wire_error);
  std::filesystem::remove(path);
  CHECK_THROWS_WITH_AS(fmnist::run_comparison(*data, config), doctest::Contains("cannot open"), bellows::error);

  fmnist::comparison_config two_runs = config;
  two_runs.runs = fmnist::all_runs(2);
  CHECK_THROWS_WITH_AS(two_runs.validate(), doctest::Contains("one run and one seed"), bellows::error);
}
