// SPDX-License-Identifier: Apache-2.0
// The Synchronizer's buckets (sync/synchronizer.hpp, sync/bucket_exchange.hpp): a step by buckets,
// its own or a caller's, gives every layer the output, status, traffic and state that the layer's
// own reduce gives, bit for bit, for every compressor, over W = 1, 2, 3, 5 ranks summing in rank
// order; buckets of one, two and five layers and one larger than the budget; layers of both
// levels in one bucket; non-finite gradients in a bucket and alone, skipped by the compressors'
// own flags or by the synchronizer's vote. A step makes one call per bucket, round and operation.
// Bad buckets are refused before anything changes, and checkpoints record the buckets. A layer
// with a stream key of its own draws as it would alone. A collective with allgather_slots gets a
// bucket's payloads in one call, with the same bits.
#include <bellows/collectives/counting.hpp>
#include <bellows/collectives/local.hpp>
#include <bellows/compressors/identity.hpp>
#include <bellows/compressors/powersgd.hpp>
#include <bellows/compressors/qsgd.hpp>
#include <bellows/compressors/randk.hpp>
#include <bellows/compressors/signsgd.hpp>
#include <bellows/compressors/topk.hpp>
#include <bellows/core/checkpoint.hpp>
#include <bellows/regime/static_policy.hpp>
#include <bellows/sync/synchronizer.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "../support/random.hpp"

namespace {

using bellows::regime;
using bellows::collectives::local;
using bellows::collectives::local_group;

// Bytes of gradient: 120, 1920, 864, 4, 80, 64, 36, 1792, 8000, 24, 1024. With a budget of 2048
// bytes, grouped from the last layer back: {9, 10}, {8} (larger than the budget), {3..7}, {2},
// {0, 1}.
const bellows::shape shapes[] = {bellows::shape{30}, bellows::shape{24, 20}, bellows::shape{8, 3, 3, 3},
                                 bellows::shape{},   bellows::shape{5, 4},   bellows::shape{16},
                                 bellows::shape{9},  bellows::shape{7, 64},  bellows::shape{40, 50},
                                 bellows::shape{6},  bellows::shape{16, 16}};
constexpr std::size_t layer_count = std::size(shapes);
constexpr std::size_t budget = 2048;
const std::vector<std::uint32_t> own_buckets = {0, 2, 3, 8, 9, 11};

/// Whether the last rank's gradient of `layer` holds a NaN at `step`: layer 1 (in a bucket of
/// two) at step 1, layer 8 (alone) at step 2.
bool poisoned(std::size_t layer, std::size_t step) { return (layer == 1 && step == 1) || (layer == 8 && step == 2); }

std::vector<float> gradient(std::size_t layer, std::size_t rank, std::size_t ranks, std::size_t step) {
  auto g = bellows::testing::normal_floats(shapes[layer].size(), 7919 * step + 131 * rank + layer);
  if (rank + 1 == ranks && poisoned(layer, step) && !g.empty())
    g[g.size() / 2] = std::numeric_limits<float>::quiet_NaN();
  return g;
}

/// A detector with odd layers at the normal level and even ones critical, observing every layer
/// when `watch` (then the synchronizer votes on finiteness per bucket) or none.
struct striped {
  bool watch = false;
  std::vector<regime> levels;
  std::vector<double> seen;
  void add_layer(const bellows::layer_info& l, bellows::participation) {
    levels.push_back(l.id % 2 == 1 ? regime::normal : regime::critical);
    seen.push_back(0);
  }
  [[nodiscard]] std::span<const regime> regimes() const { return levels; }
  [[nodiscard]] bool observing(std::size_t) const { return watch; }
  bellows::step_status observe(std::size_t id, std::span<const float> g) {
    observe_finite(id, g);
    return bellows::step_status::ok;
  }
  void observe_finite(std::size_t id, std::span<const float> g) {
    for (float v : g) seen[id] += v;
  }
  template <bellows::Collective C>
  std::span<const regime> end_epoch(std::size_t, float, C&) {
    return levels;
  }
  void save(bellows::checkpoint_writer& w) const { w.put_array(std::span<const double>(seen)); }
  void load(bellows::checkpoint_reader& r) { r.get_array(std::span<double>(seen), "seen"); }
};

/// How a run hands its layers over.
enum class handing { by_own_buckets, by_caller_buckets, layer_by_layer_reference };

/// The buckets a caller hands over at `step`, changing from step to step, in any order.
std::vector<std::vector<std::uint32_t>> caller_buckets(std::size_t step) {
  switch (step % 3) {
    case 0: return {{10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0}};
    case 1: return {{3}, {0, 5, 1}, {10, 2}, {4, 6, 7, 8, 9}};
    default: return {{1, 0}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}};
  }
}

