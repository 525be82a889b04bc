// SPDX-License-Identifier: Apache-2.0
// CPU kernels that touch each element once: finiteness check, fill, scaling, sums and differences.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

#include "bellows/core/error.hpp"
#include "bellows/cpu/executor.hpp"

#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#endif

namespace bellows::cpu {

/// Elements per task of the elementwise kernels; fixed, so results never depend on threads.
inline constexpr std::size_t elementwise_chunk = std::size_t{1} << 16;

/// 1 for NaN and +-Inf (an exponent field of all ones), else 0.
[[nodiscard]] inline std::uint32_t non_finite_bit(float v) noexcept {
  return static_cast<std::uint32_t>((std::bit_cast<std::uint32_t>(v) & 0x7F800000u) == 0x7F800000u);
}

/// Elements of the tile, on the stack, in which the kernels that average W payloads sum before
/// they write out (16 KiB: the first-level cache holds it).
inline constexpr std::size_t average_tile = std::size_t{1} << 12;

namespace detail {

/// x[i] = x[i] / w for len elements, w >= 1 a count of ranks: nothing for 1 (x / 1 is x), a
/// product with the exact reciprocal for a power of two (x / 2^j and x * 2^-j round the same
/// real number, so they are the same float, subnormals included), else a division.
inline void divide_by_count(float* x, std::size_t len, std::size_t w) noexcept {
  if (w == 1) return;
  const auto d = static_cast<float>(w);
  if (std::has_single_bit(w)) {
    const float inverse = 1.0f / d;
    for (std::size_t i = 0; i < len; ++i) x[i] *= inverse;
  } else {
    for (std::size_t i = 0; i < len; ++i) x[i] /= d;
  }
}

}  // namespace detail

/// True when no element is NaN or +-Inf.
[[nodiscard]] inline bool all_finite(executor& exec, std::span<const float> x) {
  std::atomic<bool> bad{false};
  exec.for_chunks(x.size(), elementwise_chunk, [&](std::size_t lo, std::size_t hi) {
    // Sixteen independent lanes, so that the vectorised loop is not one long chain of ORs.
    std::uint32_t any[16] = {};
    std::size_t i = lo;
    for (; i + 16 <= hi; i += 16)
      for (std::size_t j = 0; j < 16; ++j) any[j] |= non_finite_bit(x[i + j]);
    for (; i < hi; ++i) any[0] |= non_finite_bit(x[i]);
    std::uint32_t all = 0;
    for (const std::uint32_t a : any) all |= a;
    if (all != 0) bad.store(true, std::memory_order_relaxed);
  });
  return !bad.load(std::memory_order_relaxed);
}

/// Sets *flag to 1 when an element of x is NaN or +-Inf and leaves it otherwise, so that one
/// flag can collect several checks; the form of cuda::flag_non_finite whose flag is a float of
/// an allreduce (the Synchronizer's finiteness vote).
inline void flag_non_finite(executor& exec, std::span<const float> x, float* flag) {
  if (!all_finite(exec, x)) *flag = 1.0f;
}

/// *out = 1 when *flag (a kernel's non-finite word) is set, else 0: the float a vote sums, as
/// cuda::flag_to_float writes it.
inline void flag_to_float(executor& /*exec*/, const unsigned* flag, float* out) noexcept {
  *out = *flag != 0 ? 1.0f : 0.0f;
}

/// out[i] = x[i] (same lengths).
inline void copy(executor& exec, std::span<float> out, std::span<const float> x) {
  BELLOWS_EXPECTS(out.size() == x.size(), "copy: lengths differ, ", out.size(), " and ", x.size());
  exec.for_chunks(out.size(), elementwise_chunk,
                  [&](std::size_t lo, std::size_t hi) { std::copy(x.data() + lo, x.data() + hi, out.data() + lo); });
}

/// Error feedback's compensation m = g + e (same lengths; m may alias g or e) in the pass that
/// checks it: *flag is set to 1 when an element of m is NaN or +-Inf, and left otherwise.
inline void compensate(executor& exec, std::span<float> m, std::span<const float> g, std::span<const float> e,
                       float* flag) {
  BELLOWS_EXPECTS(m.size() == g.size() && g.size() == e.size(), "compensate: lengths differ, ", m.size(), ", ",
                  g.size(), " and ", e.size());
  std::atomic<bool> bad{false};
  exec.for_chunks(m.size(), elementwise_chunk, [&](std::size_t lo, std::size_t hi) {
    std::uint32_t any = 0;
    for (std::size_t i = lo; i < hi; ++i) {
      m[i] = g[i] + e[i];
      any |= non_finite_bit(m[i]);
    }
    if (any != 0) bad.store(true, std::memory_order_relaxed);
  });
  if (bad.load(std::memory_order_relaxed)) *flag = 1.0f;
}

/// x[i] = value for every element.
inline void fill(executor& exec, std::span<float> x, float value) {
  exec.for_chunks(x.size(), elementwise_chunk,
                  [&](std::size_t lo, std::size_t hi) { std::fill(x.data() + lo, x.data() + hi, value); });
}

/// As fill(exec, x, value), unless *skip (a float the step wrote before) is not 0.
inline void fill(executor& exec, std::span<float> x, float value, const float* skip) {
  if (*skip == 0.0f) fill(exec, x, value);
}

/// x[i] = x[i] / d for every element (division, not multiplication by 1/d, as docs/spec.md#averages asks).
inline void divide(executor& exec, std::span<float> x, float d) {
  exec.for_chunks(x.size(), elementwise_chunk, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) x[i] /= d;
  });
}

