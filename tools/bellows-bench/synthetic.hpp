// SPDX-License-Identifier: Apache-2.0
// Synthetic gradients for bellows-bench --synthetic: seeded, reproducible on any machine and for
// any thread count, drawn from Philox (core/philox.hpp) rather than from std:: distributions,
// whose algorithms differ between standard libraries.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "bellows/core/error.hpp"
#include "bellows/core/philox.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"

namespace bellows::tool {

enum class distribution : unsigned char {
  normal,     ///< N(0, 1)
  laplace,    ///< density exp(-|x|) / 2: exponential magnitudes, random signs
  lognormal,  ///< exp(N(0, 1)) magnitudes, random signs: heavy tails, as in embedding gradients
};

[[nodiscard]] constexpr const char* to_string(distribution d) noexcept {
  switch (d) {
    case distribution::normal: return "normal";
    case distribution::laplace: return "laplace";
    case distribution::lognormal: return "lognormal";
  }
  return "unknown";
}

/// "4096x4096" or "1000" as a shape; std::invalid_argument naming the text if it is not a list of
/// 1 to shape::max_dims positive integers joined by 'x' whose product fits a size_t.
[[nodiscard]] inline bellows::shape parse_shape(std::string_view text) {
  const auto bad = [&](std::string_view why) {
    return std::invalid_argument(bellows::detail::concat("--shape '", text, "': ", why, " (expected e.g. 4096x4096)"));
  };
  bellows::shape s;
  std::size_t n = 1;
  std::size_t at = 0;
  while (true) {
    const std::size_t end = std::min(text.find('x', at), text.size());
    const std::string_view part = text.substr(at, end - at);
    if (part.empty()) throw bad("empty dimension");
    std::size_t d = 0;
    for (const char c : part) {
      if (c < '0' || c > '9') throw bad("dimensions are positive integers");
      const auto digit = static_cast<std::size_t>(c - '0');
      if (d > (std::numeric_limits<std::size_t>::max() - digit) / 10) throw bad("dimension too large");
      d = d * 10 + digit;
    }
    if (d == 0) throw bad("a dimension is 0");
    if (s.rank() == bellows::shape::max_dims)
      throw bad(bellows::detail::concat("more than ", bellows::shape::max_dims, " dimensions"));
    if (n > std::numeric_limits<std::size_t>::max() / d) throw bad("element count overflows size_t");
    n *= d;
    s.push_back(d);
    if (end == text.size()) break;
    at = end + 1;
  }
  return s;
}

/// n values of the distribution from the Philox stream keyed by `seed`. Value i depends only on
/// (distribution, seed, i): four values come from each Philox block, and signs, where the
/// distribution needs them, from bit 0 of a second stream.
[[nodiscard]] inline std::vector<float> synthetic_gradient(distribution d, std::size_t n, std::uint64_t seed,
                                                           cpu::executor& exec) {
  BELLOWS_EXPECTS(n / 4 < (std::uint64_t{1} << 32), "synthetic_gradient: ", n,
                  " elements exceed the 2^34 that one Philox stream can key");
  const philox::stream values{seed, 0, 0, philox::stream::shared};
  const philox::stream signs{seed, 0, 1, philox::stream::shared};
  std::vector<float> out(n);
  exec.for_chunks(n, cpu::elementwise_chunk, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t b = lo / 4; b * 4 < hi; ++b) {
      const philox::u32x4 w = values.block(static_cast<std::uint32_t>(b));
      float v[4];
      if (d == distribution::laplace) {
        for (int j = 0; j < 4; ++j) {
          const auto magnitude = static_cast<float>(-std::log(philox::to_uniform_nonzero(w.v[j])));
          v[j] = (w.v[j] & 1u) ? -magnitude : magnitude;
        }
      } else {
        const philox::normal_pair a = philox::to_normals(w.v[0], w.v[1]);
        const philox::normal_pair c = philox::to_normals(w.v[2], w.v[3]);
        v[0] = a.first, v[1] = a.second, v[2] = c.first, v[3] = c.second;
        if (d == distribution::lognormal) {
          const philox::u32x4 s = signs.block(static_cast<std::uint32_t>(b));
          for (int j = 0; j < 4; ++j) v[j] = (s.v[j] & 1u) ? -std::exp(v[j]) : std::exp(v[j]);
        }
      }
      for (std::size_t j = 0; j < 4 && 4 * b + j < hi; ++j) out[4 * b + j] = v[j];
    }
  });
  return out;
}

}  // namespace bellows::tool
