// SPDX-License-Identifier: Apache-2.0
// Replaces the global operator new of the test executable that includes this header (include it
// in one .cpp of that executable only) and counts allocations per thread, so a test can assert
// that a steady-state step allocates nothing.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>

namespace bellows::testing {
inline thread_local std::size_t allocations = 0;
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t size) {
  ++bellows::testing::allocations;
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
