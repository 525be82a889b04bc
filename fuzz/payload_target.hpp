// SPDX-License-Identifier: Apache-2.0
// The body of every payload fuzz target: the first two bytes choose the layer size, the rest is
// the payload a remote rank might have sent. A decoder may refuse it with bellows::wire_error;
// anything else (another exception, a crash, a sanitizer report, a non-finite value written into
// the gradient without the non-finite status) is a bug.
#pragma once

#include <bellows/core/error.hpp>
#include <bellows/core/traffic.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace bellows::fuzzing {

template <class Codec, class MakeState>
int decode_payload(const Codec& codec, MakeState&& make_state, const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::size_t n = (std::size_t{data[0]} | std::size_t{data[1]} << 8) % 4097;
  auto st = make_state(n);
  // Collectives hand blocks at 8-byte aligned offsets.
  std::vector<std::uint64_t> words((size - 2 + 7) / 8);
  if (size > 2) std::memcpy(words.data(), data + 2, size - 2);
  const std::span<const std::byte> payload = std::as_bytes(std::span(words)).first(size - 2);
  std::vector<float> acc(n, 1.0f);
  try {
    const step_status checked = codec.validate(st, payload);
    const step_status decoded = codec.decode_add(st, payload, acc);
    if (checked != decoded) std::abort();
    if (decoded == step_status::ok) {
      for (float v : acc)
        if (!std::isfinite(v)) std::abort();
    } else {
      for (float v : acc)
        if (v != 1.0f) std::abort();  // a flagged payload must leave the output untouched
    }
  } catch (const wire_error&) {
    for (float v : acc)
      if (v != 1.0f) std::abort();  // refused before anything was used
  }
  return 0;
}

}  // namespace bellows::fuzzing
