// SPDX-License-Identifier: Apache-2.0
// Build-wide switches shared by host and device code.
#pragma once

#include <bit>

#if defined(__CUDACC__)
#define BELLOWS_HD __host__ __device__
#else
#define BELLOWS_HD
#endif

static_assert(std::endian::native == std::endian::little,
              "bellows writes its wire format in the machine's byte order, which must be little-endian");
