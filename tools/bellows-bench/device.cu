// SPDX-License-Identifier: Apache-2.0
// bellows-bench's cuda backend (bellows-bench/device.hpp).
#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bellows-bench/device.hpp"
#include "bellows-bench/measure.hpp"
#include "bellows/compressors/list.hpp"
#include "bellows/core/error.hpp"
#include "bellows/cuda/buffer.cuh"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/executor.cuh"
#include "bench/cuda/device_read.cuh"
#include "bench/cuda/one_rank.cuh"

namespace bellows::tool {

namespace {

/// Calls f(descriptor) for the method called `name`, which must be on the device.
template <class F>
void on_device_method(std::string_view name, F&& f) {
  visit_method(compressor_methods{}, name, [&](auto m) {
    using M = typename decltype(m)::type;
    if constexpr (M::on_device)
      f(m);
    else
      fail(M::name, " is not on the device (--backend cpu measures it)");
  });
}

template <class M>
method_result measure(const typename M::params& p, const run_request& req) {
  const run_settings& s = req.settings;
  BELLOWS_EXPECTS(s.workers == 1, "--backend cuda measures one rank (--workers 1), got --workers ", s.workers);
  const std::size_t n = req.layer.size(), calls = calls_per_method(s);
  cuda::executor exec;  // the default stream, as bench::one_rank's
  bench::one_rank coll;
  auto compressor = M::make(p, exec);
  auto state = compressor.make_state(req.layer);
  method_result res;
  if constexpr (requires { compressor.compresses(state); }) res.compressed = compressor.compresses(state);
  cuda::device_buffer<float> buf(n);
  std::vector<float> out(n);
  tally record(req, res);
  bench::event_timer timer;
  for (std::size_t call = 0; call < calls; ++call) {
    const std::span<const float> g = req.input.at(call);
    BELLOWS_CUDA_CHECK(cudaMemcpy(buf.data(), g.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    timer.start();
    const reduce_result r = compressor.reduce(state, buf.span(), coll);
    const double t = timer.stop();
    if (call > 0) res.call_seconds.push_back(t);
    BELLOWS_CUDA_CHECK(cudaMemcpy(out.data(), buf.data(), n * sizeof(float), cudaMemcpyDeviceToHost));
    record.add(call, g, out, r);
  }
  record.finish();
  BELLOWS_CUDA_CHECK(cudaMemcpy(buf.data(), req.input.at(0).data(), n * sizeof(float), cudaMemcpyHostToDevice));
  res.floor_seconds = bench::device_read_seconds(buf.data(), n < 4 ? n : n / 4 * 4);
  return res;
}

}  // namespace

bool device_present() { return cuda::device_count() > 0; }

void check_on_device(std::string_view name, const method_settings& settings, const layer_info& layer) {
  on_device_method(name, [&](auto m) {
    using M = typename decltype(m)::type;
    cuda::executor exec;
    auto compressor = M::make(M::configure(settings), exec);
    (void)compressor.make_state(layer);
  });
}

method_result measure_on_device(std::string_view name, const method_settings& settings, const run_request& req) {
  method_result res;
  on_device_method(name, [&](auto m) {
    using M = typename decltype(m)::type;
    res = measure<M>(M::configure(settings), req);
  });
  return res;
}

}  // namespace bellows::tool
