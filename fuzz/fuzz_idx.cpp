// SPDX-License-Identifier: Apache-2.0
// The Fashion-MNIST example's IDX parser: the first byte picks the expected dimension count (1 to
// 3), the rest is a decompressed IDX file. It may refuse with bellows::error; when it accepts, the
// data must be exactly the product of the dimensions.
#include <cstdint>
#include <cstdlib>

#include "examples/fmnist/idx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::size_t dims = 1 + data[0] % 3;
  try {
    const fmnist::idx_array a = fmnist::parse_idx(std::span(data + 1, size - 1), dims, "fuzz");
    std::size_t count = 1;
    for (std::size_t d : a.dims) count *= d;
    if (a.dims.size() != dims || a.data.size() != count) std::abort();
  } catch (const bellows::error&) {
  }
  return 0;
}
