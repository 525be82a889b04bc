// SPDX-License-Identifier: Apache-2.0
// What the Fashion-MNIST tests share: the real data when Debian's dataset-fashion-mnist package is
// installed (the tests that need it say so and skip otherwise), and whether a sanitizer is on
// (the model runs ~30x slower there, so the long runs shrink or skip).
#pragma once

#include <doctest/doctest.h>

#include <cstddef>
#include <filesystem>
#include <utility>
#include <vector>

#include "fmnist/idx.hpp"
#include "fmnist/runs.hpp"

namespace fmnist::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool sanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool sanitized = true;
#else
inline constexpr bool sanitized = false;
#endif
#else
inline constexpr bool sanitized = false;
#endif

/// The real data, read once, or nullptr when the package is absent; then the calling test's
/// output says it skipped (ctest takes "skipped: no Fashion-MNIST" for a skip) and the test
/// returns at once.
inline const dataset* real_data() {
  static const bool present =
      std::filesystem::exists(std::filesystem::path(package_dir) / "train-images-idx3-ubyte.gz");
  if (!present) {
    MESSAGE("skipped: no Fashion-MNIST in " << package_dir << " (apt-get install dataset-fashion-mnist)");
    return nullptr;
  }
  static const dataset data = load(package_dir);
  return &data;
}

/// The quick comparison cut down to seconds: `epochs` epochs of `train_images` training and 128
/// test images, batch 16 per worker, and the given runs.
inline comparison_config small_comparison(std::size_t epochs, std::size_t train_images, std::vector<run_spec> runs) {
  comparison_config config = quick_comparison();
  set_epochs(config, epochs);
  config.train.train_limit = train_images;
  config.train.test_limit = 128;
  config.train.batch = 16;
  config.runs = std::move(runs);
  return config;
}

}  // namespace fmnist::testing
