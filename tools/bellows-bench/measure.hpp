// SPDX-License-Identifier: Apache-2.0
// Measuring one compressor on a gradient set: W simulated ranks (threads of a local collective),
// a sequence of reduce calls through one per-rank state, the traffic and distortion of the first
// `steps` calls, and the time of every call after the first.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "bellows-bench/input.hpp"
#include "bellows-bench/metrics.hpp"
#include "bellows-bench/progress.hpp"
#include "bellows/collectives/local.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bench/stream_floor.hpp"

namespace bellows::tool {

/// How a method is run.
struct run_settings {
  std::size_t steps = 1;     ///< calls whose traffic and distortion are measured
  std::size_t workers = 1;   ///< simulated ranks; each holds the same gradient, unless `own`
  std::size_t repeats = 5;   ///< at least this many timed calls (the run goes on past `steps` if needed)
  bool keep_output = false;  ///< keep the averaged result of the last measured step
  bool own = false;          ///< each worker its own gradient: worker w at call t replays input t W + w
};

/// The input gradient of `worker` at `call`.
[[nodiscard]] inline std::span<const float> input_of(const gradient_set& in, const run_settings& s, std::size_t call,
                                                     std::size_t worker) {
  return in.at(s.own ? call * s.workers + worker : call);
}

/// The number of reduce calls a method makes: one untimed warm-up, then at least `repeats` timed.
[[nodiscard]] inline std::size_t calls_per_method(const run_settings& s) noexcept {
  return std::max(s.steps, s.repeats + 1);
}

/// What a method did, from rank 0's point of view (every rank sends alike and gets the same result).
struct method_result {
  traffic sent{};                     ///< summed over the measured steps, one rank
  std::vector<double> rel_error;      ///< per measured step: ||g_t - out_t|| / ||g_t|| (g_t: the workers' mean)
  std::vector<double> cosine;         ///< per measured step
  double cumulative_rel_error = 0.0;  ///< ||sum_t g_t - sum_t out_t|| / ||sum_t g_t||
  std::vector<double> call_seconds;   ///< every timed call: the slowest rank's time
  double floor_seconds = 0.0;         ///< one streaming read of the input, one thread
  std::size_t non_finite_steps = 0;   ///< measured steps that returned step_status::non_finite
  bool compressed = true;             ///< false when the method's rule left this shape uncompressed
  std::vector<float> output;          ///< the last measured step's result, if kept
};

/// Everything a measurement reads.
struct run_request {
  const gradient_set& input;
  const layer_info& layer;
  const run_settings& settings;
  cpu::executor& exec;
  progress& bar;
};

/// What rank 0 records of each call: the traffic, status and distortion of the measured calls,
/// their running sums for the cumulative error, and the last measured output. Shared by the CPU
/// measurement below and the device one (bellows-bench/device.cu).
class tally {
public:
  tally(const run_request& req, method_result& res) : req_(&req), res_(&res), cumulative_(req.settings.steps > 1) {
    sum_grad_.resize(cumulative_ ? req.layer.size() : 0);
    sum_out_.resize(cumulative_ ? req.layer.size() : 0);
  }

  /// Call `call` turned input g into out with result r.
  void add(std::size_t call, std::span<const float> g, std::span<const float> out, const reduce_result& r) {
    req_->bar.advance();
    if (call >= req_->settings.steps) return;
    res_->sent += r.sent;
    if (r.status != step_status::ok) ++res_->non_finite_steps;
    const distortion d = compare(g, out);
    res_->rel_error.push_back(d.rel_error);
    res_->cosine.push_back(d.cosine);
    if (cumulative_) {
      cpu::add_into(req_->exec, sum_grad_, g);
      cpu::add_into(req_->exec, sum_out_, out);
    }
    if (req_->settings.keep_output && call + 1 == req_->settings.steps) res_->output.assign(out.begin(), out.end());
  }

  /// After the last call.
  void finish() const {
    res_->cumulative_rel_error = cumulative_ ? compare(sum_grad_, sum_out_).rel_error : res_->rel_error.front();
  }

private:
  const run_request* req_;
  method_result* res_;
  bool cumulative_;
  std::vector<float> sum_grad_, sum_out_;
};

/// Runs the compressor that `make(exec)` builds. Each rank builds its own compressor and state, as
/// the processes of a real job would. Before each call the ranks meet in a one-float allreduce
/// (outside the timed region), so a call's time is the slowest rank's time from a common start.
/// With own gradients, a measured call's output is compared with the exact average of the
/// workers' inputs (summed in worker order, divided by W, in float: what an uncompressed
/// allreduce gives).
template <class Make>
method_result measure(const run_request& req, Make&& make) {
  const run_settings& s = req.settings;
  const std::size_t calls = calls_per_method(s);
  const std::size_t n = req.layer.size();
  method_result res;
  res.floor_seconds = bench::stream_read_seconds(req.input.at(0));
  std::vector<std::vector<double>> seconds(s.workers, std::vector<double>(calls - 1));
  tally record(req, res);
  std::vector<float> mean(s.own ? n : 0);

  collectives::local_group group(s.workers);
  group.run([&](collectives::local& comm) {
    auto compressor = make(req.exec);
    auto state = compressor.make_state(req.layer);
    if constexpr (requires { compressor.compresses(state); })
      if (comm.rank() == 0) res.compressed = compressor.compresses(state);
    std::vector<float> buf(n);
    float token = 0.0f;
    for (std::size_t call = 0; call < calls; ++call) {
      const std::span<const float> g = input_of(req.input, s, call, comm.rank());
      std::copy(g.begin(), g.end(), buf.begin());
      comm.allreduce_sum(std::span<float>(&token, 1));
      const bench::stopwatch clock;
      const reduce_result r = compressor.reduce(state, buf, comm);
      const double t = clock.seconds();
      if (call > 0) seconds[comm.rank()][call - 1] = t;
      if (comm.rank() != 0) continue;
      if (!s.own || call >= s.steps) {
        record.add(call, g, buf, r);
        continue;
      }
      std::ranges::fill(mean, 0.0f);
      for (std::size_t w = 0; w < s.workers; ++w) cpu::add_into(req.exec, mean, input_of(req.input, s, call, w));
      cpu::divide(req.exec, mean, static_cast<float>(s.workers));
      record.add(call, mean, buf, r);
    }
  });

  for (std::size_t c = 0; c + 1 < calls; ++c) {
    double slowest = 0.0;
    for (const std::vector<double>& rank_seconds : seconds) slowest = std::max(slowest, rank_seconds[c]);
    res.call_seconds.push_back(slowest);
  }
  record.finish();
  return res;
}

/// Checks a method's configuration for the layer without running it: bellows::error if bad.
template <class Make>
void check(const layer_info& layer, cpu::executor& exec, Make&& make) {
  auto compressor = make(exec);
  (void)compressor.make_state(layer);
}

}  // namespace bellows::tool
