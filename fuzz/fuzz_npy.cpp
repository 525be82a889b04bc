// SPDX-License-Identifier: Apache-2.0
// bellows-bench's .npy reader: any bytes are either refused with npy::format_error or read into
// an array whose shape accounts for every data byte; a float32 array re-encodes to the same
// values. Any other exception, a crash or a sanitizer report is a bug.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "tools/bellows-bench/npy.hpp"

namespace npy = bellows::tool::npy;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  npy::array a;
  std::size_t offset = 0;
  try {
    offset = npy::parse_header(bytes, "fuzz.npy").data_offset;
    a = npy::parse(bytes, "fuzz.npy");
  } catch (const npy::format_error&) {
    return 0;
  }
  if (offset + a.values.size() * npy::item_bytes(a.stored) != size) std::abort();
  if (a.values.size() != a.shape.size() || a.values.empty()) std::abort();
  if (a.stored == npy::dtype::float32) {
    const npy::array back = npy::parse(npy::encode(a.shape, a.values), "re-encoded");
    if (!(back.shape == a.shape) || std::memcmp(back.values.data(), a.values.data(), a.values.size() * 4) != 0)
      std::abort();
  }
  return 0;
}
