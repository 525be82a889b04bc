// SPDX-License-Identifier: Apache-2.0
// Checkpoints of Synchronizers with state in every part: PowerSGD under Accordion (ranks, queries,
// error memories, the detector's sums and norms) when the first byte is even, top-k with error
// memories otherwise; with the third bit of that byte, the scatter exchange's instead (owner
// memories and the world size they were saved at): EF-signSGD under Accordion, whose levels have
// other chunks, when the byte is even, top-k otherwise. The second bit picks restore_elastic()
// over restore(); the rest of the input is the file. Either may refuse the bytes with
// bellows::wire_error and must then have changed nothing. Bytes it accepts must give a state
// that saves, restores from its own bytes to the same bytes, and trains on: a step and the end of
// an epoch must go through (anything they throw is a state restore() should have refused), but
// for one refusal the spec states (docs/spec.md#scatter-exchange): a scatter state restored from
// another world size or rank refuses its next step with bellows::error, changing nothing.
#include <bellows/compressors/powersgd.hpp>
#include <bellows/compressors/signsgd.hpp>
#include <bellows/compressors/topk.hpp>
#include <bellows/regime/accordion.hpp>
#include <bellows/regime/static_policy.hpp>
#include <bellows/sync/synchronizer.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

namespace {

bellows::cpu::executor& exec() {
  static bellows::cpu::executor e(1);
  return e;
}

// Layer sets of the seeds in tests/corpus/checkpoint_stateful/ (their names and shapes key the
// checkpoint's layer hash).
auto powersgd_sync() {
  bellows::synchronizer sync(bellows::powersgd<>({.rank = 2}, exec()), bellows::powersgd<>({.rank = 1}, exec()),
                             bellows::accordion({.interval = 2}, exec()), exec());
  sync.add_layer("conv.weight", bellows::shape{16, 2, 2, 2});
  sync.add_layer("conv.bias", bellows::shape{16});
  sync.add_layer("fc.weight", bellows::shape{10, 24});
  return sync;
}

auto topk_sync() {
  bellows::synchronizer sync(bellows::topk<>({.ratio = 0.25}, exec()), bellows::topk<>({.ratio = 0.1}, exec()),
                             bellows::static_policy(bellows::regime::normal), exec());
  sync.add_layer("fc1.weight", bellows::shape{12, 10});
  sync.add_layer("fc1.bias", bellows::shape{12});
  return sync;
}

auto signsgd_scatter_sync() {
  bellows::synchronizer sync(bellows::signsgd<>({.bucket = 0, .exchange = bellows::exchange::scatter}, exec()),
                             bellows::signsgd<>({.bucket = 8, .exchange = bellows::exchange::scatter}, exec()),
                             bellows::accordion({.interval = 2}, exec()), exec());
  sync.add_layer("conv.weight", bellows::shape{6, 2, 3});
  sync.add_layer("fc.weight", bellows::shape{10, 7});
  return sync;
}

auto topk_scatter_sync() {
  bellows::synchronizer sync(bellows::topk<>({.ratio = 0.25, .exchange = bellows::exchange::scatter}, exec()),
                             bellows::topk<>({.ratio = 0.1, .exchange = bellows::exchange::scatter}, exec()),
                             bellows::static_policy(bellows::regime::normal), exec());
  sync.add_layer("fc1.weight", bellows::shape{12, 10});
  sync.add_layer("fc1.bias", bellows::shape{12});
  return sync;
}

template <class Sync>
void exercise(Sync&& sync, std::span<const std::byte> bytes, bool elastic) {
  const bellows::rank_place solo_place{0, 1};
  const std::vector<std::byte> before = sync.checkpoint(solo_place);
  try {
    if (elastic)
      sync.restore_elastic(bytes, solo_place);
    else
      sync.restore(bytes, solo_place);
  } catch (const bellows::wire_error&) {
    if (sync.checkpoint(solo_place) != before) std::abort();  // refused, so nothing may have changed
    return;
  }
  const std::vector<std::byte> saved = sync.checkpoint(solo_place);
  sync.restore(saved, solo_place);
  if (sync.checkpoint(solo_place) != saved) std::abort();
  std::vector<std::vector<float>> grads;
  for (std::size_t id = 0; id < sync.layers(); ++id) grads.emplace_back(sync.layer(id).size(), 0.5f);
  std::vector<std::span<float>> views(grads.begin(), grads.end());
  // Memories within a few orders of magnitude of the largest float may overflow in a step (PowerSGD
  // documents where); below 1e30 a step that goes through must give finite values.
  // The owner memories of the scatter exchange count too; a state saved at another world size
  // or rank (its chunks are of more than one rank) refuses the step.
  float largest = 0.0f;
  bool saved_elsewhere = false;
  for (std::size_t id = 0; id < sync.layers(); ++id) {
    const auto& st = sync.state(id);
    std::vector<std::span<const float>> memories;
    if constexpr (requires { st.memory.values(); })  // an error_memory (the others) or a float_array (PowerSGD)
      memories.push_back(st.memory.values());
    else
      memories.push_back(st.memory.span());
    if constexpr (requires { st.owner.values(); }) {
      memories.push_back(st.owner.values());
      saved_elsewhere = saved_elsewhere || st.chunks.ranks() > 1;
    }
    for (const auto values : memories)
      for (float e : values) largest = std::max(largest, std::abs(e));
  }
  bellows::archetypes::alltoall_collective solo;
  if (saved_elsewhere) {
    try {
      (void)sync.step(views, solo);
    } catch (const bellows::wire_error&) {
      throw;  // not the refusal the spec states
    } catch (const bellows::error&) {
      if (sync.checkpoint(solo_place) != saved) std::abort();  // refused, so nothing may have changed
      return;
    }
    std::abort();  // a step at another world size went through
  }
  const auto statuses = sync.step(views, solo);
  for (std::size_t id = 0; id < grads.size(); ++id) {
    if (statuses[id] == bellows::step_status::non_finite) {
      if (largest <= 1e30f) std::abort();  // finite input, one rank, moderate memories
      continue;
    }
    if (largest <= 1e30f)
      for (float v : grads[id])
        if (!std::isfinite(v)) std::abort();
  }
  (void)sync.end_epoch(0.1f, solo);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const auto bytes = std::as_bytes(std::span(data + 1, size - 1));
  const bool elastic = (data[0] & 2) != 0, scatter = (data[0] & 4) != 0, even = data[0] % 2 == 0;
  if (scatter && even)
    exercise(signsgd_scatter_sync(), bytes, elastic);
  else if (scatter)
    exercise(topk_scatter_sync(), bytes, elastic);
  else if (even)
    exercise(powersgd_sync(), bytes, elastic);
  else
    exercise(topk_sync(), bytes, elastic);
  return 0;
}