/// out[i] = x[i] / d for every element (same lengths; writes out, as add and subtract do); a copy
/// when d is 1 (x / 1 is x).
inline void divide(executor& exec, std::span<float> out, std::span<const float> x, float d) {
  BELLOWS_EXPECTS(out.size() == x.size(), "divide: lengths differ, ", out.size(), " and ", x.size());
  exec.for_chunks(out.size(), elementwise_chunk, [&](std::size_t lo, std::size_t hi) {
    if (d == 1.0f) {
      if (out.data() != x.data()) std::copy(x.data() + lo, x.data() + hi, out.data() + lo);
      return;
    }
    std::size_t i = lo;
#if defined(__SSE2__) || defined(_M_X64)
    const __m128 by = _mm_set1_ps(d);  // divps rounds each quotient as divss does
    for (; i + 4 <= hi; i += 4) _mm_storeu_ps(out.data() + i, _mm_div_ps(_mm_loadu_ps(x.data() + i), by));
#endif
    for (; i < hi; ++i) out[i] = x[i] / d;
  });
}

/// As divide(exec, out, x, d), unless *skip (a float the step wrote before, such as a summed
/// verdict) is not 0: then out is left as it is. The phases of a step gate their last writes so.
inline void divide(executor& exec, std::span<float> out, std::span<const float> x, float d, const float* skip) {
  if (*skip == 0.0f) divide(exec, out, x, d);
}

/// x[i] = x[i] * s for every element.
inline void scale(executor& exec, std::span<float> x, float s) {
  exec.for_chunks(x.size(), elementwise_chunk, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) x[i] *= s;
  });
}

/// x[i] = x[i] + y[i] (same lengths).
inline void add_into(executor& exec, std::span<float> x, std::span<const float> y) {
  BELLOWS_EXPECTS(x.size() == y.size(), "add_into: lengths differ, ", x.size(), " and ", y.size());
  exec.for_chunks(x.size(), elementwise_chunk, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) x[i] += y[i];
  });
}

/// out[i] = a[i] + b[i] (same lengths; out may alias a or b).
inline void add(executor& exec, std::span<float> out, std::span<const float> a, std::span<const float> b) {
  BELLOWS_EXPECTS(out.size() == a.size() && a.size() == b.size(), "add: lengths differ, ", out.size(), ", ", a.size(),
                  " and ", b.size());
  exec.for_chunks(out.size(), elementwise_chunk, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) out[i] = a[i] + b[i];
  });
}

/// out[i] = a[i] - b[i] (same lengths; out may alias a).
inline void subtract(executor& exec, std::span<float> out, std::span<const float> a, std::span<const float> b) {
  BELLOWS_EXPECTS(out.size() == a.size() && a.size() == b.size(), "subtract: lengths differ, ", out.size(), ", ",
                  a.size(), " and ", b.size());
  exec.for_chunks(out.size(), elementwise_chunk, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) out[i] = a[i] - b[i];
  });
}

}  // namespace bellows::cpu
