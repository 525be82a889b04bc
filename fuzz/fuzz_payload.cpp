// SPDX-License-Identifier: Apache-2.0
// The payload decoder of every compressor of compressors/list.hpp that models PayloadCodec. The
// input is two bytes then a payload (fuzz/payload_target.hpp); the codec id in the payload's
// header chooses the compressor (an id of none: the id modulo their number), and the high bits
// of the second byte choose which of its example configurations decodes it.
#include <bellows/compressors/list.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "fuzz/payload_target.hpp"

namespace {

using decoder = int (*)(const std::uint8_t*, std::size_t);

/// Decodes with example I of method M.
template <class M, std::size_t I>
int decode_with(const std::uint8_t* data, std::size_t size) {
  static bellows::cpu::executor exec(1);
  static const auto codec = M::make(M::examples[I], exec);
  return bellows::fuzzing::decode_payload(
      codec,
      [](std::size_t n) {
        return codec.make_state({0, "fuzz", bellows::shape{std::max<std::size_t>(n, 1)}});
      },
      data, size);
}

struct target {
  std::uint8_t codec;
  std::size_t examples;
  std::array<decoder, 8> decode;
};

template <class M, std::size_t... I>
target target_of(std::index_sequence<I...>) {
  static_assert(sizeof...(I) <= 8, "fuzz_payload: more than 8 examples of one method");
  return {M::codec.id, sizeof...(I), {&decode_with<M, I>...}};
}

/// The listed methods whose compressor decodes payloads.
template <class... Methods>
std::vector<target> targets_of(bellows::method_list<Methods...>) {
  std::vector<target> out;
  (
      [&] {
        if constexpr (bellows::PayloadCodec<typename Methods::template compressor<bellows::cpu::executor>>)
          out.push_back(target_of<Methods>(std::make_index_sequence<std::size(Methods::examples)>{}));
      }(),
      ...);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::vector<target> targets = targets_of(bellows::compressor_methods{});
  const std::uint8_t id = size > 2 + 6 ? data[2 + 6] : 0;
  const auto found = std::ranges::find(targets, id, &target::codec);
  const target& t = found != targets.end() ? *found : targets[id % targets.size()];
  return t.decode[(size > 1 ? data[1] >> 4 : 0) % t.examples](data, size);
}
