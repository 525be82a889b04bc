// SPDX-License-Identifier: Apache-2.0
#include <bellows/compressors/qsgd.hpp>

#include <algorithm>

#include "fuzz/payload_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static bellows::cpu::executor exec(1);
  static const bellows::qsgd<> codec({.bits = 4, .bucket = 64}, exec);
  return bellows::fuzzing::decode_payload(
      codec,
      [](std::size_t n) {
        return codec.make_state({0, "fuzz", bellows::shape{std::max<std::size_t>(n, 1)}});
      },
      data, size);
}
