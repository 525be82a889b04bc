// SPDX-License-Identifier: Apache-2.0
#include <bellows/collectives/counting.hpp>
#include <bellows/collectives/local.hpp>
#include <bellows/compressors/identity.hpp>
#include <bellows/compressors/powersgd.hpp>
#include <bellows/compressors/qsgd.hpp>
#include <bellows/compressors/topk.hpp>
#include <bellows/regime/accordion.hpp>
#include <bellows/regime/static_policy.hpp>
#include <bellows/sync/synchronizer.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <future>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "../support/random.hpp"

using bellows::collectives::local;
using bellows::collectives::local_group;

namespace {

/// prefix, n and suffix as text, appended rather than concatenated: GCC 12 misreports
/// `"l" + std::to_string(n)` at -O3 (-Wrestrict).
std::string numbered(const char* prefix, std::size_t n, const char* suffix = "") {
  std::string text = prefix;
  text += std::to_string(n);
  text += suffix;
  return text;
}

/// A compressor that averages like identity and reports its tag as `kept`, so a test sees which
/// level ran, alone in a bucket (reduce) or beside others (the phases, which end in conclude).
struct tagged : bellows::identity<> {
  std::uint64_t tag;
  explicit tagged(std::uint64_t t) : tag(t) {}
  template <bellows::Collective Coll>
  bellows::reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    bellows::reduce_result r = identity::reduce(st, inout, coll);
    r.sent.kept = tag;
    return r;
  }
  bellows::reduce_result conclude(state& st) {
    bellows::reduce_result r = identity::conclude(st);
    r.sent.kept = tag;
    return r;
  }
};

/// A detector that follows a script: regimes per epoch, observes every step of every epoch and
/// counts what it saw; saves and loads its counters.
struct scripted {
  std::vector<std::vector<bellows::regime>> script;  // script[e] = levels after epoch e
  std::vector<bellows::regime> now;
  std::vector<double> seen;  // sum of observed elements per layer
  void add_layer(const bellows::layer_info&, bellows::participation) {
    now.push_back(bellows::regime::critical);
    seen.push_back(0);
  }
  [[nodiscard]] std::span<const bellows::regime> regimes() const { return now; }
  bool observing(std::size_t) const { return true; }
  bellows::step_status observe(std::size_t id, std::span<const float> g) {
    for (float v : g) seen[id] += v;
    return bellows::step_status::ok;
  }
  template <bellows::Collective C>
  std::span<const bellows::regime> end_epoch(std::size_t epoch, float, C&) {
    now = script.at(epoch);
    return now;
  }
  void save(bellows::checkpoint_writer& w) const {
    w.put_array(std::span<const double>(seen));
    w.put_array(std::span<const bellows::regime>(now));
  }
  void load(bellows::checkpoint_reader& r) {
    r.get_array(std::span<double>(seen), "seen");
    r.get_array(std::span<bellows::regime>(now), "regimes");
  }
};

std::vector<float> grad(std::size_t n, std::size_t rank, std::size_t layer, int step) {
  return bellows::testing::normal_floats(n, 1000003 * static_cast<std::uint64_t>(step) + 101 * layer + rank);
}

const bellows::shape shapes[] = {bellows::shape{20, 30}, bellows::shape{30}, bellows::shape{4, 3, 3, 3}};

}  // namespace

TEST_CASE("synchronizer: equals calling the compressors by hand") {
  constexpr std::size_t w = 3;
  local_group group(w);
  std::atomic<int> right{0};
  group.run([&](local& comm) {
    bellows::cpu::executor exec(1);
    bellows::synchronizer sync(bellows::identity<>{exec}, bellows::identity<>{exec},
                               bellows::static_policy(bellows::regime::critical), exec);
    bellows::identity<> by_hand(exec);
    std::vector<bellows::identity<>::state> states;
    for (std::uint32_t id = 0; id < 3; ++id) {
      CHECK(sync.add_layer(numbered("layer", id), shapes[id]) == id);
      states.push_back(by_hand.make_state(sync.layer(id)));
    }
    bool ok = true;
    for (int s = 0; s < 4; ++s) {
      std::vector<std::vector<float>> a, b;
      for (std::size_t id = 0; id < 3; ++id) {
        a.push_back(grad(shapes[id].size(), comm.rank(), id, s));
        b.push_back(a.back());
      }
      std::vector<std::span<float>> views(a.begin(), a.end());
      const auto statuses = sync.step(views, comm);
      for (std::size_t id = 0; id < 3; ++id) {
        (void)by_hand.reduce(states[id], b[id], comm);
        ok = ok && statuses[id] == bellows::step_status::ok && a[id] == b[id];
      }
    }
    (void)sync.end_epoch(0.1f, comm);
    ok = ok && sync.total_sent().bytes == 4 * (3 * 4 + 4 * (600 + 30 + 108));
    ok = ok && sync.telemetry()[1].steps == 4 && sync.telemetry()[1].sent.elements == 4 * (30 + 1);
    if (ok) ++right;
  });
  CHECK(right == static_cast<int>(w));
}

TEST_CASE("synchronizer: critical layers run the low compressor, the others the high one") {
  local_group group(2);
  std::atomic<int> right{0};
  group.run([&](local& comm) {
    using R = bellows::regime;
    scripted d{{{R::normal, R::critical}, {R::critical, R::normal}}, {}, {}};
    bellows::synchronizer sync(tagged(1), tagged(2), d);
    sync.add_layer("a", bellows::shape{8});
    sync.add_layer("b", bellows::shape{8});
    auto run_step = [&] {
      std::vector<float> x(8, 1.0f), y(8, 2.0f);
      std::vector<std::span<float>> v{x, y};
      (void)sync.step(v, comm);
    };
    run_step();  // before any decision: both critical -> low (tag 1)
    bool ok = sync.telemetry()[0].sent.kept == 1 && sync.telemetry()[1].sent.kept == 1;
    const auto levels = sync.end_epoch(0.1f, comm);
    ok = ok && levels[0] == R::normal && sync.telemetry()[0].level == R::normal;
    run_step();  // a: high (2), b: low (1)
    ok = ok && sync.telemetry()[0].sent.kept == 3 && sync.telemetry()[1].sent.kept == 2;
    (void)sync.end_epoch(0.1f, comm);
    run_step();  // a: low, b: high
    ok = ok && sync.telemetry()[0].sent.kept == 4 && sync.telemetry()[1].sent.kept == 4;
    if (ok) ++right;
  });
  CHECK(right == 2);
}

