// SPDX-License-Identifier: Apache-2.0
// Steps of one compressor over a list of layers on one rank, made either by each layer's reduce
// or by the phases (concepts.hpp, PhasedCompressor) around one call per round and operation for
// all the layers (an allreduce of their summed parts, an allgather of their payloads), as an
// exchange layer would make them; what the rank saw is recorded so that the two
// ways can be compared bit for bit. Array is the backend's test array: made from a host vector,
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
#include "bellows/core/gather_buffer.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
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

/// Gathers every rank's `mine` into `all` (ranks blocks of mine's size, in rank order): in place
/// on the device (allgather_slots), through a gather_buffer on the host.
template <class Coll>
void gather(Coll& coll, std::span<float> mine, std::span<float> all) {
  const std::size_t bytes = mine.size_bytes();
  if constexpr (requires { coll.allgather_slots(std::as_bytes(mine), std::as_writable_bytes(all), bytes); }) {
    coll.allgather_slots(std::as_bytes(mine), std::as_writable_bytes(all), bytes);
  } else {
    gather_buffer blocks;
    coll.allgather(std::as_bytes(mine), blocks);
    for (std::size_t r = 0; r < blocks.blocks(); ++r)
      std::memcpy(all.data() + r * mine.size(), blocks.block(r).data(), bytes);
  }
}

/// `steps` steps of compressor c over `layers` on this rank of `coll`, by reduce or by phases.
template <class Array, class C, class Exec, class Coll>
layered_run run_layers(C& c, Exec& exec, Coll& coll, std::span<const layer_info> layers, bool phased,
                       std::size_t steps) {
  using state = typename C::state;
  const std::size_t rank = coll.rank(), ranks = coll.size();
  std::vector<state> states;
  for (const layer_info& layer : layers) states.push_back(c.make_state(layer));
  layered_run out;
  for (std::size_t step = 0; step < steps; ++step) {
    std::deque<Array> grads;
    for (const layer_info& layer : layers) grads.emplace_back(layer_gradient(layer, rank, ranks, step));
    if (!phased) {
      for (std::size_t l = 0; l < layers.size(); ++l) out.results.push_back(c.reduce(states[l], grads[l].span(), coll));
    } else {
      std::vector<exchange_rounds> rounds;
      std::size_t most = 0;
      for (const state& st : states) {
        rounds.push_back(c.rounds(st, ranks));
        most = std::max(most, rounds.back().size());
      }
      // Per round, one buffer of the allreduced parts and one block of this rank's payloads (its
      // gathered copies in a buffer of `ranks` such blocks); each part after the one before, at
      // part_alignment.
      constexpr std::size_t align = part_alignment / sizeof(float);
      struct place {
        bool gathered;
        std::size_t at, floats;
      };
      std::vector<std::vector<place>> where(layers.size());
      std::vector<std::size_t> summed(most, 0), block(most, 0);
      for (std::size_t l = 0; l < layers.size(); ++l)
        for (std::size_t r = 0; r < rounds[l].size(); ++r) {
          const bool gathered = rounds[l][r].op == collective_op::allgather;
          std::size_t& end = gathered ? block[r] : summed[r];
          where[l].push_back({gathered, end, rounds[l][r].bytes / sizeof(float)});
          end += (rounds[l][r].bytes / sizeof(float) + align - 1) / align * align;
        }
      std::deque<Array> sums, sends, copies;  // what a phase must overwrite: -1
      for (std::size_t r = 0; r < most; ++r) {
        sums.emplace_back(std::vector<float>(summed[r], -1.0f));
        sends.emplace_back(std::vector<float>(block[r], -1.0f));
        copies.emplace_back(std::vector<float>(block[r] * ranks, -1.0f));
      }
      // before the exchange, a gathered part is this rank's block; after it, rank 0's copy
      const auto parts_of = [&](std::size_t l, bool exchanged) {
        std::vector<round_part> p;
        for (std::size_t r = 0; r < where[l].size(); ++r) {
          const place& w = where[l][r];
          if (!w.gathered)
            p.push_back({sums[r].span().subspan(w.at, w.floats)});
          else if (!exchanged)
            p.push_back({sends[r].span().subspan(w.at, w.floats)});
          else
            p.push_back({copies[r].span().subspan(w.at, w.floats), block[r]});
        }
        return p;
      };
      const auto exchange = [&](std::size_t r) {
        if (summed[r] != 0) coll.allreduce_sum(sums[r].span());
        if (block[r] != 0) gather(coll, sends[r].span(), copies[r].span());
      };
      for (std::size_t l = 0; l < layers.size(); ++l)
        c.begin(states[l], grads[l].span(), parts_of(l, false), rank, ranks);
      exchange(0);
      for (std::size_t r = 1; r < most; ++r) {
        for (std::size_t l = 0; l < layers.size(); ++l)
          if (r < rounds[l].size()) c.next(states[l], grads[l].span(), r, parts_of(l, true));
        exchange(r);
      }
      for (std::size_t l = 0; l < layers.size(); ++l)
        c.finish(states[l], grads[l].span(), parts_of(l, true), rank, ranks);
      exec.synchronize();  // the step's one wait
      for (state& st : states) out.results.push_back(c.conclude(st));
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
