// SPDX-License-Identifier: Apache-2.0
// The Fashion-MNIST comparison (examples/fmnist/runs.hpp, report.hpp, svg.hpp): the quick
// configuration of scripts/demo.sh --quick trained for real and its files checked, and the
// summary's verdict logic on results made up by hand.
#include "fmnist/ablation.hpp"
#include "fmnist/cli.hpp"
#include "fmnist/report.hpp"
#include "fmnist/runs.hpp"
#include "fmnist/svg.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <filesystem>
#include <optional>
#include <fstream>
#include <iterator>
#include <set>
#include <span>
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

/// fmnist_demo's command line parsed from `args` (the options after the program's name).
fmnist::cli::command parse(std::vector<std::string> args) {
  args.insert(args.begin(), "fmnist_demo");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return fmnist::cli::parse(static_cast<int>(argv.size()), argv.data());
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
  CHECK(j["config"]["epoch_images"] == config.train.epoch_images(*data));
  CHECK(j["config"]["level_change"] == "keep");
  CHECK(j["config"]["powersgd"]["low_ranks"] == nlohmann::json(config.powersgd_low_ranks));
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
  for (const fmnist::run_spec& spec : fmnist::all_runs(config.powersgd_low_ranks.size()))
    CHECK_MESSAGE(runs.count(spec.id()) == 1, spec.id());

  const std::string md = read_text(dir / "results.md");
  for (const fmnist::run_spec& spec : config.runs)
    CHECK(md.find("| " + config.label(spec) + " |") != std::string::npos);
  CHECK(md.find("- PowerSGD Accordion (rank 4 ↔ 1): the claim ") != std::string::npos);
  CHECK(md.find("- PowerSGD Accordion (rank 2 ↔ 1): the claim ") != std::string::npos);
  CHECK(md.find("- top-k Accordion (ratio 0.99 ↔ 0.1): the claim ") != std::string::npos);
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
  config.runs = {{method::powersgd, policy::static_low},
                 {method::powersgd, policy::static_high},
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
  CHECK(fmnist::verdict_lines(holds).starts_with("PowerSGD Accordion (rank 4 ↔ 1): the claim HOLDS."));

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

namespace {

/// The epochs in which a real Accordion detector puts its layer on the low level when the
/// gradient never changes (so no check finds a critical regime): those the schedule forces.
std::vector<std::size_t> detector_low_epochs(const fmnist::comparison_config& config) {
  bellows::accordion detector(config.accordion);
  detector.add_layer({0, "w", bellows::shape{4, 4}});
  bellows::archetypes::collective solo;
  const std::vector<float> g(16, 0.25f);
  std::vector<std::size_t> low;
  for (std::size_t e = 0; e < config.train.epochs; ++e) {
    if (detector.regimes()[0] == bellows::regime::critical) low.push_back(e);
    (void)detector.observe(0, g);
    (void)detector.end_epoch(e, config.train.schedule.at(e + 1), solo);
  }
  return low;
}

std::vector<std::size_t> forced_epochs(const fmnist::comparison_config& config) {
  std::vector<std::size_t> forced;
  for (std::size_t e = 0; e < config.train.epochs; ++e)
    if (fmnist::schedule_forces_low(config, e)) forced.push_back(e);
  return forced;
}

/// A made-up run of `accuracies.size()` epochs at the given accuracies and levels of tensor 0.
fmnist::run_result made_up_epochs(const std::vector<double>& accuracies, const std::string& levels) {
  fmnist::run_result r = made_up({fmnist::method::powersgd, fmnist::policy::accordion}, 1, 0, 0);
  r.epochs.clear();
  for (std::size_t e = 0; e < accuracies.size(); ++e) {
    fmnist::epoch_record rec;
    rec.report.epoch = e;
    rec.report.test_accuracy = accuracies[e];
    rec.levels = {levels[e] == 'H' ? fmnist::level::high : fmnist::level::low, fmnist::level::dense};
    r.epochs.push_back(rec);
  }
  return r;
}

}  // namespace

TEST_CASE("fmnist demo: the epochs the schedule forces low are those a real detector runs low on flat norms") {
  // The issue's example: 12 epochs, a check every 2, decays from epochs 6 and 9.
  fmnist::comparison_config old;
  fmnist::set_epochs(old, 12);
  old.accordion.interval = 2;
  CHECK(forced_epochs(old) == std::vector<std::size_t>{0, 1, 2, 6, 9, 10});
  CHECK(detector_low_epochs(old) == forced_epochs(old));
  // The full comparison: 48 epochs, a check every epoch, decays from epochs 24 and 36.
  const fmnist::comparison_config full = fmnist::full_comparison();
  CHECK(forced_epochs(full) == std::vector<std::size_t>{0, 1, 24, 36});
  CHECK(detector_low_epochs(full) == forced_epochs(full));
  for (const std::size_t interval : {3, 5, 10}) {
    fmnist::comparison_config other = full;
    other.accordion.interval = interval;
    CAPTURE(interval);
    CHECK(detector_low_epochs(other) == forced_epochs(other));
  }
}

TEST_CASE("fmnist demo: the floor weighs static low's and static high's epochs as the schedule forces them") {
  // Static low sends 1000 floats an epoch, static high 295: the issue's 12-epoch schedule has a
  // floor of 6/12 + 6/12 x 0.295 = 64.75%.
  fmnist::comparison_config config;
  fmnist::set_epochs(config, 12);
  config.accordion.interval = 2;
  fmnist::run_summary low, high;
  low.epoch_floats.assign(12, 1000.0);
  high.epoch_floats.assign(12, 295.0);
  CHECK(fmnist::schedule_floor(config, low, high) == doctest::Approx(0.6475));
  // Epochs of other costs: the forced epochs count at static low's cost, the others at high's.
  for (std::size_t e = 0; e < 12; ++e) {
    low.epoch_floats[e] = 100.0 + static_cast<double>(e);
    high.epoch_floats[e] = 10.0 + static_cast<double>(e);
  }
  double want = 0, all = 0;
  for (const std::size_t e : {0, 1, 2, 6, 9, 10}) want += 100.0 + static_cast<double>(e);
  for (const std::size_t e : {3, 4, 5, 7, 8, 11}) want += 10.0 + static_cast<double>(e);
  for (std::size_t e = 0; e < 12; ++e) all += 100.0 + static_cast<double>(e);
  CHECK(fmnist::schedule_floor(config, low, high) == doctest::Approx(want / all));
}

TEST_CASE("fmnist demo: the deepest drop after a switch to the high level") {
  // A switch at epoch 2 (88 -> 80, then 84) and at epoch 5 (87 -> 86, then 85): 8 points.
  CHECK(fmnist::deepest_drop(made_up_epochs({0.80, 0.88, 0.80, 0.84, 0.87, 0.85, 0.86}, "LLHHLHH")) ==
        doctest::Approx(0.08));
  // The lowest of the two epochs after the switch counts: 88 -> 86 -> 79.
  CHECK(fmnist::deepest_drop(made_up_epochs({0.80, 0.88, 0.86, 0.79}, "LLHH")) == doctest::Approx(0.09));
  // A switch in the last epoch has one epoch after it.
  CHECK(fmnist::deepest_drop(made_up_epochs({0.80, 0.88, 0.85}, "LLH")) == doctest::Approx(0.03));
  // No switch to high (high to low, or never), or a rise: 0.
  CHECK(fmnist::deepest_drop(made_up_epochs({0.80, 0.70, 0.60}, "HHL")) == 0.0);
  CHECK(fmnist::deepest_drop(made_up_epochs({0.80, 0.70, 0.60}, "LLL")) == 0.0);
  CHECK(fmnist::deepest_drop(made_up_epochs({0.80, 0.85, 0.90}, "LHH")) == 0.0);
}

TEST_CASE("fmnist demo: the command line sets the levels, momentum, level change and images per epoch") {
  const fmnist::cli::command c = parse({"--powersgd-low", "8,2", "--powersgd-high", "2", "--topk-low", "0.5",
                                        "--topk-high", "0.05", "--momentum", "0.8", "--level-change", "reset",
                                        "--epoch-images", "6000", "--runs", "powersgd-accordion-pair2,topk-low"});
  CHECK(c.config.powersgd_low_ranks == std::vector<std::size_t>{8, 2});
  CHECK(c.config.powersgd_high_rank == 2);
  CHECK(c.config.topk_low_ratio == doctest::Approx(0.5));
  CHECK(c.config.topk_high_ratio == doctest::Approx(0.05));
  CHECK(c.config.train.momentum == doctest::Approx(0.8f));
  CHECK(c.config.level_change == bellows::level_change::reset);
  CHECK(c.config.train.epoch_limit == 6000);
  REQUIRE(c.config.runs.size() == 2);
  CHECK(c.config.runs[0] == fmnist::run_spec{fmnist::method::powersgd, fmnist::policy::accordion, 1});
  CHECK(c.config.label(c.config.runs[0]) == "PowerSGD Accordion (rank 2 ↔ 2)");
  // --powersgd-low alone trains every run of its pairs.
  CHECK(parse({"--powersgd-low", "4"}).config.runs == fmnist::all_runs(1));
  CHECK(parse({"--ablation"}).ablation);
  CHECK_THROWS_WITH_AS(parse({"--level-change", "drop"}), doctest::Contains("'drop' is neither keep nor reset"),
                       fmnist::cli::usage_error);
  CHECK_THROWS_WITH_AS(parse({"--powersgd-low", "4", "--runs", "powersgd-low-pair2"}),
                       doctest::Contains("no run named 'powersgd-low-pair2'"), fmnist::cli::usage_error);
  fmnist::comparison_config pair_out_of_range;
  pair_out_of_range.runs = {{fmnist::method::powersgd, fmnist::policy::accordion, 2}};
  CHECK_THROWS_WITH_AS(pair_out_of_range.validate(), doctest::Contains("'powersgd-accordion-pair3' needs 3 low levels"),
                       bellows::error);
}

TEST_CASE("fmnist demo: --exchange leader trains top-k by one rank's indices, recorded in results.json") {
  const fmnist::cli::command c = parse({"--exchange", "leader", "--workers", "8"});
  CHECK(c.config.exchange == bellows::exchange::leader);
  CHECK(c.config.train.workers == 8);
  CHECK(c.config.label({fmnist::method::topk, fmnist::policy::static_high}) == "top-k static high (ratio 0.1, leader)");
  CHECK(c.config.label({fmnist::method::powersgd, fmnist::policy::static_high}) == "PowerSGD static high (rank 1)");
  CHECK(parse({}).config.exchange == bellows::exchange::gather);
  CHECK(parse({"--exchange", "scatter"}).config.exchange == bellows::exchange::scatter);
  CHECK_THROWS_WITH_AS(parse({"--exchange", "ring"}), doctest::Contains("'ring' is not gather, leader or scatter"),
                       fmnist::cli::usage_error);
  CHECK_THROWS_WITH_AS(parse({"--workers", "two"}), doctest::Contains("--workers: not a whole number"),
                       fmnist::cli::usage_error);

  const fmnist::dataset* data = fmnist::testing::real_data();
  if (data == nullptr) return;
  // One worker leads every step with its own top-k: the gather run's bits. Two workers take
  // turns, and each step keeps the leader's indices only: other weights.
  const auto final_weights = [&](std::size_t workers, bellows::exchange x) {
    fmnist::comparison_config config =
        fmnist::testing::small_comparison(2, 256, {{fmnist::method::topk, fmnist::policy::static_high}});
    config.train.workers = workers;
    config.exchange = x;
    const std::vector<fmnist::run_result> results = fmnist::run_comparison(*data, config);
    REQUIRE(results.size() == 1);
    for (const fmnist::epoch_record& e : results[0].epochs) {
      CHECK(e.report.skipped_steps == 0);
      CHECK(e.report.test_accuracy > 0.1);  // above chance
    }
    return results[0].weights;
  };
  CHECK(final_weights(1, bellows::exchange::leader) == final_weights(1, bellows::exchange::gather));
  CHECK(final_weights(2, bellows::exchange::leader) != final_weights(2, bellows::exchange::gather));

  fmnist::comparison_config config =
      fmnist::testing::small_comparison(1, 128, {{fmnist::method::topk, fmnist::policy::static_high}});
  config.exchange = bellows::exchange::leader;
  const auto dir = std::filesystem::temp_directory_path() / "bellows_fmnist_leader_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  fmnist::write_results_json(dir / "results.json", config, *data, fmnist::run_comparison(*data, config));
  const nlohmann::json j = nlohmann::json::parse(read_text(dir / "results.json"));
  CHECK(j["config"]["topk"]["exchange"] == "leader");
  CHECK(j["runs"][0]["label"] == "top-k static high (ratio 0.1, leader)");
  std::filesystem::remove_all(dir);
}

TEST_CASE("fmnist demo: QSGD and EF-signSGD runs, named by --runs, train by gather and by scatter") {
  const fmnist::cli::command c = parse({"--runs", "qsgd-high,signsgd-low,signsgd-high", "--exchange", "scatter",
                                        "--qsgd-high", "2", "--signsgd-low", "64"});
  using fmnist::method, fmnist::policy;
  const std::vector<fmnist::run_spec> named{{method::qsgd, policy::static_high},
                                            {method::signsgd, policy::static_low},
                                            {method::signsgd, policy::static_high}};
  CHECK(c.config.runs == named);
  CHECK(c.config.label(named[0]) == "QSGD static high (bits 2, scatter)");
  CHECK(c.config.label(named[1]) == "EF-signSGD static low (bucket 64, scatter)");
  CHECK(c.config.label(named[2]) == "EF-signSGD static high (bucket 0, scatter)");
  CHECK(c.config.label({method::qsgd, policy::static_low}) == "QSGD static low (bits 8, scatter)");
  for (const fmnist::run_spec& r : parse({}).config.runs)  // the full comparison as its results have it
    CHECK((r.how != method::qsgd && r.how != method::signsgd));
  CHECK_THROWS_WITH_AS(parse({"--qsgd-low", "3"}), doctest::Contains("--qsgd-low: bits must be 2, 4 or 8, got '3'"),
                       fmnist::cli::usage_error);
  CHECK_THROWS_WITH_AS(parse({"--runs", "qsgd-accordion"}), doctest::Contains("no run named 'qsgd-accordion'"),
                       fmnist::cli::usage_error);
  fmnist::comparison_config switched = c.config;
  switched.runs = {{method::signsgd, policy::accordion}};
  CHECK_THROWS_WITH_AS(switched.validate(), doctest::Contains("QSGD and EF-signSGD run static only"), bellows::error);
  fmnist::comparison_config leader = c.config;
  leader.exchange = bellows::exchange::leader;
  CHECK_THROWS_WITH_AS(leader.validate(), doctest::Contains("run 'qsgd-high' exchanges by gather or scatter"),
                       bellows::error);
  fmnist::comparison_config too_wide = c.config;
  too_wide.signsgd_high_bucket = std::size_t{1} << 33;
  CHECK_THROWS_WITH_AS(too_wide.validate(), doctest::Contains("signsgd: bucket must be below 2^32"), bellows::error);

  const fmnist::dataset* data = fmnist::testing::real_data();
  if (data == nullptr) return;
  // Trained on 2 workers by each exchange: every step averaged (none skipped), above chance, and
  // scatter's weights other than gather's (the owners compress the average again).
  const auto train = [&](bellows::exchange x) {
    fmnist::comparison_config config = fmnist::testing::small_comparison(
        1, 256, {{method::qsgd, policy::static_high}, {method::signsgd, policy::static_high}});
    config.train.workers = 2;
    config.exchange = x;
    const std::vector<fmnist::run_result> results = fmnist::run_comparison(*data, config);
    REQUIRE(results.size() == 2);
    for (const fmnist::run_result& r : results)
      for (const fmnist::epoch_record& e : r.epochs) {
        CHECK(e.report.skipped_steps == 0);
        CHECK(e.report.test_accuracy > 0.1);
        CHECK(e.levels[0] == fmnist::level::high);
      }
    return results;
  };
  const std::vector<fmnist::run_result> gather = train(bellows::exchange::gather);
  const std::vector<fmnist::run_result> scatter = train(bellows::exchange::scatter);
  for (std::size_t i = 0; i < 2; ++i) CHECK(gather[i].weights != scatter[i].weights);

  fmnist::comparison_config config = c.config;
  const auto dir = std::filesystem::temp_directory_path() / "bellows_fmnist_codecs_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  config.runs = {named[0]};
  fmnist::write_results_json(dir / "results.json", config, *data, std::span(scatter).first(1));
  const nlohmann::json j = nlohmann::json::parse(read_text(dir / "results.json"));
  CHECK(j["config"]["qsgd"] == nlohmann::json::parse(R"({"low_bits": 8, "high_bits": 2, "exchange": "scatter"})"));
  CHECK(j["config"].count("signsgd") == 0);  // written where its runs trained
  CHECK(fmnist::describe(config, *data).ends_with("; QSGD exchange scatter"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("fmnist demo: --owner-memory sets the scatter owners' memory of every codec, named where it is set") {
  using fmnist::method, fmnist::policy;
  CHECK_FALSE(parse({}).config.owner_memory.has_value());
  const fmnist::cli::command c =
      parse({"--runs", "signsgd-low,topk-high", "--exchange", "scatter", "--owner-memory", "off"});
  REQUIRE(c.config.owner_memory.has_value());
  CHECK_FALSE(*c.config.owner_memory);
  CHECK(*parse({"--exchange", "scatter", "--owner-memory", "on"}).config.owner_memory);
  CHECK(c.config.label({method::signsgd, policy::static_low}) ==
        "EF-signSGD static low (bucket 128, scatter, owner memory off)");
  CHECK(c.config.label({method::topk, policy::static_high}) ==
        "top-k static high (ratio 0.1, scatter, owner memory off)");
  CHECK(c.config.exchanged(bellows::qsgd_params{}).owner_memory == false);
  CHECK(c.config.exchanged(bellows::signsgd_params{}).owner_memory == false);
  CHECK(c.config.exchanged(bellows::topk_params{}).exchange == bellows::exchange::scatter);
  CHECK_THROWS_WITH_AS(parse({"--exchange", "scatter", "--owner-memory", "yes"}),
                       doctest::Contains("--owner-memory: 'yes' is neither on nor off"), fmnist::cli::usage_error);
  fmnist::comparison_config gathered = c.config;
  gathered.exchange = bellows::exchange::gather;
  CHECK_THROWS_WITH_AS(gathered.validate(),
                       doctest::Contains("an owner memory is the scatter exchange's, the exchange is gather"),
                       bellows::error);

  const fmnist::dataset* data = fmnist::testing::real_data();
  if (data == nullptr) return;
  // EF-signSGD by scatter on 2 workers: "on" trains what the default trains (bit for bit), "off"
  // something else (the owners drop what their signs left out).
  const auto train = [&](std::optional<bool> owner_memory) {
    fmnist::comparison_config config =
        fmnist::testing::small_comparison(1, 256, {{method::signsgd, policy::static_low}});
    config.train.workers = 2;
    config.exchange = bellows::exchange::scatter;
    config.owner_memory = owner_memory;
    const std::vector<fmnist::run_result> results = fmnist::run_comparison(*data, config);
    REQUIRE(results.size() == 1);
    for (const fmnist::epoch_record& e : results[0].epochs) CHECK(e.report.skipped_steps == 0);
    return results;
  };
  const std::vector<fmnist::run_result> kept = train(true), dropped = train(false);
  CHECK(train(std::nullopt)[0].weights == kept[0].weights);
  CHECK(dropped[0].weights != kept[0].weights);

  fmnist::comparison_config config = c.config;
  config.runs = {{method::signsgd, policy::static_low}};
  const auto dir = std::filesystem::temp_directory_path() / "bellows_fmnist_owner_memory_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  fmnist::write_results_json(dir / "results.json", config, *data, dropped);
  const nlohmann::json j = nlohmann::json::parse(read_text(dir / "results.json"));
  CHECK(
      j["config"]["signsgd"] ==
      nlohmann::json::parse(R"({"low_bucket": 128, "high_bucket": 0, "exchange": "scatter", "owner_memory": "off"})"));
  CHECK(fmnist::describe(config, *data).ends_with("; EF-signSGD exchange scatter, owner memory off"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("fmnist demo: the ablation trains every group and tabulates each pair against its static low") {
  const fmnist::dataset* data = fmnist::testing::real_data();
  if (data == nullptr) return;
  fmnist::comparison_config base = fmnist::testing::small_comparison(3, 512, {});
  base.train.epoch_limit = 256;
  const auto dir = std::filesystem::temp_directory_path() / "bellows_fmnist_ablation_test";
  std::filesystem::remove_all(dir);
  std::size_t epochs = 0;
  const std::vector<fmnist::ablation_row> rows =
      fmnist::run_ablation(*data, base, dir, [&](const fmnist::run_result&) { ++epochs; });
  // 2 rates x (2 static low + 2 Accordion under keep, 2 Accordion under reset) runs of 3 epochs.
  CHECK(epochs == 2 * 6 * 3);
  REQUIRE(rows.size() == 2 * 2 * 2);
  const std::string md = read_text(dir / "results.md");
  for (const fmnist::ablation_row& r : rows) {
    CAPTURE(r.accordion.label);
    CHECK(r.accordion.spec.when == fmnist::policy::accordion);
    CHECK(r.low.spec == fmnist::run_spec{fmnist::method::powersgd, fmnist::policy::static_low, r.accordion.spec.pair});
    CHECK(r.floats_share() > 0);
    CHECK(r.floats_share() <= 1);
    const nlohmann::json j =
        nlohmann::json::parse(read_text(dir / fmnist::ablation_folder(r.lr, r.change) / "results.json"));
    CHECK(j["config"]["lr"].get<double>() == doctest::Approx(r.lr));
    CHECK(j["config"]["level_change"] == bellows::to_string(r.change));
    CHECK(j["runs"].size() == (r.change == bellows::level_change::keep ? 4 : 2));
    CHECK(md.find(fmnist::detail::format("| %s | %g | %s |", r.accordion.label.c_str(), static_cast<double>(r.lr),
                                         bellows::to_string(r.change))) != std::string::npos);
  }
  // Rows by pair (rank 4 first), then rate, then level change.
  CHECK(rows[0].accordion.spec.pair == 0);
  CHECK(rows[4].accordion.spec.pair == 1);
  CHECK(rows[0].lr == 0.05f);
  CHECK(rows[2].lr == 0.025f);
  CHECK(rows[1].change == bellows::level_change::reset);
  std::filesystem::remove_all(dir);
}
