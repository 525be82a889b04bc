// SPDX-License-Identifier: Apache-2.0
// The Fashion-MNIST comparison (examples/fmnist/runs.hpp, report.hpp, svg.hpp): the quick
// configuration of scripts/demo.sh --quick trained for real and its files checked, and the
// summary's verdict logic on results made up by hand.
#include "fmnist/report.hpp"
#include "fmnist/runs.hpp"
#include "fmnist/svg.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fmnist_data.hpp"

namespace {

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in, "cannot open " << path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// A made-up run: final accuracy `accuracy`, `floats` sent in all, levels all `l`.
fmnist::run_result made_up(fmnist::run_spec spec, std::uint64_t seed, double accuracy, std::uint64_t floats,
                           fmnist::level l = fmnist::level::low) {
  fmnist::run_result r;
  r.spec = spec;
  r.seed = seed;
  r.layers = {{0, "w", bellows::shape{4, 4}}, {1, "b", bellows::shape{4}}};
  fmnist::epoch_record e;
  e.report.test_accuracy = accuracy;
  e.report.sent.elements = floats;
  e.report.sent.bytes = 4 * floats;
  e.levels = {l, fmnist::level::dense};
  r.epochs.push_back(e);
  r.seconds = 1;
  return r;
}

}  // namespace

