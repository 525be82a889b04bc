// SPDX-License-Identifier: Apache-2.0
// What the Fashion-MNIST tests share: the real data when Debian's dataset-fashion-mnist package is
// installed (the tests that need it say so and skip otherwise), and whether a sanitizer is on
// (the model runs ~30x slower there, so the long runs shrink or skip).
#pragma once

#include <filesystem>

#include "fmnist/idx.hpp"

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

/// The real data, read once, or nullptr when the package is absent.
inline const dataset* real_data() {
  static const bool present =
      std::filesystem::exists(std::filesystem::path(package_dir) / "train-images-idx3-ubyte.gz");
  if (!present) return nullptr;
  static const dataset data = load(package_dir);
  return &data;
}

}  // namespace fmnist::testing
