// SPDX-License-Identifier: Apache-2.0
// Running a CPU kernel in the widest instruction set that keeps its results. The baseline x86-64
// build knows only SSE2 (four floats a step); `run_widest(body)` runs `body` compiled a second
// time for AVX2 (eight) when the processor has it: GCC's flatten inlines everything `body` calls
// into that copy. (Clang 14 inlines only the direct call, so there the kernels mostly keep their
// baseline code: same results, no gain.) AVX2 brings no fused multiply-add, so each product and
// sum rounds as in the baseline, and lane orders are fixed by the source: both copies give the
// same bits (tests/cpu/test_skinny_gemm.cpp and test_quantize.cpp compare them, and fail when the
// AVX2 copy is allowed FMA). Off x86-64 GCC/Clang, and under nvcc, `body` simply runs.
#pragma once

#include "bellows/core/config.hpp"

namespace bellows::cpu {

namespace detail {

template <class Body>
[[gnu::flatten]] BELLOWS_TARGET_AVX2 inline void run_avx2(const Body& body) {
  body();
}

}  // namespace detail

/// Calls body() in its AVX2 build where the processor runs AVX2, else in the baseline build.
template <class Body>
inline void run_widest(const Body& body) {
#if BELLOWS_X86_VERSIONS
  if (__builtin_cpu_supports("avx2")) {
    detail::run_avx2(body);
    return;
  }
#endif
  body();
}

}  // namespace bellows::cpu