TEST_CASE("synchronizer: with a detector that never observes, a step exchanges what its compressors do and no more") {
  constexpr std::size_t w = 2;
  local_group group(w);
  std::atomic<int> right{0};
  group.run([&](local& comm) {
    bellows::cpu::executor exec(1);
    bellows::synchronizer sync(bellows::identity<>{exec}, bellows::identity<>{exec},
                               bellows::static_policy(bellows::regime::critical), exec);
    for (std::uint32_t id = 0; id < 3; ++id) (void)sync.add_layer(numbered("layer", id), shapes[id]);
    sync.set_bucket_bytes(0);  // a layer per bucket: each layer's reduce
    std::vector<std::vector<float>> g;
    for (std::size_t id = 0; id < 3; ++id) g.push_back(grad(shapes[id].size(), comm.rank(), id, 0));
    if (comm.rank() == 1) g[2][0] = std::numeric_limits<float>::quiet_NaN();
    std::vector<std::span<float>> v(g.begin(), g.end());
    (void)sync.step(v, comm);  // the first step also checks the layers (one allreduce)
    bellows::collectives::counting counted(comm);
    const auto statuses = sync.step(v, counted);
    // identity: a one-float allreduce of the non-finite flag per layer, then the data of the two
    // finite layers; no flag exchange of the synchronizer's own.
    bool ok = counted.allreduce().calls == 3 + 2 && counted.allgather().calls == 0;
    ok = ok && statuses[2] == bellows::step_status::non_finite && statuses[0] == bellows::step_status::ok;
    // The same in one bucket: one allreduce of the three flags, one of the three layers' data
    // (the non-finite one rides along, changing nothing); the same statuses.
    bellows::synchronizer one(bellows::identity<>{exec}, bellows::identity<>{exec},
                              bellows::static_policy(bellows::regime::critical), exec);
    for (std::uint32_t id = 0; id < 3; ++id) (void)one.add_layer(numbered("layer", id), shapes[id]);
    (void)one.step(v, comm);
    bellows::collectives::counting bucketed(comm);
    const auto together = one.step(v, bucketed);
    ok = ok && bucketed.allreduce().calls == 2 && bucketed.allgather().calls == 0;
    ok = ok && std::ranges::equal(statuses, together) && one.buckets().size() == 2;
    ok = ok && one.telemetry()[2].sent == sync.telemetry()[2].sent;  // the skipped layer's vote only
    if (ok) ++right;
  });
  CHECK(right == static_cast<int>(w));
}

TEST_CASE("synchronizer: a NaN in one layer on one rank skips that layer on every rank, nothing changes") {
  constexpr std::size_t w = 3;
  local_group group(w);
  std::atomic<int> right{0};
  group.run([&](local& comm) {
    scripted d{{}, {}, {}};
    bellows::synchronizer sync(bellows::identity<>(), bellows::identity<>(), d);
    for (std::uint32_t id = 0; id < 3; ++id) sync.add_layer(numbered("l", id), shapes[id]);
    std::vector<std::vector<float>> g;
    for (std::size_t id = 0; id < 3; ++id) g.push_back(grad(shapes[id].size(), comm.rank(), id, 0));
    if (comm.rank() == 2) g[1][5] = std::numeric_limits<float>::infinity();
    const auto before = g;
    std::vector<std::span<float>> v(g.begin(), g.end());
    const auto statuses = sync.step(v, comm);
    bool ok = statuses[0] == bellows::step_status::ok && statuses[2] == bellows::step_status::ok &&
              statuses[1] == bellows::step_status::non_finite;
    ok = ok && g[1] == before[1];                                                 // Inf compares equal to itself
    ok = ok && sync.detector().seen[1] == 0.0 && sync.detector().seen[0] != 0.0;  // not observed
    ok = ok && sync.state(1).step == 0 && sync.state(0).step == 1;
    ok = ok && sync.telemetry()[1].skipped == 1 && sync.telemetry()[1].steps == 0;
    if (ok) ++right;
  });
  CHECK(right == static_cast<int>(w));
}

TEST_CASE("synchronizer: save and load mid-run continue bit-identically; bad files change nothing") {
  constexpr std::size_t w = 2;
  const auto dir = std::filesystem::temp_directory_path() / "bellows_sync_test";
  std::filesystem::create_directories(dir);
  using R = bellows::regime;
  const std::vector<std::vector<R>> script{{R::normal, R::critical, R::normal},
                                           {R::critical, R::normal, R::normal},
                                           {R::normal, R::normal, R::critical}};
  auto make = [&] {
    bellows::synchronizer sync(tagged(1), tagged(2), scripted{script, {}, {}});
    for (std::uint32_t id = 0; id < 3; ++id) sync.add_layer(numbered("l", id), shapes[id]);
    return sync;
  };
  // outputs[rank] = every gradient after every step, for a run of 3 epochs x 2 steps.
  auto train = [&](local& comm, auto& sync, int from_epoch, std::vector<std::vector<float>>& out) {
    for (int e = from_epoch; e < 3; ++e) {
      for (int s = 0; s < 2; ++s) {
        std::vector<std::vector<float>> g;
        for (std::size_t id = 0; id < 3; ++id) g.push_back(grad(shapes[id].size(), comm.rank(), id, 10 * e + s));
        std::vector<std::span<float>> v(g.begin(), g.end());
        (void)sync.step(v, comm);
        for (auto& x : g) out.push_back(x);
      }
      (void)sync.end_epoch(0.1f, comm);
      if (e == 0) sync.save(dir, comm);
    }
  };
  std::vector<std::vector<std::vector<float>>> straight(w), resumed(w);
  std::vector<bellows::traffic> straight_total(w), resumed_total(w);
  local_group group(w);
  group.run([&](local& comm) {
    auto sync = make();
    train(comm, sync, 0, straight[comm.rank()]);
    straight_total[comm.rank()] = sync.total_sent();
  });
  group.run([&](local& comm) {
    auto sync = make();
    // Each rank saved its own file; a truncated copy and a copy of another version are refused
    // without changing anything.
    const auto bytes = bellows::read_file(dir / numbered("rank", comm.rank(), ".ckpt"));
    const auto bad = dir / numbered("bad", comm.rank());
    std::filesystem::create_directories(bad);
    const auto bad_file = decltype(sync)::checkpoint_file(bad, comm.rank());
    bellows::write_file_atomically(bad_file, std::span(bytes).first(bytes.size() - 3));
    CHECK_THROWS_WITH_AS(sync.load(bad, comm), doctest::Contains("truncated"), bellows::wire_error);
    auto other = bytes;
    other[4] = std::byte{9};
    bellows::write_file_atomically(bad_file, other);
    CHECK_THROWS_WITH_AS(sync.load(bad, comm), doctest::Contains("version"), bellows::wire_error);
    CHECK(sync.steps() == 0);
    sync.load(dir, comm);
    CHECK(sync.epoch() == 1);
    CHECK(sync.steps() == 2);
    train(comm, sync, 1, resumed[comm.rank()]);
    resumed_total[comm.rank()] = sync.total_sent();
  });
  for (std::size_t r = 0; r < w; ++r) {
    // The resumed run's steps equal the straight run's from epoch 1 on.
    REQUIRE(resumed[r].size() == 2 * 3 * 2);
    for (std::size_t i = 0; i < resumed[r].size(); ++i) CHECK(resumed[r][i] == straight[r][3 * 2 + i]);
    CHECK(resumed_total[r] == straight_total[r]);
  }
  std::filesystem::remove_all(dir);
}

