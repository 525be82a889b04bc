// SPDX-License-Identifier: Apache-2.0
// Top-k's leader list (plan/index_list.hpp) as the allreduce might deliver it from a faulty or
// hostile rank: the first two bytes choose the layer size, the third k, the rest is the summed
// list (floats, zeros past the input's end). The step either raises bellows::wire_error and
// leaves the gradient and the state as they were, or is non_finite and leaves them too, or is
// ok with a finite output; anything else (another exception, a crash, a sanitizer report) is a
// bug.
#include <bellows/compressors/topk.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

namespace {

/// One rank whose first allreduce returns the fuzzer's list, and whose others sum nothing.
struct replaying {
  std::span<const std::uint8_t> list;
  std::size_t calls = 0;
  [[nodiscard]] static std::size_t rank() { return 0; }
  [[nodiscard]] static std::size_t size() { return 1; }
  void allreduce_sum(std::span<float> v) {
    if (calls++ != 0) return;
    std::ranges::fill(v, 0.0f);
    std::memcpy(v.data(), list.data(), std::min(list.size(), v.size_bytes()));
  }
  static void allgather(std::span<const std::byte> /*mine*/, bellows::gather_buffer& /*out*/) { std::abort(); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  const std::size_t n = (std::size_t{data[0]} | std::size_t{data[1]} << 8) % 4097;
  static bellows::cpu::executor exec(1);
  bellows::topk<> c({.k = 1 + data[2] % 16, .exchange = bellows::exchange::leader}, exec);
  auto st = c.make_state({0, "fuzz", bellows::shape{std::max<std::size_t>(n, 1)}});
  std::vector<float> g(st.layer.size());
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 7) - 3.0f;
  const std::vector<float> before = g;
  replaying coll{{data + 3, size - 3}};
  const auto untouched = [&] {
    if (g != before || st.step != 0) std::abort();
    for (const float e : st.memory.values())
      if (e != 0.0f) std::abort();
  };
  try {
    const bellows::reduce_result r = c.reduce(st, g, coll);
    if (r.status == bellows::step_status::non_finite) {
      untouched();
    } else {
      for (const float v : g)
        if (!std::isfinite(v)) std::abort();
    }
  } catch (const bellows::wire_error&) {
    untouched();
  }
  return 0;
}