struct run_record {
  std::vector<std::vector<float>> outputs;  // per step and layer
  std::vector<bellows::step_status> statuses;
  std::vector<bellows::traffic> sent;  // per layer, over all steps
  std::vector<std::byte> states;       // every layer's state after the last step
  std::vector<std::size_t> calls;      // per step
  std::vector<double> seen;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

bool same(const run_record& a, const run_record& b) {
  if (a.outputs.size() != b.outputs.size() || a.statuses != b.statuses || a.states != b.states || a.seen != b.seen)
    return false;
  for (std::size_t i = 0; i < a.sent.size(); ++i)
    if (!(a.sent[i] == b.sent[i])) return false;
  for (std::size_t i = 0; i < a.outputs.size(); ++i)
    if (!same_bits(a.outputs[i], b.outputs[i])) return false;
  return a.sent.size() == b.sent.size();
}

constexpr std::size_t steps = 4;

/// `steps` steps of a synchronizer of (critical, normal) on this rank, handed over as `how` says;
/// the reference calls each layer's reduce with the compressor of its level, skipping a layer that
/// the vote (when `watch`) finds non-finite on some rank.
template <class C>
run_record run(const C& critical, const C& normal, bool watch, handing how, local& comm) {
  const std::size_t rank = comm.rank(), ranks = comm.size();
  bellows::synchronizer sync(critical, normal, striped{watch, {}, {}});
  for (std::size_t id = 0; id < layer_count; ++id) sync.add_layer("layer" + std::to_string(id), shapes[id]);
  sync.set_bucket_bytes(budget);
  C low = critical, high = normal;
  std::vector<typename C::state> states;
  for (std::size_t id = 0; id < layer_count; ++id) states.push_back(low.make_state(sync.layer(id)));
  striped by_hand{watch, {}, {}};
  for (std::size_t id = 0; id < layer_count; ++id) by_hand.add_layer(sync.layer(id), bellows::participation::included);
  run_record out;
  out.sent.resize(layer_count);
  bellows::collectives::counting<local> counted(comm);
  for (std::size_t step = 0; step < steps; ++step) {
    std::vector<std::vector<float>> g;
    for (std::size_t id = 0; id < layer_count; ++id) g.push_back(gradient(id, rank, ranks, step));
    std::vector<std::span<float>> views(g.begin(), g.end());
    const std::size_t before = counted.total().calls;
    if (how == handing::by_own_buckets) {
      const auto statuses = sync.step(views, counted);
      out.statuses.insert(out.statuses.end(), statuses.begin(), statuses.end());
    } else if (how == handing::by_caller_buckets) {
      for (const auto& ids : caller_buckets(step)) {
        std::vector<std::span<float>> mine;
        for (const std::uint32_t id : ids) mine.push_back(views[id]);
        (void)sync.step_bucket(ids, mine, counted);
      }
      for (std::size_t id = 0; id < layer_count; ++id) out.statuses.push_back(sync.telemetry()[id].last_status);
    } else {
      for (std::size_t id = 0; id < layer_count; ++id) {
        if (watch && poisoned(id, step)) {
          out.statuses.push_back(bellows::step_status::non_finite);
          continue;
        }
        if (watch) by_hand.observe_finite(id, g[id]);
        C& c = id % 2 == 1 ? high : low;
        const bellows::reduce_result r = c.reduce(states[id], views[id], counted);
        out.statuses.push_back(r.status);
        out.sent[id] += r.sent;
      }
    }
    out.calls.push_back(counted.total().calls - before);
    for (auto& x : g) out.outputs.push_back(std::move(x));
  }
  bellows::checkpoint_writer w;
  for (std::size_t id = 0; id < layer_count; ++id) {
    if (how == handing::layer_by_layer_reference) {
      low.save(states[id], w);
    } else {
      low.save(sync.state(id), w);
      out.sent[id] = sync.telemetry()[id].sent;
    }
  }
  out.states.assign(w.bytes().begin(), w.bytes().end());
  out.seen = how == handing::layer_by_layer_reference ? by_hand.seen : sync.detector().seen;
  return out;
}

/// The calls a step of the own buckets makes when every input is finite: per bucket, per round,
/// one per operation some layer of it needs (a bucket of one layer: its reduce's rounds).
template <class C>
std::size_t own_calls(const C& critical, const C& normal, std::size_t ranks, bool watch) {
  C low = critical, high = normal;
  std::size_t calls = 0;
  for (std::size_t b = 0; b + 1 < own_buckets.size(); ++b) {
    bool op[bellows::exchange_rounds::capacity][3] = {};  // allreduce_sum, allgather, alltoall
    for (std::uint32_t id = own_buckets[b]; id < own_buckets[b + 1]; ++id) {
      const bellows::layer_info info{id, "layer" + std::to_string(id), shapes[id]};
      const auto rounds = (id % 2 == 1 ? high : low).rounds(low.make_state(info), ranks);
      for (std::size_t r = 0; r < rounds.size(); ++r) op[r][static_cast<std::size_t>(rounds[r].op)] = true;
    }
    for (const auto& round : op) calls += static_cast<std::size_t>(std::ranges::count(round, true));
    if (watch) ++calls;  // the bucket's finiteness vote
  }
  return calls;
}

template <class C>
void check_buckets(const C& critical, const C& normal) {
  for (const bool watch : {false, true})
    for (const std::size_t ranks : {1u, 2u, 3u, 5u}) {
      CAPTURE(watch);
      CAPTURE(ranks);
      std::vector<run_record> want(ranks), own(ranks), theirs(ranks);
      std::vector<std::vector<std::uint32_t>> buckets(ranks);
      local_group group(ranks);
      group.run([&](local& comm) {
        want[comm.rank()] = run(critical, normal, watch, handing::layer_by_layer_reference, comm);
        own[comm.rank()] = run(critical, normal, watch, handing::by_own_buckets, comm);
        theirs[comm.rank()] = run(critical, normal, watch, handing::by_caller_buckets, comm);
      });
      const std::size_t calls = own_calls(critical, normal, ranks, watch);
      for (std::size_t rank = 0; rank < ranks; ++rank) {
        CAPTURE(rank);
        CHECK(same(own[rank], want[rank]));
        CHECK(same(theirs[rank], want[rank]));
        CHECK(std::ranges::count(want[rank].statuses, bellows::step_status::non_finite) == 2);
        CHECK(own[rank].calls[3] == calls);      // a step of finite inputs after the first
        CHECK(own[rank].calls[0] == calls + 1);  // the first also checks the layers
      }
    }
}

/// The local collective with allgather_slots on the host (as bellows_torch's process-group adapter
/// has it), so that a bucket's payloads are gathered into one array of slots.
struct slotted {
  local* inner;
  bellows::gather_buffer scratch;
  std::size_t slot_calls = 0;
  [[nodiscard]] std::size_t rank() const { return inner->rank(); }
  [[nodiscard]] std::size_t size() const { return inner->size(); }
  void allreduce_sum(std::span<float> v) { inner->allreduce_sum(v); }
  void allgather(std::span<const std::byte> mine, bellows::gather_buffer& out) { inner->allgather(mine, out); }
  void allgather_slots(std::span<const std::byte> mine, std::span<std::byte> slots, std::size_t slot) {
    ++slot_calls;
    inner->allgather(mine, scratch);
    for (std::size_t r = 0; r < size(); ++r) std::ranges::copy(scratch.block(r), slots.begin() + r * slot);
  }
};

/// Outputs of `steps` steps in the own buckets over `coll`.
template <class C, class Coll>
std::vector<std::vector<float>> own_bucket_outputs(const C& critical, const C& normal, Coll& coll) {
  bellows::synchronizer sync(critical, normal, striped{false, {}, {}});
  for (std::size_t id = 0; id < layer_count; ++id) sync.add_layer("layer" + std::to_string(id), shapes[id]);
  sync.set_bucket_bytes(budget);
  std::vector<std::vector<float>> out;
  for (std::size_t step = 0; step < steps; ++step) {
    std::vector<std::vector<float>> g;
    for (std::size_t id = 0; id < layer_count; ++id) g.push_back(gradient(id, coll.rank(), coll.size(), step));
    std::vector<std::span<float>> views(g.begin(), g.end());
    (void)sync.step(views, coll);
    for (auto& x : g) out.push_back(std::move(x));
  }
  return out;
}

/// A collective with allgather_slots gives the same outputs as one without, in one slot call per
/// bucket with payloads.
template <class C>
void check_slotted(const C& critical, const C& normal) {
  constexpr std::size_t ranks = 3;
  std::vector<std::vector<std::vector<float>>> plain(ranks), slots(ranks);
  std::vector<std::size_t> calls(ranks);
  local_group group(ranks);
  group.run([&](local& comm) {
    plain[comm.rank()] = own_bucket_outputs(critical, normal, comm);
    slotted s{&comm, {}, 0};
    slots[comm.rank()] = own_bucket_outputs(critical, normal, s);
    calls[comm.rank()] = s.slot_calls;
  });
  for (std::size_t rank = 0; rank < ranks; ++rank) {
    CAPTURE(rank);
    CHECK(calls[rank] > 0);
    bool same_outputs = plain[rank].size() == slots[rank].size();
    for (std::size_t i = 0; same_outputs && i < plain[rank].size(); ++i)
      same_outputs = same_bits(plain[rank][i], slots[rank][i]);
    CHECK(same_outputs);
  }
}

/// Layers registered with stream keys of their own, handed over in caller buckets, give what
/// one-layer synchronizers give whose compressors are seeded seed + key (the layer then id 0), bit
/// for bit; without the keys they give other numbers (where the draw shows in the output:
/// `draws_show`). `make(seed)` is the compressor.
template <class Make>
void check_keyed(Make make, bool draws_show = true) {
  constexpr std::uint64_t seed = 17;
  auto key = [](std::size_t id) { return 0x9E3779B97F4A7C15ULL * (1000 + 37 * id); };
  constexpr std::size_t ranks = 3;
  std::vector<std::vector<std::vector<float>>> keyed(ranks), alone(ranks), unkeyed(ranks);
  local_group group(ranks);
  group.run([&](local& comm) {
    const std::size_t rank = comm.rank();
    auto policy = [] { return bellows::static_policy(regime::critical); };
    bellows::synchronizer with_keys(make(seed), make(seed), policy());
    bellows::synchronizer without(make(seed), make(seed), policy());
    std::vector<bellows::synchronizer<decltype(make(seed)), bellows::static_policy>> one;
    one.reserve(layer_count);
    for (std::size_t id = 0; id < layer_count; ++id) {
      const std::string name = "layer" + std::to_string(id);
      with_keys.add_layer(name, shapes[id], key(id));
      without.add_layer(name, shapes[id]);
      one.emplace_back(make(seed + key(id)), make(seed + key(id)), policy());
      one.back().add_layer(name, shapes[id]);
    }
    for (std::size_t step = 0; step < steps; ++step) {
      std::vector<std::vector<float>> a, b, c;
      for (std::size_t id = 0; id < layer_count; ++id) {
        a.push_back(gradient(id, rank, 1, step));  // finite on every rank
        b.push_back(a.back());
        c.push_back(a.back());
      }
      for (const auto& ids : caller_buckets(step)) {
        std::vector<std::span<float>> ga, gb;
        for (const std::uint32_t id : ids) {
          ga.emplace_back(a[id]);
          gb.emplace_back(b[id]);
        }
        (void)with_keys.step_bucket(ids, ga, comm);
        (void)without.step_bucket(ids, gb, comm);
      }
      for (std::size_t id = 0; id < layer_count; ++id) {
        const std::span<float> g(c[id]);
        (void)one[id].step(std::span<const std::span<float>>(&g, 1), comm);
      }
      for (std::size_t id = 0; id < layer_count; ++id) {
        keyed[rank].push_back(std::move(a[id]));
        unkeyed[rank].push_back(std::move(b[id]));
        alone[rank].push_back(std::move(c[id]));
      }
    }
  });
  for (std::size_t rank = 0; rank < ranks; ++rank) {
    CAPTURE(rank);
    bool all_same = true, any_differs = false;
    for (std::size_t i = 0; i < keyed[rank].size(); ++i) {
      all_same = all_same && same_bits(keyed[rank][i], alone[rank][i]);
      any_differs = any_differs || !same_bits(keyed[rank][i], unkeyed[rank][i]);
    }
    CHECK(all_same);
    CHECK(any_differs == draws_show);
  }
}

}  // namespace