namespace {

using critical_policy = bellows::static_policy;

/// A synchronizer with state worth keeping: top-k with error memories at two ratios.
/// Where a checkpoint's epoch stands: after the magic and version (4 bytes each), the rank, world
/// size and layer count (8 each), each layer's name and dimensions (8 bytes of count and 8 a
/// dimension, and the name's letters), and the step count.
template <class Sync>
std::size_t epoch_offset(const Sync& sync) {
  std::size_t at = 32;
  for (std::size_t id = 0; id < sync.layers(); ++id)
    at += 16 + sync.layer(id).name.size() + 8 * sync.layer(id).shape.rank();
  return at + 8;
}

auto make_topk_sync() {
  bellows::synchronizer sync(bellows::topk<>({.ratio = 0.1}), bellows::topk<>({.ratio = 0.05}),
                             critical_policy(bellows::regime::critical));
  for (std::uint32_t id = 0; id < 3; ++id) sync.add_layer(numbered("l", id), shapes[id]);
  return sync;
}

std::vector<std::vector<float>> grads_of(std::size_t rank, int step) {
  std::vector<std::vector<float>> g;
  for (std::size_t id = 0; id < 3; ++id) g.push_back(grad(shapes[id].size(), rank, id, step));
  return g;
}

/// Forwards to a local collective, except that on rank `fail_rank` operation number `fail_at`
/// (counted from 0) throws instead, as a worker that loses its device mid-step would.
struct failing_collective {
  local& inner;
  std::size_t fail_rank;
  int fail_at;
  int ops = 0;
  [[nodiscard]] std::size_t rank() const { return inner.rank(); }
  [[nodiscard]] std::size_t size() const { return inner.size(); }
  void next() {
    if (ops++ == fail_at && inner.rank() == fail_rank) throw std::runtime_error("rank 1 lost its device");
  }
  void allreduce_sum(std::span<float> v) {
    next();
    inner.allreduce_sum(v);
  }
  void allgather(std::span<const std::byte> mine, bellows::gather_buffer& out) {
    next();
    inner.allgather(mine, out);
  }
};

/// group.run(fn), but a group still running after 60 s is aborted and the test fails, so that
/// a hang shows as a failure.
template <class Fn>
void run_or_fail_on_hang(local_group& group, Fn&& fn) {
  auto done = std::async(std::launch::async, [&] { group.run(fn); });
  if (done.wait_for(std::chrono::seconds(60)) == std::future_status::timeout) {
    group.abort("the test's watchdog: no progress for 60 s");
    done.wait();
    FAIL_CHECK("the group hung");
  }
  done.get();
}

}  // namespace

TEST_CASE("synchronizer: a gradient of the wrong length, or too few of them, raise naming the layer; nothing changes") {
  local_group group(2);
  std::atomic<int> right{0};
  group.run([&](local& comm) {
    auto sync = make_topk_sync();
    {
      auto g = grads_of(comm.rank(), 0);  // a first step, so there are memories to keep
      std::vector<std::span<float>> v(g.begin(), g.end());
      (void)sync.step(v, comm);
    }
    const auto before = sync.checkpoint(comm);
    auto g = grads_of(comm.rank(), 1);
    const auto original = g;
    g[1].push_back(0.5f);  // layer l1 of shape 30 gets 31 values
    std::vector<std::span<float>> v(g.begin(), g.end());
    bool ok = false;
    try {
      (void)sync.step(v, comm);
    } catch (const bellows::error& e) {
      const std::string what = e.what();
      ok = what.find("layer 'l1' of shape 30 has 30 elements, its gradient 31") != std::string::npos;
    }
    ok = ok && g[0] == original[0] && g[2] == original[2];  // no layer was reduced
    ok = ok && sync.checkpoint(comm) == before && sync.steps() == 1 && sync.telemetry()[0].steps == 1;
    try {
      (void)sync.step(std::span(v).first(2), comm);
      ok = false;
    } catch (const bellows::error& e) {
      ok = ok && std::string(e.what()).find("2 gradients for 3 registered layers") != std::string::npos;
    }
    ok = ok && sync.checkpoint(comm) == before;
    // Nothing was exchanged either: the ranks are still in step for the next good call.
    g = original;
    std::vector<std::span<float>> good(g.begin(), g.end());
    for (bellows::step_status s : sync.step(good, comm)) ok = ok && s == bellows::step_status::ok;
    ok = ok && sync.steps() == 2;
    if (ok) ++right;
  });
  CHECK(right == 2);
}

TEST_CASE("synchronizer: ranks that registered another count, name, order or shape of layers all raise, naming the "
          "difference") {
  constexpr std::size_t w = 3;
  struct variant {
    const char* what;
    std::vector<std::pair<std::string, bellows::shape>> odd;  // the layers of rank 2
    std::string usual_says, odd_says;                         // what ranks 0 and 1, and rank 2, raise
  };
  const std::vector<std::pair<std::string, bellows::shape>> usual{{"fc1", bellows::shape{10, 4}},
                                                                  {"fc2", bellows::shape{4}}};
  const std::string counts = "the ranks registered different numbers of layers: this rank ";
  const std::string differs = "the ranks registered different layers: layer ";
  for (const variant& v :
       {variant{"an extra layer",
                {{"fc1", bellows::shape{10, 4}}, {"fc2", bellows::shape{4}}, {"fc3", bellows::shape{4}}},
                counts + "2, the mean over the 3 ranks 2.33",
                counts + "3, the mean over the 3 ranks 2.33"},
        variant{"a missing layer", {{"fc1", bellows::shape{10, 4}}}, counts + "2, the mean", counts + "1, the mean"},
        variant{"another name",
                {{"fc1", bellows::shape{10, 4}}, {"fc2.bias", bellows::shape{4}}},
                differs + "1 differs between ranks; this rank has 'fc2' of shape 4",
                differs + "1 differs between ranks; this rank has 'fc2.bias' of shape 4"},
        variant{"another order",
                {{"fc2", bellows::shape{4}}, {"fc1", bellows::shape{10, 4}}},
                differs + "0 differs between ranks; this rank has 'fc1' of shape 10x4",
                differs + "0 differs between ranks; this rank has 'fc2' of shape 4"},
        variant{"another shape",
                {{"fc1", bellows::shape{4, 10}}, {"fc2", bellows::shape{4}}},
                differs + "0 differs between ranks; this rank has 'fc1' of shape 10x4",
                differs + "0 differs between ranks; this rank has 'fc1' of shape 4x10"}}) {
    CAPTURE(v.what);
    local_group group(w);
    std::vector<std::string> messages(w);
    CHECK_THROWS_AS(run_or_fail_on_hang(group,
                                        [&](local& comm) {
                                          bellows::synchronizer sync(bellows::identity<>(), bellows::identity<>(),
                                                                     critical_policy(bellows::regime::critical));
                                          std::vector<std::vector<float>> g;
                                          for (const auto& [name, shp] : comm.rank() == 2 ? v.odd : usual) {
                                            sync.add_layer(name, shp);
                                            g.emplace_back(shp.size(), 1.0f);
                                          }
                                          std::vector<std::span<float>> views(g.begin(), g.end());
                                          try {
                                            (void)sync.step(views, comm);
                                          } catch (const bellows::error& e) {
                                            messages[comm.rank()] = e.what();
                                            throw;
                                          }
                                        }),
                    bellows::error);
    for (std::size_t r = 0; r < w; ++r) {
      CAPTURE(r);
      CHECK(messages[r].find(r == 2 ? v.odd_says : v.usual_says) != std::string::npos);
    }
  }
}

