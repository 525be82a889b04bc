// SPDX-License-Identifier: Apache-2.0
// bellows-bench --model (tools/bellows-bench/model.hpp): the built-in models hold the tensors
// their frameworks list, and the modeled step of a method, layer by layer and in buckets, is what
// collectives::counting counts when the Synchronizer runs that step: calls, bytes and both
// modeled times, at W = 3 and 4, for every kind of round (the scatter exchange's alltoall included).
#include <bellows/collectives/counting.hpp>
#include <bellows/collectives/local.hpp>
#include <bellows/compressors/identity.hpp>
#include <bellows/compressors/powersgd.hpp>
#include <bellows/compressors/qsgd.hpp>
#include <bellows/compressors/topk.hpp>
#include <bellows/regime/static_policy.hpp>
#include <bellows/sync/synchronizer.hpp>

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "../support/random.hpp"
#include "bellows-bench/model.hpp"

namespace {

using bellows::collectives::local;
using bellows::collectives::local_group;
namespace tool = bellows::tool;

std::size_t parameters(std::span<const bellows::layer_info> layers) {
  std::size_t n = 0;
  for (const auto& l : layers) n += l.size();
  return n;
}

const bellows::shape shapes[] = {bellows::shape{30},     bellows::shape{24, 20}, bellows::shape{8, 3, 3, 3},
                                 bellows::shape{},       bellows::shape{5, 4},   bellows::shape{7, 64},
                                 bellows::shape{40, 50}, bellows::shape{6},      bellows::shape{16, 16}};

bool near(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(1.0, std::abs(b)); }

/// The second step of a synchronizer of `c` over `shapes` on W ranks, counted, against the model
/// of the same rounds, in buckets of `budget` bytes (0: a layer per bucket, the per-layer model).
template <class C>
void check_model(const C& c, std::size_t budget) {
  const bellows::collectives::alpha_beta link{30e-6, 1.25e9};
  std::vector<bellows::layer_info> layers;
  for (const auto& s : shapes)
    layers.push_back({static_cast<std::uint32_t>(layers.size()), "l" + std::to_string(layers.size()), s});
  for (const std::size_t w : {3u, 4u}) {
    CAPTURE(w);
    C probe = c;
    std::vector<bellows::exchange_rounds> rounds;
    for (const auto& l : layers) rounds.push_back(probe.rounds(probe.make_state(l), w));
    const auto bounds = bellows::plan_buckets(layers, budget);
    const tool::step_model m =
        budget == 0 ? tool::per_layer(rounds, w, link) : tool::per_bucket(rounds, bounds, w, link);
    local_group group(w);
    std::atomic<int> right{0};
    group.run([&](local& comm) {
      bellows::synchronizer sync(c, c, bellows::static_policy(bellows::regime::critical));
      for (const auto& l : layers) sync.add_layer(l.name, l.shape);
      sync.set_bucket_bytes(budget);
      bellows::collectives::counting<local> counted(comm, link);
      for (int step = 0; step < 2; ++step) {
        std::vector<std::vector<float>> g;
        for (const auto& l : layers) g.push_back(bellows::testing::normal_floats(l.size(), 10 * step + comm.rank()));
        std::vector<std::span<float>> v(g.begin(), g.end());
        counted.reset();  // the second step: no layer check
        (void)sync.step(v, counted);
      }
      const auto t = counted.total();
      bool ok = t.calls == m.calls && near(static_cast<double>(t.bytes_sent), m.handed);
      ok = ok && near(static_cast<double>(t.bytes_received), m.got);
      ok = ok && near(t.modeled_s, m.time.ring_s) && near(t.modeled_cheapest_s, m.time.cheapest_s);
      if (ok) ++right;
    });
    CHECK(right == static_cast<int>(w));
  }
}

}  // namespace

TEST_CASE("model: the built-in models hold their frameworks' tensors") {
  const auto r = tool::resnet50();
  CHECK(r.size() == 161);  // torchvision's resnet50().named_parameters()
  CHECK(parameters(r) == 25557032);
  CHECK(r.front().name == "conv1.weight");
  CHECK(r[r.size() - 2].shape == bellows::shape{1000, 2048});
  const auto b = tool::bert_base();
  CHECK(b.size() == 199);  // BertModel (bert-base-uncased), pooler included
  CHECK(parameters(b) == 109482240);
  for (std::size_t i = 0; i < b.size(); ++i) CHECK(b[i].id == i);
}

TEST_CASE("model: the modeled step is what counting counts of the Synchronizer's step") {
  for (const std::size_t budget : {std::size_t{0}, std::size_t{2048}, std::size_t{25} << 20}) {
    CAPTURE(budget);
    check_model(bellows::identity<>(), budget);
    check_model(bellows::powersgd<>({.rank = 2}), budget);
    check_model(bellows::qsgd<>({.bits = 4, .bucket = 64}), budget);
    check_model(bellows::qsgd<>({.bits = 4, .bucket = 64, .exchange = bellows::exchange::scatter}), budget);
    check_model(bellows::topk<>({.ratio = 0.05, .exchange = bellows::exchange::scatter}), budget);
    check_model(bellows::topk<>({.ratio = 0.3}), budget);  // dense switch beside payloads at W = 4
  }
}

TEST_CASE("model: a layer list from JSON, and files that are not one") {
  const auto dir = std::filesystem::temp_directory_path() / ("bellows_model_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto write = [&](const char* name, const char* text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  const auto ok =
      tool::load_model(write("ok.json", R"({"layers": [{"name": "w", "shape": [3, 4]}, {"name": "b", "shape": []}]})"));
  REQUIRE(ok.size() == 2);
  CHECK(ok[0].shape == bellows::shape{3, 4});
  CHECK(ok[1].size() == 1);
  CHECK_THROWS_WITH_AS(tool::load_model(write("bad.json", R"({"layer": []})")), doctest::Contains("not a layer list"),
                       tool::input_error);
  CHECK_THROWS_WITH_AS(tool::load_model(write("empty.json", R"({"layers": []})")), doctest::Contains("no layers"),
                       tool::input_error);
  CHECK_THROWS_WITH_AS(
      tool::load_model(write("deep.json", R"({"layers": [{"name": "x", "shape": [1,1,1,1,1,1,1,1,1]}]})")),
      doctest::Contains("more than"), tool::input_error);
  CHECK_THROWS_WITH_AS(tool::load_model((dir / "missing.json").string()), doctest::Contains("neither a built-in model"),
                       tool::input_error);
  CHECK_THROWS_AS((void)tool::parse_link("30"), std::invalid_argument);
  CHECK_THROWS_AS((void)tool::parse_link("30,0"), std::invalid_argument);
  CHECK_THROWS_AS((void)tool::parse_link("x,1"), std::invalid_argument);
  CHECK(tool::parse_link("30,1.25").latency_s == doctest::Approx(30e-6));
  std::filesystem::remove_all(dir);
}