TEST_CASE("buckets: a collective with allgather_slots gathers each bucket's payloads in one call, same bits") {
  check_slotted(bellows::qsgd<>({.bits = 8, .bucket = 64}), bellows::qsgd<>({.bits = 2, .bucket = 64}));
  check_slotted(bellows::topk<>({.ratio = 0.3}), bellows::topk<>({.ratio = 0.05}));
  check_slotted(bellows::signsgd<>({.bucket = 0}), bellows::signsgd<>({.bucket = 16}));
}

TEST_CASE("buckets: a layer's own stream key draws as a one-layer synchronizer seeded seed + key") {
  check_keyed([](std::uint64_t seed) { return bellows::powersgd<>({.rank = 2, .seed = seed}); });
  check_keyed([](std::uint64_t seed) { return bellows::qsgd<>({.bits = 4, .bucket = 64, .seed = seed}); });
  check_keyed([](std::uint64_t seed) {
    return bellows::randk<>({.ratio = 0.3, .mode = bellows::randk_mode::per_rank, .seed = seed});
  });
  check_keyed(
      [](std::uint64_t seed) {
        // the layers here are small enough for the threshold's sample to be all of the layer: the key
        // keys no draw that shows
        return bellows::topk<>({.ratio = 0.2, .mode = bellows::topk_mode::approximate, .seed = seed});
      },
      false);
}

