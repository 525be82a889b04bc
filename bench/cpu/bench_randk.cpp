// SPDX-License-Identifier: Apache-2.0
// Rand-k on one thread, against a streaming read of the same bytes (x_floor). Names:
//   randk/<case>/<data>/<ratio>/n=<size>, case one of
//   plain     the draw of k indices and the gather of their values (PayloadCodec::encode)
//   residual  the same from m = g + e with the error-memory update (stage + commit; target
//             <= 3.5 x_floor at 1%: it reads g and e and writes e)
//   reduce    a whole step with residual feedback on one rank, shared mode (allreduce of k + 1)
// e.g. --benchmark_filter='randk/residual/.*/1%'
#include <bellows/compressors/randk.hpp>

#include "cpu/sparse_cases.hpp"

namespace {

using bellows::bench::sparse_case;

bellows::randk<> compressor(const sparse_case& c, bellows::feedback memory) {
  return bellows::randk<>({.ratio = c.ratio, .feedback = memory}, bellows::bench::one_thread());
}

const bool registered = [] {
  using bellows::feedback;
  bellows::bench::register_cases(
      "randk",
      {{"plain",
        [](auto& s, const sparse_case& c) { bellows::bench::encode_step(s, c, compressor(c, feedback::none), true); }},
       {"residual",
        [](auto& s, const sparse_case& c) { bellows::bench::feedback_step(s, c, compressor(c, feedback::residual)); }},
       {"reduce",
        [](auto& s, const sparse_case& c) { bellows::bench::reduce_step(s, c, compressor(c, feedback::residual)); }}});
  return true;
}();

}  // namespace
