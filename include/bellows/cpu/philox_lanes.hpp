// SPDX-License-Identifier: Apache-2.0
// Philox4x32-10 for sixteen consecutive blocks at once, for the CPU kernels that draw one random
// word per element (QSGD's stochastic rounding). The 64 words equal philox::stream::word bit for
// bit and come out in element order: out[t] is word 4 * first + t of the stream.
//
// On x86-64 the rounds are also written on GCC/Clang vector types, one block per 32-bit lane;
// each 32 x 32-bit product comes from the vector multiply of unsigned 32-bit halves (pmuludq),
// four products per instruction with AVX2 and eight with AVX-512. The baseline build knows only
// SSE2, so those two versions are compiled for their targets, and `philox_lanes_for_this_cpu()`
// picks the widest the processor runs, or else the portable version. The arithmetic is integer
// only: every version gives the same words.
//
// Measured on the 2-core AMD EPYC (AVX-512) these were written on, GCC 12 -O3, 2^24 words through
// the function pointer: portable 46-65 ms, AVX2 19-20 ms, AVX-512 10.3-11.6 ms.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "bellows/core/config.hpp"
#include "bellows/core/philox.hpp"

namespace bellows::cpu {

/// Blocks, and words, that one call of a philox_lanes function produces.
inline constexpr std::size_t philox_lane_blocks = 16;
inline constexpr std::size_t philox_lane_words = 4 * philox_lane_blocks;

/// Writes words 4 * first .. 4 * first + 63 of `s` to out[0 .. 63]. Block counters wrap at 2^32
/// as philox::stream::block's do.
using philox_lanes_fn = void (*)(const philox::stream& s, std::uint32_t first, std::uint32_t* out) noexcept;

namespace detail {

/// The portable version: one block after another. (Sixteen blocks side by side in plain loops,
/// as QSGD had them before, measured 87 ms for the 2^24 words; the vector form below at SSE2's
/// width, 34 ms against this version's 47-63, was not worth a third version.)
inline void philox_lanes_scalar(const philox::stream& s, std::uint32_t first, std::uint32_t* out) noexcept {
  for (std::uint32_t l = 0; l < philox_lane_blocks; ++l) {
    const philox::u32x4 block = s.block(first + l);
    std::memcpy(out + 4 * l, block.v, sizeof block.v);
  }
}

#if BELLOWS_X86_VERSIONS
/// Vectors of N 32-bit lanes and of N / 2 64-bit lanes, N = 8 (AVX2) or 16 (AVX-512): each
/// version works in its target's register width (GCC splits wider generic vectors badly).
template <std::size_t N>
struct lane_types;
template <>
struct lane_types<8> {
  typedef std::uint32_t u32 __attribute__((vector_size(32)));
  typedef std::uint64_t u64 __attribute__((vector_size(32)));
};
template <>
struct lane_types<16> {
  typedef std::uint32_t u32 __attribute__((vector_size(64)));
  typedef std::uint64_t u64 __attribute__((vector_size(64)));
};

/// x[j] * y[j] for 64-bit lanes, from the low 32-bit halves of each: the vector multiply of
/// unsigned 32-bit halves. Clang finds it in the product of the masked lanes; GCC (12) emits a
/// full 64-bit product, three multiplies and six shifts and adds, so under GCC the instruction is
/// named (it ignores the high halves itself).
template <std::size_t N, class U64 = typename lane_types<N>::u64>
[[gnu::always_inline]] inline void mul_low_halves(const U64& x, const U64& y, U64& product) noexcept {
#if !defined(__clang__)
  __asm__("vpmuludq %2, %1, %0" : "=v"(product) : "v"(x), "v"(y));
#else
  constexpr std::uint64_t low = 0xFFFFFFFFu;
  product = (x & low) * (y & low);
#endif
}

/// out[l] = a[l] where l is even, b[l] where it is odd (one blend instruction).
template <std::size_t N, class U32 = typename lane_types<N>::u32, std::size_t... T>
[[gnu::always_inline]] inline void even_odd(const U32& a, const U32& b, U32& out, std::index_sequence<T...>) noexcept {
  out = __builtin_shufflevector(a, b, (T % 2 == 0 ? T : N + T)...);
}

/// The 64-bit products a[l] * m of every lane, split into high and low words. Lane 2j is the
/// low half of 64-bit lane j (little-endian), lane 2j + 1 its high half.
template <std::size_t N, class U32 = typename lane_types<N>::u32, class U64 = typename lane_types<N>::u64>
[[gnu::always_inline]] inline void mulhilo(const U32& a, std::uint32_t m, U32& hi, U32& lo) noexcept {
  const auto wide = (U64)a;  // a vector cast between equal sizes reinterprets the bits
  const U64 multiplier = U64{} + std::uint64_t{m};
  U64 even, odd;
  mul_low_halves<N>(wide, multiplier, even);       // lanes 0, 2, 4, ...
  mul_low_halves<N>(wide >> 32, multiplier, odd);  // lanes 1, 3, 5, ...
  constexpr auto lanes = std::make_index_sequence<N>{};
  even_odd<N>((U32)(even >> 32), (U32)odd, hi, lanes);
  even_odd<N>((U32)even, (U32)(odd << 32), lo, lanes);
}

/// Shuffle indices of the transposition into element order. Pairing: lane t of the result
/// takes block `half * N / 2 + t / 2` of c_(t % 2) from the concatenation (c_even, c_odd).
constexpr int pair_index(std::size_t n, std::size_t half, std::size_t t) noexcept {
  return static_cast<int>(half * n / 2 + t / 2 + (t % 2) * n);
}
/// Quads: lane t of output j (0 or 1) of a half holds word t % 4 of block j * N / 4 + t / 4,
/// taken from the concatenation (pairs of words 0 and 1, pairs of words 2 and 3).
constexpr int quad_index(std::size_t n, std::size_t j, std::size_t t) noexcept {
  const std::size_t b = j * n / 4 + t / 4, k = t % 4;
  return static_cast<int>(k < 2 ? 2 * b + k : n + 2 * b + k - 2);
}

/// The body every version shares, at its register width N (inlined into each version, so each
/// is compiled for its target). T... is 0 .. N - 1.
template <std::size_t N, std::size_t... T>
[[gnu::always_inline]] inline void philox_lanes_body(const philox::stream& s, std::uint32_t first, std::uint32_t* out,
                                                     std::index_sequence<T...>) noexcept {
  using U32 = typename lane_types<N>::u32;
  const U32 lane = {static_cast<std::uint32_t>(T)...};
  for (std::size_t group = 0; group < philox_lane_blocks / N; ++group) {
    U32 c0 = lane + (first + static_cast<std::uint32_t>(group * N));
    U32 c1 = U32{} + s.step;
    U32 c2 = U32{} + s.layer;
    U32 c3 = U32{} + s.rank;
    auto k0 = static_cast<std::uint32_t>(s.seed);
    auto k1 = static_cast<std::uint32_t>(s.seed >> 32);
    for (int round = 0; round < 10; ++round) {
      if (round > 0) {
        k0 += philox::detail::weyl0;
        k1 += philox::detail::weyl1;
      }
      U32 hi0, lo0, hi1, lo1;
      mulhilo<N>(c0, philox::detail::mul0, hi0, lo0);
      mulhilo<N>(c2, philox::detail::mul1, hi1, lo1);
      c0 = hi1 ^ c1 ^ k0;
      c1 = lo1;
      c2 = hi0 ^ c3 ^ k1;
      c3 = lo0;
    }
    // Lane b of c_k is word k of block b: interleave into element order, N / 4 blocks per vector.
    const U32 words[4] = {
        __builtin_shufflevector(__builtin_shufflevector(c0, c1, pair_index(N, 0, T)...),
                                __builtin_shufflevector(c2, c3, pair_index(N, 0, T)...), quad_index(N, 0, T)...),
        __builtin_shufflevector(__builtin_shufflevector(c0, c1, pair_index(N, 0, T)...),
                                __builtin_shufflevector(c2, c3, pair_index(N, 0, T)...), quad_index(N, 1, T)...),
        __builtin_shufflevector(__builtin_shufflevector(c0, c1, pair_index(N, 1, T)...),
                                __builtin_shufflevector(c2, c3, pair_index(N, 1, T)...), quad_index(N, 0, T)...),
        __builtin_shufflevector(__builtin_shufflevector(c0, c1, pair_index(N, 1, T)...),
                                __builtin_shufflevector(c2, c3, pair_index(N, 1, T)...), quad_index(N, 1, T)...)};
    std::memcpy(out + group * 4 * N, words, sizeof words);
  }
}

[[gnu::target("avx2")]] inline void philox_lanes_avx2(const philox::stream& s, std::uint32_t first,
                                                      std::uint32_t* out) noexcept {
  philox_lanes_body<8>(s, first, out, std::make_index_sequence<8>{});
}

[[gnu::target("avx512f")]] inline void philox_lanes_avx512(const philox::stream& s, std::uint32_t first,
                                                           std::uint32_t* out) noexcept {
  philox_lanes_body<16>(s, first, out, std::make_index_sequence<16>{});
}
#endif

}  // namespace detail

/// The widest version this processor runs (chosen once).
[[nodiscard]] inline philox_lanes_fn philox_lanes_for_this_cpu() noexcept {
  static const philox_lanes_fn chosen = [] {
#if BELLOWS_X86_VERSIONS
    if (__builtin_cpu_supports("avx512f")) return &detail::philox_lanes_avx512;
    if (__builtin_cpu_supports("avx2")) return &detail::philox_lanes_avx2;
#endif
    return &detail::philox_lanes_scalar;
  }();
  return chosen;
}

}  // namespace bellows::cpu