TEST_CASE("synchronizer: a worker that throws mid-step makes every other rank raise collective_error, never hang") {
  constexpr std::size_t w = 3;
  // Operations of a step, a layer per bucket: the layer check (first step only), then per layer
  // two allreduces (PowerSGD's P and Q: layer 0 is compressed at rank 2) or one (the others). The
  // failures land in the check, between P and Q, between layers and in the second step. In one
  // bucket of every layer (the default budget), a step is two allreduces (the P's, the Q's).
  const std::pair<std::size_t, int> cases[] = {{0, 0},
                                               {0, 1},
                                               {0, 2},
                                               {0, 3},
                                               {0, 4},
                                               {0, 5},
                                               {0, 7},
                                               {0, 8},
                                               {std::size_t{25} << 20, 1},
                                               {std::size_t{25} << 20, 2},
                                               {std::size_t{25} << 20, 3},
                                               {std::size_t{25} << 20, 6}};
  for (const auto& [bucket_bytes, fail_at] : cases) {
    CAPTURE(bucket_bytes);
    CAPTURE(fail_at);
    local_group group(w);
    std::atomic<int> others_failed{0}, finished{0};
    std::string rethrown;
    try {
      run_or_fail_on_hang(group, [&](local& comm) {
        failing_collective coll{comm, 1, fail_at};
        bellows::synchronizer sync(bellows::powersgd<>({.rank = 2}), bellows::powersgd<>({.rank = 1}),
                                   critical_policy(bellows::regime::critical));
        for (std::uint32_t id = 0; id < 3; ++id) sync.add_layer(numbered("l", id), shapes[id]);
        sync.set_bucket_bytes(bucket_bytes);
        try {
          for (int s = 0; s < 3; ++s) {
            auto g = grads_of(comm.rank(), s);
            std::vector<std::span<float>> v(g.begin(), g.end());
            (void)sync.step(v, coll);
          }
          ++finished;
        } catch (const bellows::collective_error&) {
          if (comm.rank() != 1) ++others_failed;
          throw;
        }
      });
    } catch (const std::exception& e) {
      rethrown = e.what();
    }
    CHECK(rethrown == "rank 1 lost its device");  // the root cause, not a consequence
    CHECK(others_failed == static_cast<int>(w) - 1);
    CHECK(finished == 0);
  }
}

TEST_CASE("synchronizer: every truncation, another version, magic, configuration or layer set, a directory and a "
          "missing file are refused and change nothing") {
  bellows::archetypes::collective solo;
  auto trained = make_topk_sync();
  for (int s = 0; s < 2; ++s) {
    auto g = grads_of(0, s);
    std::vector<std::span<float>> v(g.begin(), g.end());
    (void)trained.step(v, solo);
  }
  (void)trained.end_epoch(0.1f, solo);
  const std::vector<std::byte> bytes = trained.checkpoint(solo);

  auto fresh = make_topk_sync();
  const auto before = fresh.checkpoint(solo);
  REQUIRE(before != bytes);
  std::size_t refused = 0;
  for (std::size_t length = 0; length < bytes.size(); ++length) {
    try {
      fresh.restore(std::span(bytes).first(length), solo);
    } catch (const bellows::wire_error&) {
      ++refused;
    }
  }
  CHECK(refused == bytes.size());
  CHECK(fresh.checkpoint(solo) == before);
  auto edited = [&](std::size_t offset, std::byte value) {
    auto copy = bytes;
    copy[offset] = value;
    return copy;
  };
  auto longer = bytes;
  longer.push_back(std::byte{0});
  CHECK_THROWS_WITH_AS(fresh.restore(longer, solo), doctest::Contains("unexpected bytes"), bellows::wire_error);
  CHECK_THROWS_WITH_AS(fresh.restore(edited(0, std::byte{0}), solo), doctest::Contains("not a bellows checkpoint"),
                       bellows::wire_error);
  CHECK_THROWS_WITH_AS(fresh.restore(edited(4, std::byte{99}), solo), doctest::Contains("checkpoint version 99"),
                       bellows::wire_error);
  // magic, version (4 bytes each), rank, world size, layer count, the first name's length (8 each),
  // then its letters: 'l0' becomes 'x0'.
  CHECK_THROWS_WITH_AS(fresh.restore(edited(40, std::byte{'x'}), solo),
                       doctest::Contains("checkpoint saved for other layers: layer 0 is 'x0' of shape 20x30 in "
                                         "the file, 'l0' of shape 20x30 here"),
                       bellows::wire_error);
  // A NaN in a saved error memory would stall its layer (every later step non-finite): refused.
  {
    const std::span<const float> memory = trained.state(0).memory.values();
    const auto nonzero = std::find_if(memory.begin(), memory.end(), [](float v) { return v != 0.0f; });
    REQUIRE(nonzero != memory.end());
    const auto* pattern = reinterpret_cast<const std::byte*>(&*nonzero);
    const auto at = std::search(bytes.begin(), bytes.end(), pattern, pattern + sizeof(float));
    REQUIRE(at != bytes.end());
    auto poisoned = bytes;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(poisoned.data() + (at - bytes.begin()), &nan, sizeof nan);
    CHECK_THROWS_WITH_AS(fresh.restore(poisoned, solo), doctest::Contains("non-finite"), bellows::wire_error);
  }
  // The same layers under another configuration: top-k without error memories.
  bellows::synchronizer no_memory(bellows::topk<>({.ratio = 0.1, .feedback = bellows::feedback::none}),
                                  bellows::topk<>({.ratio = 0.05, .feedback = bellows::feedback::none}),
                                  critical_policy(bellows::regime::critical));
  for (std::uint32_t id = 0; id < 3; ++id) no_memory.add_layer(numbered("l", id), shapes[id]);
  const auto no_memory_before = no_memory.checkpoint(solo);
  CHECK_THROWS_WITH_AS(no_memory.restore(bytes, solo), doctest::Contains("expected 0"), bellows::wire_error);
  CHECK(no_memory.checkpoint(solo) == no_memory_before);
  // Files: a directory in the rank's file's place and a missing file are named.
  const auto dir = std::filesystem::temp_directory_path() / "bellows_sync_bad_files";
  std::filesystem::create_directories(dir / "rank0.ckpt");
  CHECK_THROWS_WITH_AS(fresh.load(dir, solo), doctest::Contains("not a regular file"), bellows::error);
  CHECK_THROWS_WITH_AS(fresh.load(dir / "missing", solo), doctest::Contains("missing/rank0.ckpt"), bellows::error);
  std::filesystem::remove_all(dir);
  CHECK(fresh.checkpoint(solo) == before);
  // And the intact bytes restore completely.
  fresh.restore(bytes, solo);
  CHECK(fresh.checkpoint(solo) == bytes);
}