TEST_CASE("buckets: identity, by the synchronizer's own buckets or a caller's, equals each layer's reduce") {
  check_buckets(bellows::identity<>(), bellows::identity<>());
}

TEST_CASE("buckets: powersgd of two ranks, dense layers riding along, equals each layer's reduce") {
  check_buckets(bellows::powersgd<>({.rank = 2, .seed = 3}), bellows::powersgd<>({.rank = 1, .seed = 3}));
}

TEST_CASE("buckets: qsgd and EF-signSGD equal each layer's reduce") {
  check_buckets(bellows::qsgd<>({.bits = 8, .bucket = 64}), bellows::qsgd<>({.bits = 2, .bucket = 64}));
  check_buckets(bellows::signsgd<>({.bucket = 0}), bellows::signsgd<>({.bucket = 16}));
}

TEST_CASE("buckets: qsgd and EF-signSGD by the scatter exchange equal each layer's reduce") {
  constexpr bellows::exchange scatter = bellows::exchange::scatter;
  check_buckets(bellows::qsgd<>({.bits = 8, .bucket = 64, .exchange = scatter, .owner_memory = true}),
                bellows::qsgd<>({.bits = 2, .bucket = 64, .exchange = scatter, .owner_memory = true}));
  check_buckets(bellows::signsgd<>({.bucket = 0, .exchange = scatter}),
                bellows::signsgd<>({.bucket = 16, .exchange = scatter}));
}

