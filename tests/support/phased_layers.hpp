// SPDX-License-Identifier: Apache-2.0
// Steps of one compressor over a list of layers on one rank, made either by each layer's reduce
// or as one bucket (sync/bucket_exchange.hpp: the phases, concepts.hpp's PhasedCompressor, around
// one call per round and operation for all the layers); what the rank saw is recorded so that the
// two ways can be compared bit for bit. Array is the backend's test array: made from a host vector,
// with span() (the backend's memory) and host() (a copy back).
#pragma once

#include <algorithm>
#include <cstring>
#include <cstddef>
#include <deque>
#include <limits>
#include <span>
#include <vector>

#include "bellows/core/checkpoint.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/sync/bucket_exchange.hpp"
#include "random.hpp"

namespace bellows::test {

/// What one rank saw over the steps.
struct layered_run {
  std::vector<std::vector<float>> outputs;  ///< per step and layer
  std::vector<reduce_result> results;       ///< per step and layer
  std::vector<std::byte> checkpoint;        ///< every layer's state after the last step
};

/// The gradient of `layer` on `rank` at `step`: seeded normals, one of them NaN on the last
/// rank's layer 1 at step 1.
inline std::vector<float> layer_gradient(const layer_info& layer, std::size_t rank, std::size_t ranks,
                                         std::size_t step) {
  auto g = testing::normal_floats(layer.size(), 1000 * step + 100 * rank + layer.id);
  if (step == 1 && rank + 1 == ranks && layer.id == 1 && !g.empty())
    g[g.size() / 2] = std::numeric_limits<float>::quiet_NaN();
  return g;
}

/// `steps` steps of compressor c over `layers` on this rank of `coll`, by reduce or as one bucket.
template <class Array, class C, class Exec, class Coll>
layered_run run_layers(C& c, Exec& exec, Coll& coll, std::span<const layer_info> layers, bool phased,
                       std::size_t steps) {
  using state = typename C::state;
  const std::size_t rank = coll.rank(), ranks = coll.size();
  std::vector<state> states;
  for (const layer_info& layer : layers) states.push_back(c.make_state(layer));
  bucket_exchange<Exec> exchange(exec);
  layered_run out;
  for (std::size_t step = 0; step < steps; ++step) {
    std::deque<Array> grads;
    for (const layer_info& layer : layers) grads.emplace_back(layer_gradient(layer, rank, ranks, step));
    if (!phased) {
      for (std::size_t l = 0; l < layers.size(); ++l) out.results.push_back(c.reduce(states[l], grads[l].span(), coll));
    } else {
      std::vector<bucket_layer<C>> bucket;
      for (std::size_t l = 0; l < layers.size(); ++l) bucket.push_back({&c, &states[l], grads[l].span()});
      std::vector<reduce_result> results(layers.size());
      exchange.run(std::span<const bucket_layer<C>>(bucket), std::span<reduce_result>(results), coll);
      out.results.insert(out.results.end(), results.begin(), results.end());
    }
    for (const Array& g : grads) out.outputs.push_back(g.host());
  }
  checkpoint_writer w;
  for (const state& st : states) c.save(st, w);
  out.checkpoint.assign(w.bytes().begin(), w.bytes().end());
  return out;
}

/// Layers for the runs: layer 1 (which takes the NaN) a matrix PowerSGD compresses; among the
/// others, layers PowerSGD leaves dense (a vector, a scalar, a matrix too small for rank 4), so
/// that one bucket holds layers of one round and of two.
inline const layer_info phased_layers[] = {
    {0, "bias", shape{30}}, {1, "fc", shape{24, 20}},  {2, "conv", shape{8, 3, 3, 3}},
    {3, "scale", shape{}},  {4, "small", shape{5, 4}}, {5, "wide", shape{7, 64}},
};

/// True when two runs saw the same bits, results and checkpoints.
inline bool same_runs(const layered_run& a, const layered_run& b) {
  if (a.outputs.size() != b.outputs.size() || a.results.size() != b.results.size() || a.checkpoint != b.checkpoint)
    return false;
  for (std::size_t i = 0; i < a.results.size(); ++i)
    if (a.results[i].status != b.results[i].status || !(a.results[i].sent == b.results[i].sent)) return false;
  for (std::size_t i = 0; i < a.outputs.size(); ++i) {
    const auto &x = a.outputs[i], &y = b.outputs[i];
    if (x.size() != y.size() || (!x.empty() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0))
      return false;
  }
  return true;
}

/// The layers one run skipped.
inline std::size_t skipped(const layered_run& r) {
  return static_cast<std::size_t>(
      std::ranges::count_if(r.results, [](const reduce_result& x) { return x.status == step_status::non_finite; }));
}

}  // namespace bellows::test