TEST_CASE("synchronizer: a save killed half-way (a real child process, SIGKILL) leaves the previous checkpoint") {
  const auto dir = std::filesystem::temp_directory_path() / "bellows_sync_killed_save";
  std::filesystem::remove_all(dir);
  bellows::archetypes::collective solo;
  auto sync = make_topk_sync();
  auto one_step = [&](int s) {
    auto g = grads_of(0, s);
    std::vector<std::span<float>> v(g.begin(), g.end());
    (void)sync.step(v, solo);
  };
  one_step(0);
  sync.save(dir, solo);
  const auto saved = sync.checkpoint(solo);
  one_step(1);
  for (const auto stage :
       {bellows::detail::atomic_write_stage::half_written, bellows::detail::atomic_write_stage::flushed}) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      static bellows::detail::atomic_write_stage at;
      at = stage;
      bellows::detail::atomic_write_probe = [](bellows::detail::atomic_write_stage s) {
        if (s == at) ::raise(SIGKILL);
      };
      try {
        sync.save(dir, solo);
      } catch (...) {
      }
      ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
    auto resumed = make_topk_sync();
    resumed.load(dir, solo);
    CHECK(resumed.checkpoint(solo) == saved);
  }
  // Each killed writer left its own temporary file, which nothing reads; the next save goes on.
  std::size_t temporaries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    temporaries += entry.path().filename().string().starts_with("rank0.ckpt.tmp.") ? 1 : 0;
  CHECK(temporaries == 2);
  sync.save(dir, solo);
  auto resumed = make_topk_sync();
  resumed.load(dir, solo);
  CHECK(resumed.checkpoint(solo) == sync.checkpoint(solo));
  std::filesystem::remove_all(dir);
}

TEST_CASE("synchronizer: a layer its compressors refuse (too large for QSGD) raises naming it and registers nothing") {
  bellows::synchronizer sync(bellows::qsgd<>(), bellows::qsgd<>({.bits = 4}),
                             critical_policy(bellows::regime::critical));
  CHECK_THROWS_WITH_AS(sync.add_layer("emb.weight", bellows::shape{std::size_t{1} << 34}),
                       doctest::Contains("layer 'emb.weight' of 17179869184 elements"), bellows::error);
  CHECK(sync.layers() == 0);
  CHECK(sync.telemetry().empty());
  bellows::synchronizer fine(bellows::qsgd<>(), bellows::qsgd<>({.bits = 4}),
                             critical_policy(bellows::regime::critical));
  CHECK(fine.add_layer("fc1.weight", bellows::shape{10, 4}) == 0);
  // A checkpoint of the one-layer synchronizer does not fit the empty one.
  const bellows::rank_place solo{0, 1};
  CHECK_THROWS_WITH_AS(sync.restore(fine.checkpoint(solo), solo),
                       doctest::Contains("the checkpoint holds 1 layers and none is registered here; register every "
                                         "layer (add_layer) before load"),
                       bellows::wire_error);
}

TEST_CASE("synchronizer: a checkpoint whose detector is at another epoch than the synchronizer is refused") {
  // Found by fuzz_checkpoint_stateful: such a file restored, and every later end_epoch raised.
  bellows::archetypes::collective solo;
  auto make = [] {
    bellows::synchronizer sync(bellows::topk<>({.ratio = 0.1}), bellows::topk<>({.ratio = 0.05}),
                               bellows::accordion({.interval = 2}));
    for (std::uint32_t id = 0; id < 3; ++id) sync.add_layer(numbered("l", id), shapes[id]);
    return sync;
  };
  auto trained = make();
  auto g = grads_of(0, 0);
  std::vector<std::span<float>> v(g.begin(), g.end());
  (void)trained.step(v, solo);
  (void)trained.end_epoch(0.1f, solo);
  auto bytes = trained.checkpoint(solo);
  const std::uint64_t epoch = 5;
  std::memcpy(bytes.data() + epoch_offset(trained), &epoch, sizeof epoch);
  auto fresh = make();
  const auto before = fresh.checkpoint(solo);
  CHECK_THROWS_WITH_AS(fresh.restore(bytes, solo),
                       doctest::Contains("checkpoint of epoch 5 holds a detector at epoch 1"), bellows::wire_error);
  CHECK(fresh.checkpoint(solo) == before);
  fresh.restore(trained.checkpoint(solo), solo);
  (void)fresh.end_epoch(0.1f, solo);  // the intact file goes on
  CHECK(fresh.epoch() == 2);
}