TEST_CASE("buckets: top-k by the scatter exchange, at two ratios, equals each layer's reduce") {
  constexpr bellows::exchange scatter = bellows::exchange::scatter;
  check_buckets(bellows::topk<>({.ratio = 0.2, .exchange = scatter}),
                bellows::topk<>({.ratio = 0.02, .exchange = scatter}));
}

TEST_CASE("buckets: top-k, its dense switch beside sparse layers, equals each layer's reduce") {
  // ratio 0.5 switches to the dense allreduce at every W; 0.1 from W = 5
  check_buckets(bellows::topk<>({.ratio = 0.5}), bellows::topk<>({.ratio = 0.1}));
  check_buckets(bellows::topk<>({.ratio = 0.3, .mode = bellows::topk_mode::approximate}),
                bellows::topk<>({.ratio = 0.05, .mode = bellows::topk_mode::approximate}));
}

TEST_CASE("buckets: rand-k, shared and per rank, equals each layer's reduce") {
  check_buckets(bellows::randk<>({.ratio = 0.5}), bellows::randk<>({.ratio = 0.2}));
  check_buckets(bellows::randk<>({.ratio = 0.5, .mode = bellows::randk_mode::per_rank}),
                bellows::randk<>({.ratio = 0.2, .mode = bellows::randk_mode::per_rank}));
}

