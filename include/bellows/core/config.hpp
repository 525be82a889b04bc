// SPDX-License-Identifier: Apache-2.0
// Build-wide switches shared by host and device code.
#pragma once

#include <bit>

#if defined(__CUDACC__)
#define BELLOWS_HD __host__ __device__
#else
#define BELLOWS_HD
#endif

// Whether CPU kernels may add versions compiled for wider x86-64 vector units (AVX2, AVX-512)
// beside the baseline build, chosen at run time: GCC or Clang on x86-64.
// BELLOWS_TARGET_AVX2 marks the AVX2 build of such a kernel (nothing where there is none).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define BELLOWS_X86_VERSIONS 1
#define BELLOWS_TARGET_AVX2 [[gnu::target("avx2")]]
#else
#define BELLOWS_X86_VERSIONS 0
#define BELLOWS_TARGET_AVX2
#endif

static_assert(std::endian::native == std::endian::little,
              "bellows writes its wire format in the machine's byte order, which must be little-endian");