namespace {

/// PowerSGD at rank 4 (low) and 1 (high) under a script that moves layer 0 (20 x 30) to the high
/// level after epoch 0 and back after epoch 1, and keeps layer 2 (4 x 27) low; layer 1 is a bias.
auto make_switching_powersgd(bellows::level_change change) {
  using R = bellows::regime;
  const std::vector<std::vector<R>> script{{R::normal, R::critical, R::critical},
                                           {R::critical, R::critical, R::critical}};
  bellows::synchronizer sync(bellows::powersgd<>({.rank = 4}), bellows::powersgd<>({.rank = 1}),
                             scripted{script, {}, {}});
  sync.set_level_change(change);
  for (std::uint32_t id = 0; id < 3; ++id) sync.add_layer(numbered("l", id), shapes[id]);
  return sync;
}

/// Two steps of seeded gradients (steps 2e and 2e + 1), then the end of the epoch.
template <class Sync>
void train_epoch(Sync& sync, int e) {
  bellows::archetypes::collective solo;
  for (int s = 2 * e; s < 2 * e + 2; ++s) {
    auto g = grads_of(0, s);
    std::vector<std::span<float>> v(g.begin(), g.end());
    (void)sync.step(v, solo);
  }
  (void)sync.end_epoch(0.1f, solo);
}

std::vector<float> copy_of(std::span<const float> x) { return {x.begin(), x.end()}; }
bool all_zero(std::span<const float> x) {
  return std::ranges::all_of(x, [](float y) { return y == 0.0f; });
}

}  // namespace

TEST_CASE("synchronizer: level change keep carries a switching layer's state over, reset starts it afresh") {
  bellows::archetypes::collective solo;
  auto keep = make_switching_powersgd(bellows::level_change::keep);
  auto reset = make_switching_powersgd(bellows::level_change::reset);
  train_epoch(keep, 0);
  train_epoch(reset, 0);

  // The state layer 0 would start from at rank 1, as a new reducer would build it.
  const bellows::powersgd<> rank1({.rank = 1}), rank4({.rank = 4});
  const auto fresh1 = rank1.make_state(keep.layer(0));
  // keep: the memory and the first query column of the rank-4 state are still there.
  const auto& kept = keep.state(0);
  CHECK(!all_zero(kept.memory.span()));
  CHECK(kept.step == 2);
  // reset: memory zero, query = the fresh rank-1 draw, the step counter carried over.
  const auto& was_reset = reset.state(0);
  CHECK(all_zero(was_reset.memory.span()));
  CHECK(was_reset.query == fresh1.query);
  CHECK(was_reset.step == 2);
  // The warm-started query has moved away from the first draw.
  CHECK(!std::ranges::equal(kept.query.span().first(30), fresh1.query.span()));
  // A layer that did not switch is untouched by reset.
  CHECK(copy_of(reset.state(2).memory.span()) == copy_of(keep.state(2).memory.span()));
  CHECK(reset.state(2).query == keep.state(2).query);

  // The next step of the reset layer equals a rank-1 compressor's on a fresh state, bit for bit.
  auto by_hand_state = rank1.make_state(reset.layer(0));
  bellows::powersgd<> rank1_compressor({.rank = 1});
  auto g = grads_of(0, 4);
  std::vector<float> want = g[0];
  (void)rank1_compressor.reduce(by_hand_state, want, solo);
  std::vector<std::span<float>> v(g.begin(), g.end());
  (void)reset.step(v, solo);
  CHECK(g[0] == want);

  // Back to rank 4 after epoch 1: reset draws the rank-4 query afresh and zeroes the memory again.
  (void)reset.step(v, solo);
  (void)reset.end_epoch(0.1f, solo);
  CHECK(reset.state(0).query == rank4.make_state(reset.layer(0)).query);
  CHECK(all_zero(reset.state(0).memory.span()));
  CHECK(reset.state(0).step == 4);
  // keep, the same way back: the column rank 1 trained and the memory stay; the next rank-4 step
  // draws only columns 1 to 3.
  train_epoch(keep, 1);
  CHECK(keep.state(0).query.size() == 30);
  CHECK(keep.state(0).query != fresh1.query);
  CHECK(!all_zero(keep.state(0).memory.span()));
}

TEST_CASE("synchronizer: top-k under level change reset zeroes the memory of a switching layer only") {
  using R = bellows::regime;
  const std::vector<std::vector<R>> script{{R::normal, R::critical, R::critical}};
  bellows::synchronizer sync(bellows::topk<>({.ratio = 0.5}), bellows::topk<>({.ratio = 0.1}),
                             scripted{script, {}, {}});
  sync.set_level_change(bellows::level_change::reset);
  for (std::uint32_t id = 0; id < 3; ++id) sync.add_layer(numbered("l", id), shapes[id]);
  bellows::archetypes::collective solo;
  auto g = grads_of(0, 0);
  std::vector<std::span<float>> v(g.begin(), g.end());
  (void)sync.step(v, solo);
  const std::vector<float> memory2 = copy_of(sync.state(2).memory.values());
  REQUIRE(!all_zero(sync.state(0).memory.values()));
  (void)sync.end_epoch(0.1f, solo);
  CHECK(all_zero(sync.state(0).memory.values()));
  CHECK(sync.state(0).step == 1);
  CHECK(copy_of(sync.state(2).memory.values()) == memory2);
}

TEST_CASE("synchronizer: a checkpoint records the level change and restores only under the same one") {
  const bellows::rank_place solo{0, 1};
  auto reset = make_switching_powersgd(bellows::level_change::reset);
  train_epoch(reset, 0);
  const std::vector<std::byte> bytes = reset.checkpoint(solo);
  auto keep = make_switching_powersgd(bellows::level_change::keep);
  const auto before = keep.checkpoint(solo);
  CHECK_THROWS_WITH_AS(keep.restore(bytes, solo),
                       doctest::Contains("saved with level change 'reset', this synchronizer is set to 'keep'"),
                       bellows::wire_error);
  CHECK(keep.checkpoint(solo) == before);
  auto invalid = bytes;
  invalid[epoch_offset(reset) + 8] = std::byte{7};  // the option follows the epoch
  auto other_reset = make_switching_powersgd(bellows::level_change::reset);
  CHECK_THROWS_WITH_AS(other_reset.restore(invalid, solo), doctest::Contains("invalid level change"),
                       bellows::wire_error);
  // Restored under reset it goes on as the original: epoch 1 switches layer 0 back, afresh.
  other_reset.restore(bytes, solo);
  train_epoch(reset, 1);
  train_epoch(other_reset, 1);
  CHECK(other_reset.checkpoint(solo) == reset.checkpoint(solo));
}

namespace {

/// The layer set and levels of the PowerSGD seeds of fuzz/fuzz_checkpoint_stateful.cpp.
auto powersgd_seed_sync(bellows::cpu::executor& exec) {
  bellows::synchronizer sync(bellows::powersgd<>({.rank = 2}, exec), bellows::powersgd<>({.rank = 1}, exec),
                             bellows::accordion({.interval = 2}, exec), exec);
  sync.add_layer("conv.weight", bellows::shape{16, 2, 2, 2});
  sync.add_layer("conv.bias", bellows::shape{16});
  sync.add_layer("fc.weight", bellows::shape{10, 24});
  return sync;
}

/// The checkpoint of a fuzz seed of tests/corpus (the bytes after the seed's first byte, which
/// picks its layer set), saved by `version`.
std::vector<std::byte> seed_checkpoint(const char* file, std::uint32_t version) {
  const std::vector<std::byte> seed = bellows::read_file(std::filesystem::path(BELLOWS_TEST_CORPUS) / file);
  std::vector<std::byte> bytes(seed.begin() + 1, seed.end());
  std::uint32_t saved_by = 0;
  std::memcpy(&saved_by, bytes.data() + 4, sizeof saved_by);
  REQUIRE(saved_by == version);
  return bytes;
}

}  // namespace