/// The local collective that writes `value` at byte `offset` of rank `victim`'s gathered block.
struct corrupting {
  local* inner;
  std::size_t victim, offset;
  std::byte value;
  [[nodiscard]] std::size_t rank() const { return inner->rank(); }
  [[nodiscard]] std::size_t size() const { return inner->size(); }
  void allreduce_sum(std::span<float> v) { inner->allreduce_sum(v); }
  void allgather(std::span<const std::byte> mine, bellows::gather_buffer& out) {
    inner->allgather(mine, out);
    out.block(victim)[offset] = value;
  }
};

TEST_CASE("buckets: a malformed payload raises on every rank, naming its layer and rank, and changes no layer's "
          "state, the memories of the layers averaged before it included") {
  const bellows::shape layer_shapes[] = {bellows::shape{40, 3}, bellows::shape{17}, bellows::shape{9, 5}};
  for (const bool qsgd : {false, true}) {
    CAPTURE(qsgd);
    local_group group(3);
    std::atomic<std::size_t> right{0};
    group.run([&](local& comm) {
      const auto check = [&]<class C>(C c) {
        std::vector<typename C::state> states;
        for (std::uint32_t id = 0; id < std::size(layer_shapes); ++id)
          states.push_back(c.make_state({id, "layer" + std::to_string(id), layer_shapes[id]}));
        bellows::bucket_exchange<bellows::cpu::executor> exchange(bellows::cpu::executor::shared());
        std::vector<bellows::reduce_result> results(states.size());
        std::vector<std::vector<float>> g;
        const auto input = [&](std::size_t s, std::size_t l) {
          return bellows::testing::normal_floats(layer_shapes[l].size(), 101 * s + 7 * comm.rank() + l);
        };
        const auto step = [&](std::size_t s, auto& coll) {
          g.clear();
          std::vector<bellows::bucket_layer<C>> bucket;
          for (std::size_t l = 0; l < states.size(); ++l) g.push_back(input(s, l));
          for (std::size_t l = 0; l < states.size(); ++l) bucket.push_back({&c, &states[l], g[l]});
          exchange.run(std::span<const bellows::bucket_layer<C>>(bucket), std::span(results), coll);
        };
        const auto saved = [&] {
          bellows::checkpoint_writer w;
          for (const auto& st : states) c.save(st, w);
          return std::vector<std::byte>(w.bytes().begin(), w.bytes().end());
        };
        step(0, comm);
        const std::vector<std::byte> before = saved();
        corrupting lossy{&comm, 2, 4, std::byte{0xFF}};  // the version of rank 2's payload of layer 0
        bool raised = false;
        try {
          step(1, lossy);
        } catch (const bellows::wire_error& e) {
          raised = std::string(e.what()).find("layer 'layer0': the payload of rank 2") != std::string::npos;
        }
        // some layer was averaged before the error (the sweep of finish runs from the last layer)
        const bool some_averaged = g[1] != input(1, 1) || g[2] != input(1, 2);
        return raised && some_averaged && saved() == before;
      };
      const bool ok = qsgd ? check(bellows::qsgd<>({.bits = 4, .bucket = 16, .feedback = bellows::feedback::residual}))
                           : check(bellows::signsgd<>(bellows::signsgd_params{}));
      if (ok) ++right;
    });
    CHECK(right == 3);
  }
}

