// SPDX-License-Identifier: Apache-2.0
// fmnist_demo: data-parallel training of an MLP on the real Fashion-MNIST data, four workers as
// threads, gradients averaged through bellows. Prints one line per epoch.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "idx.hpp"
#include "model.hpp"
#include "train.hpp"

namespace {

constexpr const char* usage =
    "usage: fmnist_demo [--epochs N] [--seed S] [--workers W] [--batch B] [--lr X] [--data DIR] [--quick]\n"
    "  --epochs N   epochs to train (default 10); the learning rate drops 10x at 50% and 75% of them\n"
    "  --seed S     seed of the initialisation and the shuffles (default 1)\n"
    "  --workers W  data-parallel workers, as threads (default 4)\n"
    "  --batch B    batch size per worker (default 64)\n"
    "  --lr X       initial learning rate (default 0.1)\n"
    "  --data DIR   folder of the four IDX files (default $BELLOWS_FMNIST_DIR, else the\n"
    "               dataset-fashion-mnist package's /usr/share/datasets/fashion-mnist)\n"
    "  --quick      12000 training and 2000 test images, 2 epochs\n";

/// The argument after option argv[i] (i moves onto it).
std::string value_of(int& i, int argc, char** argv) {
  if (i + 1 >= argc) throw bellows::error(std::string(argv[i]) + " needs a value");
  return argv[++i];
}

std::size_t number(const std::string& text, const char* name) {
  std::size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || text[0] == '-')
    throw bellows::error(std::string(name) + ": not a number: '" + text + "'");
  return static_cast<std::size_t>(v);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    fmnist::train_options options;
    std::string dir;
    float lr = 0.1f;
    bool quick = false, epochs_given = false;
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (arg == "--epochs") {
        options.epochs = number(value_of(i, argc, argv), "--epochs");
        epochs_given = true;
      } else if (arg == "--seed") {
        options.seed = number(value_of(i, argc, argv), "--seed");
      } else if (arg == "--workers") {
        options.workers = number(value_of(i, argc, argv), "--workers");
      } else if (arg == "--batch") {
        options.batch = number(value_of(i, argc, argv), "--batch");
      } else if (arg == "--lr") {
        lr = std::strtof(value_of(i, argc, argv).c_str(), nullptr);
      } else if (arg == "--data") {
        dir = value_of(i, argc, argv);
      } else if (arg == "--quick") {
        quick = true;
      } else if (arg == "--help" || arg == "-h") {
        std::fputs(usage, stdout);
        return 0;
      } else {
        std::fprintf(stderr, "fmnist_demo: unknown option '%s'\n%s", argv[i], usage);
        return 2;
      }
    }
    if (quick) {
      options.train_limit = 12000;
      options.test_limit = 2000;
      if (!epochs_given) options.epochs = 2;
    }
    // 10x decays at 50% and 75% of the epochs (one when both fall on the same epoch, none in a
    // run of one epoch).
    options.schedule = {lr, 0.1f, {}};
    for (const std::size_t m : {options.epochs / 2, options.epochs * 3 / 4})
      if (m > 0 && (options.schedule.milestones.empty() || m > options.schedule.milestones.back()))
        options.schedule.milestones.push_back(m);

    const std::filesystem::path folder = fmnist::data_dir(dir);
    const fmnist::dataset data = fmnist::load(folder);
    std::printf("Fashion-MNIST from %s: training on %zu of %zu images, testing on %zu of %zu\n",
                folder.c_str(), options.train_images(data), data.train.count,
                options.test_images(data), data.test.count);
    std::printf("MLP 784-256-128-10, %zu workers x batch %zu, SGD momentum %.2f, lr %g (x0.1 from epoch",
                options.workers, options.batch, static_cast<double>(options.momentum),
                static_cast<double>(lr));
    for (const std::size_t m : options.schedule.milestones) std::printf(" %zu", m + 1);
    std::printf("), seed %llu\n", static_cast<unsigned long long>(options.seed));
    const auto print = [&](const fmnist::epoch_report& r, const auto& /*averaging*/) {
      std::printf("epoch %3zu/%zu  lr %.4f  train loss %.4f  test loss %.4f  test acc %6.2f%%  "
                  "total floats sent %.3g  %.2f s\n",
                  r.epoch + 1, options.epochs, static_cast<double>(r.lr), r.train_loss, r.test_loss,
                  100 * r.test_accuracy, static_cast<double>(r.sent.elements), r.seconds);
      std::fflush(stdout);
    };
    const fmnist::train_result result = fmnist::train(
        data, options,
        [](std::span<const bellows::layer_info> layers) { return fmnist::uncompressed_averaging(layers); },
        print);
    std::printf("final test accuracy %.2f%%\n", 100 * result.epochs.back().test_accuracy);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fmnist_demo: %s\n", e.what());
    return 1;
  }
}