TEST_CASE("synchronizer: a version-2 checkpoint, saved before the level-change option, loads as keep") {
  bellows::cpu::executor exec(1);
  // checkpoint_v2/ holds the file as version 2 wrote it; checkpoint_stateful/ the same state in
  // version 3 (keep).
  const std::vector<std::byte> old_bytes = seed_checkpoint("checkpoint_v2/powersgd_epoch3", 2);
  const std::vector<std::byte> new_bytes = seed_checkpoint("checkpoint_stateful/powersgd_epoch3", 3);
  const bellows::rank_place solo{0, 1};
  auto sync = powersgd_seed_sync(exec);
  sync.restore(old_bytes, solo);
  CHECK(sync.epoch() == 3);
  auto from_v3 = powersgd_seed_sync(exec);
  from_v3.restore(new_bytes, solo);
  CHECK(sync.checkpoint(solo) == from_v3.checkpoint(solo));  // all of it
  // A synchronizer set to reset refuses it: those runs kept their state across level changes.
  auto reset = powersgd_seed_sync(exec);
  reset.set_level_change(bellows::level_change::reset);
  const auto before = reset.checkpoint(solo);
  CHECK_THROWS_WITH_AS(reset.restore(old_bytes, solo), doctest::Contains("level change 'keep'"), bellows::wire_error);
  CHECK(reset.checkpoint(solo) == before);
}

TEST_CASE("synchronizer: a version-4 checkpoint, saved before buckets, loads with none and saves as version 5") {
  bellows::cpu::executor exec(1);
  const std::vector<std::byte> v4 = seed_checkpoint("checkpoint_stateful/powersgd_epoch3_v4", 4);
  const bellows::rank_place solo{0, 1};
  auto sync = powersgd_seed_sync(exec);
  sync.restore(v4, solo);
  CHECK(sync.buckets().empty());
  // Version 5 writes the same record with its version and, after the level change, a bucket
  // count of 0 (8 bytes): nothing else of the file changed.
  const std::vector<std::byte> v5 = sync.checkpoint(solo);
  REQUIRE(v5.size() == v4.size() + 8);
  std::uint32_t version = 0;
  std::memcpy(&version, v5.data() + 4, sizeof version);
  CHECK(version == 5);
  std::size_t at = 8;
  while (at < v4.size() && v5[at] == v4[at]) ++at;
  bool zeros = true;
  for (std::size_t i = at; i < at + 8; ++i) zeros = zeros && v5[i] == std::byte{0};
  CHECK(zeros);
  CHECK(std::equal(v4.begin() + static_cast<std::ptrdiff_t>(at), v4.end(),
                   v5.begin() + static_cast<std::ptrdiff_t>(at + 8)));
  CHECK(std::equal(v4.begin() + 8, v4.begin() + static_cast<std::ptrdiff_t>(at), v5.begin() + 8));
  // The next step plans the buckets from the budget: all three layers in one.
  std::vector<std::vector<float>> g;
  for (std::size_t id = 0; id < sync.layers(); ++id) g.emplace_back(sync.layer(id).size(), 0.5f);
  std::vector<std::span<float>> v(g.begin(), g.end());
  bellows::archetypes::collective one;
  (void)sync.step(v, one);
  CHECK(std::ranges::equal(sync.buckets(), std::vector<std::uint32_t>{0, 3}));
}