TEST_CASE("buckets: the own buckets follow the budget from the last layer back, fixed at the first step") {
  local_group group(1);
  group.run([&](local& comm) {
    bellows::synchronizer sync(bellows::identity<>(), bellows::identity<>(), bellows::static_policy(regime::critical));
    for (std::size_t id = 0; id < layer_count; ++id) sync.add_layer("layer" + std::to_string(id), shapes[id]);
    sync.set_bucket_bytes(budget);
    CHECK(sync.buckets().empty());
    std::vector<std::vector<float>> g;
    for (std::size_t id = 0; id < layer_count; ++id) g.push_back(gradient(id, 0, 1, 0));
    std::vector<std::span<float>> v(g.begin(), g.end());
    (void)sync.step(v, comm);
    CHECK(std::ranges::equal(sync.buckets(), own_buckets));
    CHECK_THROWS_WITH_AS(sync.set_bucket_bytes(1 << 20), doctest::Contains("before the first step"), bellows::error);

    // The default budget holds every layer here in one bucket; 0 puts each alone.
    for (const std::size_t bytes : {std::size_t{25} << 20, std::size_t{0}}) {
      bellows::synchronizer other(bellows::identity<>(), bellows::identity<>(),
                                  bellows::static_policy(regime::critical));
      for (std::size_t id = 0; id < layer_count; ++id) other.add_layer("layer" + std::to_string(id), shapes[id]);
      if (bytes == 0) other.set_bucket_bytes(0);
      (void)other.step(v, comm);
      CHECK(other.buckets().size() == (bytes == 0 ? layer_count + 1 : 2));
      CHECK(other.buckets().back() == layer_count);
    }
  });
}

