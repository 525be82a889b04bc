// SPDX-License-Identifier: Apache-2.0
// The gradients bellows-bench replays: one per .npy file given, or one synthetic, all of one shape.
#pragma once

#include <cmath>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bellows-bench/npy.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"

namespace bellows::tool {

/// Input that is well-formed but cannot be measured: files of different shapes, NaN or Inf values.
class input_error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Step t of a run uses gradient t mod size(): a sequence of files is replayed in order.
struct gradient_set {
  bellows::shape shape;
  std::vector<std::vector<float>> gradients;
  std::vector<std::string> sources;  ///< file names, or "synthetic <distribution>"
  std::vector<std::string> dtypes;   ///< how each source was stored ("float32", "float16")

  [[nodiscard]] std::size_t size() const noexcept { return gradients.size(); }
  [[nodiscard]] std::span<const float> at(std::size_t step) const { return gradients[step % size()]; }

  /// Adds one gradient; input_error if its shape differs from the first's or a value is not finite.
  void add(std::string source, std::string dtype, const bellows::shape& shp, std::vector<float> values,
           cpu::executor& exec) {
    if (!gradients.empty() && !(shp == shape))
      throw input_error(bellows::detail::concat(source, ": shape ", shp.to_string(), " differs from ", sources.front(),
                                                "'s ", shape.to_string(), "; every step of a run has the same shape"));
    if (!cpu::all_finite(exec, values)) {
      std::size_t i = 0;
      while (std::isfinite(values[i])) ++i;
      throw input_error(bellows::detail::concat(source, ": element ", i, " is ", values[i],
                                                "; a trainer skips such a step, so there is nothing to measure"));
    }
    shape = shp;
    gradients.push_back(std::move(values));
    sources.push_back(std::move(source));
    dtypes.push_back(std::move(dtype));
  }
};

/// Reads and validates every file (npy::format_error or input_error naming the file on failure).
[[nodiscard]] inline gradient_set load_files(const std::vector<std::string>& paths, cpu::executor& exec) {
  gradient_set set;
  for (const std::string& path : paths) {
    npy::array a = npy::read(path);
    set.add(path, npy::to_string(a.stored), a.shape, std::move(a.values), exec);
  }
  return set;
}

}  // namespace bellows::tool
