// SPDX-License-Identifier: Apache-2.0
// Top-k on one thread, against a streaming read of the same bytes (x_floor), with the
// std::nth_element and std::sort baselines in the same run. Names:
//   topk/<case>/<data>/<ratio>/n=<size>, case one of
//   exact     selection and encoding of g (PayloadCodec::encode; target <= 3.0 x_floor)
//   residual  the same from m = g + e with the error-memory update (stage + commit; <= 4.5)
//   reduce    a whole step with residual feedback on one rank (selection, payload, output)
//   leader    the same step by the cyclic leader's exchange, on its leader (the one rank leads):
//             memory, selection, index list, values at it, output
//   scatter   the same step by the scatter exchange on one rank, which owns the one chunk: the
//             worker's selection, the owner's average, selection again and memory, output (at W
//             ranks each rank's owner part is a W-th of that)
//   nth_element, sort   baselines: |x| copied, then the k-th largest found
// e.g. --benchmark_filter='topk/(exact|nth_element)/normal/1%/n=2\^24'
#include <bellows/compressors/topk.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "cpu/sparse_cases.hpp"

namespace {

using bellows::bench::sparse_case;

bellows::topk<> compressor(const sparse_case& c, bellows::feedback memory,
                           bellows::exchange how = bellows::exchange::gather) {
  return bellows::topk<>({.ratio = c.ratio, .feedback = memory, .exchange = how}, bellows::bench::one_thread());
}

/// |x| into a scratch copy, then the k-th largest of it by nth_element or by a full sort.
void baseline(benchmark::State& state, const sparse_case& c, bool sort) {
  const std::vector<float>& g = c.grad();
  const auto k = static_cast<std::ptrdiff_t>(std::ceil(c.ratio * static_cast<double>(c.n)));
  std::vector<float> magnitude(c.n);
  bellows::bench::time_loop(state, c, [&] {
    std::transform(g.begin(), g.end(), magnitude.begin(), [](float v) { return std::abs(v); });
    if (sort)
      std::sort(magnitude.begin(), magnitude.end(), std::greater<>());
    else
      std::nth_element(magnitude.begin(), magnitude.begin() + (k - 1), magnitude.end(), std::greater<>());
    benchmark::DoNotOptimize(magnitude[static_cast<std::size_t>(k - 1)]);
  });
}

const bool registered = [] {
  using bellows::feedback;
  bellows::bench::register_cases(
      "topk",
      {{"exact",
        [](auto& s, const sparse_case& c) { bellows::bench::encode_step(s, c, compressor(c, feedback::none), false); }},
       {"residual",
        [](auto& s, const sparse_case& c) { bellows::bench::feedback_step(s, c, compressor(c, feedback::residual)); }},
       {"reduce",
        [](auto& s, const sparse_case& c) { bellows::bench::reduce_step(s, c, compressor(c, feedback::residual)); }},
       {"leader",
        [](auto& s, const sparse_case& c) {
          bellows::bench::reduce_step(s, c, compressor(c, feedback::residual, bellows::exchange::leader));
        }},
       {"scatter",
        [](auto& s, const sparse_case& c) {
          bellows::bench::reduce_step(s, c, compressor(c, feedback::residual, bellows::exchange::scatter));
        }},
       {"nth_element", [](auto& s, const sparse_case& c) { baseline(s, c, false); }},
       {"sort", [](auto& s, const sparse_case& c) { baseline(s, c, true); }}});
  return true;
}();

}  // namespace
