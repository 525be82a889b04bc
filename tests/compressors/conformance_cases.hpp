// SPDX-License-Identifier: Apache-2.0
// The compressors the conformance suite runs, one case type each: how to build it with an
// executor. A new compressor joins the suite with a case here and a name in test_conformance.cpp.
#pragma once

#include <bellows/compressors/identity.hpp>
#include <bellows/compressors/powersgd.hpp>
#include <bellows/compressors/qsgd.hpp>
#include <bellows/cpu/executor.hpp>

namespace bellows::testing {

struct identity_case {
  using compressor = bellows::identity<>;
  static compressor make(cpu::executor& exec) { return compressor(exec); }
};

struct powersgd_case {
  using compressor = bellows::powersgd<>;
  static compressor make(cpu::executor& exec) { return compressor({.rank = 2}, exec); }
};

struct qsgd_case {
  using compressor = bellows::qsgd<>;
  static compressor make(cpu::executor& exec) {
    return compressor({.bits = 4, .bucket = 100}, exec);
  }
};

}  // namespace bellows::testing