TEST_CASE("fmnist demo: the quick comparison writes every run, seed, epoch and field") {
  const fmnist::dataset* data = fmnist::testing::real_data();
  if (data == nullptr) return;
  fmnist::comparison_config config = fmnist::quick_comparison();
  if (fmnist::testing::sanitized) {  // the same code on a sliver of the data
    fmnist::set_epochs(config, 2);
    config.train.train_limit = 512;
    config.train.test_limit = 64;
    config.train.batch = 16;
  }
  std::size_t progress_calls = 0;
  const std::vector<fmnist::run_result> results =
      fmnist::run_comparison(*data, config, [&](const fmnist::run_result&) { ++progress_calls; });
  const std::size_t epochs = config.train.epochs;
  REQUIRE(results.size() == config.runs.size() * config.seeds.size());
  CHECK(progress_calls == results.size() * epochs);

  const auto dir = std::filesystem::temp_directory_path() / "bellows_fmnist_demo_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  fmnist::write_results_json(dir / "results.json", config, *data, results);
  const fmnist::summary sum = fmnist::summarise(config, results);
  fmnist::write_results_md(dir / "results.md", config, *data, sum);
  fmnist::write_plots(dir, config, results);

  const nlohmann::json j = nlohmann::json::parse(read_text(dir / "results.json"));
  CHECK(j["config"]["epochs"] == epochs);
  CHECK(j["config"]["accordion"]["interval"] == config.accordion.interval);
  REQUIRE(j["layers"].size() == 6);
  CHECK(j["layers"][0]["name"] == "fc1.weight");
  CHECK(j["layers"][0]["shape"] == nlohmann::json::array({256, 784}));
  std::set<std::string> runs;
  for (const nlohmann::json& run : j["runs"]) {
    runs.insert(run["run"].get<std::string>());
    CHECK(run["label"].is_string());
    CHECK(run["seed"] == 1);
    CHECK(run["seconds"].get<double>() > 0);
    REQUIRE(run["epochs"].size() == epochs);
    std::uint64_t floats = 0;
    for (const nlohmann::json& e : run["epochs"]) {
      for (const char* field : {"epoch", "lr", "test_accuracy", "test_loss", "train_loss", "floats", "bytes", "steps",
                                "skipped_steps", "seconds"})
        CHECK_MESSAGE(e[field].is_number(), run["run"] << " lacks " << field);
      CHECK(e["test_accuracy"].get<double>() > 0.1);  // above chance after an epoch
      CHECK(e["skipped_steps"] == 0);
      CHECK(e["floats"].get<std::uint64_t>() > floats);  // a running total
      floats = e["floats"].get<std::uint64_t>();
      REQUIRE(e["levels"].size() == 6);
      for (const nlohmann::json& l : e["levels"]) CHECK((l == "low" || l == "high" || l == "dense"));
    }
    const std::string id = run["run"];
    if (id == "uncompressed") CHECK(run["epochs"][0]["levels"][0] == "dense");
    if (id.starts_with("powersgd")) CHECK(run["epochs"][0]["levels"][1] == "dense");  // a bias
    if (id.ends_with("-high")) CHECK(run["epochs"][0]["levels"][0] == "high");
    if (id.ends_with("-low") || id.ends_with("-accordion")) CHECK(run["epochs"][0]["levels"][0] == "low");
  }
  for (const fmnist::run_spec& spec : fmnist::all_runs()) CHECK_MESSAGE(runs.count(spec.id()) == 1, spec.id());

  const std::string md = read_text(dir / "results.md");
  for (const fmnist::run_spec& spec : config.runs) CHECK(md.find("| " + config.label(spec) + " |") != std::string::npos);
  CHECK(md.find("- PowerSGD: the claim ") != std::string::npos);
  CHECK(md.find("- top-k: the claim ") != std::string::npos);
  for (const char* plot : {"accuracy.svg", "floats.svg", "levels.svg"}) {
    const std::string svg = read_text(dir / plot);
    CHECK(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    CHECK(svg.ends_with("</svg>\n"));
    CHECK(md.find(std::string("](") + plot + ")") != std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("fmnist demo: the verdict compares Accordion with static low as the issue states it") {
  using fmnist::method, fmnist::policy;
  fmnist::comparison_config config;
  config.seeds = {1, 2};
  config.runs = {{method::powersgd, policy::static_low}, {method::powersgd, policy::static_high},
                 {method::powersgd, policy::accordion}};
  const auto verdict = [&](double acc1, double acc2, std::uint64_t floats) {
    const std::vector<fmnist::run_result> results{
        made_up({method::powersgd, policy::static_low}, 1, 0.890, 1000),
        made_up({method::powersgd, policy::static_low}, 2, 0.880, 1000),
        made_up({method::powersgd, policy::static_high}, 1, 0.800, 250, fmnist::level::high),
        made_up({method::powersgd, policy::static_high}, 2, 0.800, 250, fmnist::level::high),
        made_up({method::powersgd, policy::accordion}, 1, acc1, floats, fmnist::level::high),
        made_up({method::powersgd, policy::accordion}, 2, acc2, floats, fmnist::level::high)};
    return fmnist::summarise(config, results);
  };
  // static low: mean 88.5%, spread 1 point, so the tolerance is 1 point.
  const fmnist::summary holds = verdict(0.876, 0.874, 600);
  REQUIRE(holds.verdicts.size() == 1);
  const fmnist::family_verdict& v = holds.verdicts[0];
  CHECK(v.low->accuracy_mean == doctest::Approx(0.885));
  CHECK(v.tolerance == doctest::Approx(0.01));
  CHECK(v.gap() == doctest::Approx(-0.01));
  CHECK(v.accuracy_holds());
  CHECK(v.floats_ratio == doctest::Approx(0.6));
  CHECK(v.floats_hold());
  CHECK(v.accordion->high_share == doctest::Approx(1.0));  // the bias is dense and does not count
  CHECK(fmnist::verdict_lines(holds).starts_with("PowerSGD: the claim HOLDS."));

  const fmnist::summary too_low = verdict(0.874, 0.870, 500);
  CHECK_FALSE(too_low.verdicts[0].accuracy_holds());
  CHECK(fmnist::verdict_lines(too_low).find("does NOT hold") != std::string::npos);
  CHECK(fmnist::verdict_lines(too_low).find("accuracy outside the tolerance") != std::string::npos);

  const fmnist::summary too_many = verdict(0.890, 0.890, 601);
  CHECK(too_many.verdicts[0].accuracy_holds());  // better than static low is within the claim
  CHECK_FALSE(too_many.verdicts[0].floats_hold());
  CHECK(fmnist::verdict_lines(too_many).find("too many floats") != std::string::npos);
}

TEST_CASE("fmnist demo: results.json numbers and strings are valid JSON") {
  CHECK(fmnist::detail::json_number(0.1) == "0.1");
  CHECK(fmnist::detail::json_number(std::numeric_limits<double>::quiet_NaN()) == "null");
  CHECK(fmnist::detail::json_string("a\"b\\c\n") == "\"a\\\"b\\\\c\\u000a\"");
  const nlohmann::json j = nlohmann::json::parse("[" + fmnist::detail::json_number(1.0 / 3) + "]");
  CHECK(j[0].get<double>() == 1.0 / 3);
}

TEST_CASE("fmnist demo: bad configurations raise bellows::error naming the value") {
  fmnist::comparison_config no_seeds;
  no_seeds.seeds.clear();
  CHECK_THROWS_WITH_AS(no_seeds.validate(), doctest::Contains("no seeds"), bellows::error);
  fmnist::comparison_config bad_ratio;
  bad_ratio.topk_high_ratio = 1.5;
  CHECK_THROWS_WITH_AS(bad_ratio.validate(), doctest::Contains("high 1.5"), bellows::error);
  fmnist::comparison_config bad_interval;
  bad_interval.accordion.interval = 0;
  CHECK_THROWS_WITH_AS(bad_interval.validate(), doctest::Contains("interval must be at least 1"), bellows::error);
}
