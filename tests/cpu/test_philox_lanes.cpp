// SPDX-License-Identifier: Apache-2.0
#include <bellows/cpu/philox_lanes.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace {

struct version {
  const char* name;
  bellows::cpu::philox_lanes_fn fn;
};

/// Every version this processor can run (the wider ones are skipped, with a message, elsewhere).
std::vector<version> runnable_versions() {
  std::vector<version> v{{"one block at a time", &bellows::cpu::detail::philox_lanes_scalar}};
#if BELLOWS_X86_VERSIONS
  if (__builtin_cpu_supports("avx2"))
    v.push_back({"AVX2", &bellows::cpu::detail::philox_lanes_avx2});
  else
    MESSAGE("no AVX2 here: that version is not checked");
  if (__builtin_cpu_supports("avx512f"))
    v.push_back({"AVX-512", &bellows::cpu::detail::philox_lanes_avx512});
  else
    MESSAGE("no AVX-512 here: that version is not checked");
#endif
  return v;
}

}  // namespace

TEST_CASE("philox_lanes: every version gives words 4 first .. 4 first + 63 of the stream, in order") {
  std::mt19937_64 rng(20261130);
  std::vector<bellows::philox::stream> streams{
      {0, 0, 0, 0},
      {~std::uint64_t{0}, ~std::uint32_t{0}, ~std::uint32_t{0}, bellows::philox::stream::shared}};
  for (int i = 0; i < 40; ++i)
    streams.push_back({rng(), static_cast<std::uint32_t>(rng()), static_cast<std::uint32_t>(rng()),
                       static_cast<std::uint32_t>(rng())});
  // Block counters near 2^32 wrap inside one call, as stream::block's 32-bit counter does.
  const std::vector<std::uint32_t> firsts{0, 1, 16, 12345, 0x7FFFFFF8u, 0xFFFFFFF0u, 0xFFFFFFF9u, 0xFFFFFFFFu};
  for (const version& v : runnable_versions()) {
    CAPTURE(v.name);
    long wrong = 0;
    for (const auto& s : streams)
      for (const std::uint32_t first : firsts) {
        std::uint32_t out[bellows::cpu::philox_lane_words];
        v.fn(s, first, out);
        for (std::size_t t = 0; t < bellows::cpu::philox_lane_words; ++t)
          wrong += out[t] != s.block(first + static_cast<std::uint32_t>(t / 4)).v[t % 4];
      }
    CHECK(wrong == 0);
  }
}

TEST_CASE("philox_lanes_for_this_cpu: the widest version the processor runs") {
  const bellows::cpu::philox_lanes_fn chosen = bellows::cpu::philox_lanes_for_this_cpu();
  const bool widest = chosen == runnable_versions().back().fn;
  CHECK(widest);
  const bool same = bellows::cpu::philox_lanes_for_this_cpu() == chosen;  // chosen once
  CHECK(same);
}
