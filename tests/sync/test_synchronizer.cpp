// SPDX-License-Identifier: Apache-2.0
#include <bellows/collectives/local.hpp>
#include <bellows/compressors/identity.hpp>
#include <bellows/regime/static_policy.hpp>
#include <bellows/sync/synchronizer.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

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
/// level ran.
struct tagged : bellows::identity<> {
  std::uint64_t tag;
  explicit tagged(std::uint64_t t) : tag(t) {}
  template <bellows::Collective Coll>
  bellows::reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    bellows::reduce_result r = identity::reduce(st, inout, coll);
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
    ok = ok && g[1] == before[1];  // Inf compares equal to itself
    ok = ok && sync.detector().seen[1] == 0.0 && sync.detector().seen[0] != 0.0;  // not observed
    ok = ok && sync.state(1).step == 0 && sync.state(0).step == 1;
    ok = ok && sync.telemetry()[1].skipped == 1 && sync.telemetry()[1].steps == 0;
    if (ok) ++right;
  });
  CHECK(right == static_cast<int>(w));
}

TEST_CASE("synchronizer: ranks that registered different layers all raise") {
  constexpr std::size_t w = 3;
  local_group group(w);
  std::atomic<int> raised{0};
  CHECK_THROWS_AS(group.run([&](local& comm) {
    bellows::synchronizer sync(bellows::identity<>(), bellows::identity<>(),
                               bellows::static_policy(bellows::regime::critical));
    sync.add_layer("fc1", bellows::shape{10, 4});
    sync.add_layer("fc2", comm.rank() == 1 ? bellows::shape{4, 10} : bellows::shape{10, 4});
    std::vector<float> a(40), b(40);
    std::vector<std::span<float>> v{a, b};
    try {
      (void)sync.step(v, comm);
    } catch (const bellows::error& e) {
      if (std::string(e.what()).find("different layers") != std::string::npos) ++raised;
      throw;
    }
  }), bellows::error);
  CHECK(raised == static_cast<int>(w));
}

TEST_CASE("synchronizer: save and load mid-run continue bit-identically; bad files change nothing") {
  constexpr std::size_t w = 2;
  const auto dir = std::filesystem::temp_directory_path() / "bellows_sync_test";
  std::filesystem::create_directories(dir);
  using R = bellows::regime;
  const std::vector<std::vector<R>> script{{R::normal, R::critical, R::normal}, {R::critical, R::normal, R::normal},
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
      if (e == 0) sync.save(dir / numbered("r", comm.rank(), ".ckpt"));
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
    const auto file = dir / numbered("r", comm.rank(), ".ckpt");
    // A truncated copy and a copy of another version are refused without changing anything.
    const auto bytes = bellows::read_file(file);
    const auto bad = dir / numbered("bad", comm.rank());
    bellows::write_file_atomically(bad, std::span(bytes).first(bytes.size() - 3));
    CHECK_THROWS_WITH_AS(sync.load(bad), doctest::Contains("truncated"), bellows::wire_error);
    auto other = bytes;
    other[4] = std::byte{9};
    bellows::write_file_atomically(bad, other);
    CHECK_THROWS_WITH_AS(sync.load(bad), doctest::Contains("version"), bellows::wire_error);
    CHECK(sync.steps() == 0);
    sync.load(file);
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