TEST_CASE("buckets: a layer handed over twice, an unknown layer, a wrong gradient, step or a checkpoint mid-step "
          "are refused before anything changes") {
  local_group group(2);
  std::atomic<int> right{0};
  group.run([&](local& comm) {
    bellows::synchronizer sync(bellows::topk<>({.ratio = 0.1}), bellows::topk<>({.ratio = 0.1}),
                               bellows::static_policy(regime::critical));
    for (std::size_t id = 0; id < layer_count; ++id) sync.add_layer("layer" + std::to_string(id), shapes[id]);
    std::vector<std::vector<float>> g;
    for (std::size_t id = 0; id < layer_count; ++id) g.push_back(gradient(id, comm.rank(), 2, 0));
    const auto before = g;
    const std::vector<std::uint32_t> twice = {4, 5, 4}, unknown = {3, 11}, first = {0, 1};
    std::vector<std::span<float>> three = {g[4], g[5], g[4]}, two = {g[3], g[4]}, pair = {g[0], g[1]};
    auto says = [](auto&& call, const char* what) {
      try {
        call();
      } catch (const bellows::error& e) {
        return std::string(e.what()).find(what) != std::string::npos;
      }
      return false;
    };
    bool ok = says([&] { (void)sync.step_bucket(twice, three, comm); }, "'layer4' handed over twice");
    ok = ok && says([&] { (void)sync.step_bucket(unknown, two, comm); }, "names layer 11 of 11");
    ok = ok && says([&] { (void)sync.step_bucket(first, two, comm); }, "layer 'layer0' of shape");
    ok = ok && says([&] { (void)sync.step_bucket(first, std::span<const std::span<float>>(pair).first(1), comm); },
                    "a bucket of 2 layers got 1 gradients");
    ok = ok && g == before && sync.steps() == 0 && sync.state(4).step == 0;
    (void)sync.step_bucket(first, pair, comm);  // now a step is under way
    ok = ok && sync.state(0).step == 1 && sync.steps() == 0;
    ok = ok && says([&] { (void)sync.step_bucket(first, pair, comm); }, "'layer0' handed over twice in step 0");
    std::vector<std::span<float>> all(g.begin(), g.end());
    ok = ok && says([&] { (void)sync.step(all, comm); }, "2 of 11 layers handed over");
    ok = ok && says([&] { (void)sync.checkpoint(comm); }, "checkpoint in the middle of a step");
    std::vector<std::uint32_t> rest;
    std::vector<std::span<float>> rest_grads;
    for (std::uint32_t id = 2; id < layer_count; ++id) {
      rest.push_back(id);
      rest_grads.push_back(g[id]);
    }
    (void)sync.step_bucket(rest, rest_grads, comm);
    ok = ok && sync.steps() == 1 && sync.state(10).step == 1 && !sync.checkpoint(comm).empty();
    if (ok) ++right;
  });
  CHECK(right == 2);
}

TEST_CASE("buckets: a checkpoint records the buckets; a restore takes them whatever the budget set") {
  local_group group(1);
  group.run([&](local& comm) {
    auto make = [] {
      bellows::synchronizer s(bellows::identity<>(), bellows::identity<>(), bellows::static_policy(regime::critical));
      for (std::size_t id = 0; id < layer_count; ++id) s.add_layer("layer" + std::to_string(id), shapes[id]);
      return s;
    };
    auto sync = make();
    sync.set_bucket_bytes(budget);
    std::vector<std::vector<float>> g;
    for (std::size_t id = 0; id < layer_count; ++id) g.push_back(gradient(id, 0, 1, 0));
    std::vector<std::span<float>> v(g.begin(), g.end());
    (void)sync.step(v, comm);
    const auto bytes = sync.checkpoint(comm);
    auto back = make();  // the default budget would make one bucket
    back.restore(bytes, comm);
    CHECK(std::ranges::equal(back.buckets(), own_buckets));
    CHECK_THROWS_AS(back.set_bucket_bytes(0), bellows::error);
    auto fresh = make();  // saved before any step: no buckets, planned at the next step
    const auto none = fresh.checkpoint(comm);
    auto later = make();
    later.set_bucket_bytes(budget);
    later.restore(none, comm);
    CHECK(later.buckets().empty());
    (void)later.step(v, comm);
    CHECK(std::ranges::equal(later.buckets(), own_buckets));
  });
}