TEST_CASE("synchronizer: each rank saves its own file; a file of another rank or world size is refused naming both, "
          "and changes nothing") {
  constexpr std::size_t w = 3;
  const auto dir = std::filesystem::temp_directory_path() / "bellows_sync_rank_files";
  std::filesystem::remove_all(dir);
  local_group group(w);
  std::vector<std::vector<std::byte>> saved(w);
  group.run([&](local& comm) {
    auto sync = make_topk_sync();
    auto g = grads_of(comm.rank(), 0);
    std::vector<std::span<float>> v(g.begin(), g.end());
    (void)sync.step(v, comm);
    sync.save(dir, comm);  // all at once, into one directory
    saved[comm.rank()] = sync.checkpoint(comm);
  });
  for (std::size_t r = 0; r < w; ++r) {
    CAPTURE(r);
    using sync_type = decltype(make_topk_sync());
    CHECK(bellows::read_file(sync_type::checkpoint_file(dir, r)) == saved[r]);
    CHECK(saved[r] != saved[(r + 1) % w]);  // the memories differ
  }
  std::vector<std::string> other_rank(w), other_world(w);
  std::atomic<int> unchanged{0}, resumed{0};
  group.run([&](local& comm) {
    auto sync = make_topk_sync();
    const auto before = sync.checkpoint(comm);
    try {
      sync.restore(saved[(comm.rank() + 1) % w], comm);
    } catch (const bellows::wire_error& e) {
      other_rank[comm.rank()] = e.what();
    }
    try {
      sync.load(dir, bellows::rank_place{comm.rank() % 2, 2});
    } catch (const bellows::wire_error& e) {
      other_world[comm.rank()] = e.what();
    }
    if (sync.checkpoint(comm) == before && sync.steps() == 0) ++unchanged;
    sync.load(dir, comm);
    if (sync.checkpoint(comm) == saved[comm.rank()] && sync.steps() == 1) ++resumed;
  });
  CHECK(unchanged == static_cast<int>(w));
  CHECK(resumed == static_cast<int>(w));
  for (std::size_t r = 0; r < w; ++r) {
    CAPTURE(r);
    CHECK(other_rank[r].find(numbered("the checkpoint is rank ", (r + 1) % w, "'s of 3 ranks, this is rank ") +
                             numbered("", r, " of 3")) != std::string::npos);
    CHECK(other_world[r].find(numbered("rank", r % 2, ".ckpt: synchronizer: the checkpoint is rank ") +
                              numbered("", r % 2, "'s of 3 ranks, this is rank ") + numbered("", r % 2, " of 2")) !=
          std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("synchronizer: the elastic restart keeps levels, detector and counters at another world size, and starts "
          "the memories fresh") {
  const auto dir = std::filesystem::temp_directory_path() / "bellows_sync_elastic";
  std::filesystem::remove_all(dir);
  // Three ranks train an epoch of PowerSGD 4 <-> 1 (layer 0 moves to the high level) and save.
  std::vector<std::vector<std::byte>> saved(3);
  std::vector<double> seen0;
  std::vector<bellows::regime> levels0;
  local_group three(3);
  three.run([&](local& comm) {
    auto sync = make_switching_powersgd(bellows::level_change::keep);
    for (int s = 0; s < 2; ++s) {
      auto g = grads_of(comm.rank(), s);
      std::vector<std::span<float>> v(g.begin(), g.end());
      (void)sync.step(v, comm);
    }
    (void)sync.end_epoch(0.1f, comm);
    sync.save(dir, comm);
    saved[comm.rank()] = sync.checkpoint(comm);
    if (comm.rank() == 0) {
      seen0 = sync.detector().seen;
      for (const bellows::layer_telemetry& t : sync.telemetry()) levels0.push_back(t.level);
    }
  });
  REQUIRE(levels0 == std::vector{bellows::regime::normal, bellows::regime::critical, bellows::regime::critical});
  // Two ranks restart from it: every one reads rank 0's file.
  local_group two(2);
  std::atomic<int> right{0};
  std::vector<std::string> strict(2);
  two.run([&](local& comm) {
    auto sync = make_switching_powersgd(bellows::level_change::keep);
    try {
      sync.load(dir, comm);  // the strict load refuses the world size
    } catch (const bellows::wire_error& e) {
      strict[comm.rank()] = e.what();
    }
    sync.load_elastic(dir, comm);
    bool ok = sync.epoch() == 1 && sync.steps() == 2 && sync.detector().seen == seen0;
    for (std::size_t id = 0; id < 3; ++id) {
      ok = ok && sync.telemetry()[id].level == levels0[id] && sync.telemetry()[id].steps == 2;
      ok = ok && sync.state(id).step == 2 && all_zero(sync.state(id).memory.span());
    }
    // The same state as a fresh synchronizer of each layer's level (PowerSGD's fresh query).
    auto fresh = make_switching_powersgd(bellows::level_change::keep);
    ok = ok && fresh.state(1).query == sync.state(1).query;               // still at the low level: rank 4
    ok = ok && sync.state(0).query.size() < fresh.state(0).query.size();  // at the high level: rank 1
    // And it trains on, at two ranks.
    auto g = grads_of(comm.rank(), 2);
    std::vector<std::span<float>> v(g.begin(), g.end());
    for (const bellows::step_status st : sync.step(v, comm)) ok = ok && st == bellows::step_status::ok;
    (void)sync.end_epoch(0.1f, comm);
    ok = ok && sync.epoch() == 2 && !all_zero(sync.state(0).memory.span());
    if (ok) ++right;
  });
  CHECK(right == 2);
  for (std::size_t r = 0; r < 2; ++r)
    CHECK(strict[r].find(numbered("of 3 ranks, this is rank ", r, " of 2")) != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("synchronizer: a checkpoint of other layers names the first that differs, or the counts") {
  const bellows::rank_place solo{0, 1};
  const auto saved = make_topk_sync().checkpoint(solo);  // l0 20x30, l1 30, l2 4x3x3x3
  auto with = [](std::vector<std::pair<std::string, bellows::shape>> layers) {
    bellows::synchronizer sync(bellows::topk<>({.ratio = 0.1}), bellows::topk<>({.ratio = 0.05}),
                               critical_policy(bellows::regime::critical));
    for (auto& [name, shp] : layers) sync.add_layer(name, shp);
    return sync;
  };
  struct variant {
    const char* what;
    std::vector<std::pair<std::string, bellows::shape>> layers;
    const char* says;
  };
  for (const variant& v : {
           variant{"a layer less",
                   {{"l0", shapes[0]}, {"l1", shapes[1]}},
                   "the checkpoint holds 3 layers, 2 are registered here; the first missing here is 'l2' of shape "
                   "4x3x3x3"},
           variant{"a layer more",
                   {{"l0", shapes[0]}, {"l1", shapes[1]}, {"l2", shapes[2]}, {"l3", bellows::shape{5}}},
                   "the checkpoint holds 3 layers, 4 are registered here; the first not in the file is 'l3' of "
                   "shape 5"},
           variant{"another shape",
                   {{"l0", shapes[0]}, {"l1", bellows::shape{31}}, {"l2", shapes[2]}},
                   "layer 1 is 'l1' of shape 30 in the file, 'l1' of shape 31 here"},
           variant{"another name",
                   {{"l0", shapes[0]}, {"l1", shapes[1]}, {"conv", shapes[2]}},
                   "layer 2 is 'l2' of shape 4x3x3x3 in the file, 'conv' of shape 4x3x3x3 here"},
           variant{"none", {}, "the checkpoint holds 3 layers and none is registered here; register every layer"},
       }) {
    CAPTURE(v.what);
    auto sync = with(v.layers);
    const auto before = sync.checkpoint(solo);
    CHECK_THROWS_WITH_AS(sync.restore(saved, solo), doctest::Contains(v.says), bellows::wire_error);
    CHECK(sync.checkpoint(solo) == before);
  }
  // A name of any length round-trips (the reader bounds it by the file's size).
  auto long_name = with({{std::string(5000, 'w'), shapes[0]}});
  const auto long_bytes = long_name.checkpoint(solo);
  CHECK_NOTHROW(long_name.restore(long_bytes, solo));
  CHECK(long_name.checkpoint(solo) == long_bytes);
  // A version-3 file records only a hash of the layers: its message says so. It records no rank
  // either, and loads at any place.
  const std::vector<std::byte> v3 =
      bellows::read_file(std::filesystem::path(BELLOWS_TEST_CORPUS) / "checkpoint_stateful/topk_epoch1");
  auto sync = make_topk_sync();
  CHECK_THROWS_WITH_AS(sync.restore(std::span(v3).subspan(1), solo),
                       doctest::Contains("checkpoint (version 3, which records no layer names) saved for other "
                                         "layers than the 3 registered here"),
                       bellows::wire_error);
  // The layers and levels of fuzz/fuzz_checkpoint_stateful.cpp's top-k seeds.
  bellows::synchronizer its_own(bellows::topk<>({.ratio = 0.25}), bellows::topk<>({.ratio = 0.1}),
                                bellows::static_policy(bellows::regime::normal));
  its_own.add_layer("fc1.weight", bellows::shape{12, 10});
  its_own.add_layer("fc1.bias", bellows::shape{12});
  its_own.restore(std::span(v3).subspan(1), bellows::rank_place{3, 8});
  CHECK(its_own.epoch() == 1);
}
