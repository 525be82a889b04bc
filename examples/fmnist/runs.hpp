// SPDX-License-Identifier: Apache-2.0
// The runs of the Fashion-MNIST comparison: the same training (train.hpp) averaged by
// bellows::synchronizer configurations, each for every seed, with every epoch recorded.
//
//   uncompressed          identity on every layer
//   powersgd high / low   PowerSGD at the high level (rank 1) or a low level (rank 4, rank 2) always
//   powersgd accordion    PowerSGD switched per layer by the Accordion detector (4 <-> 1, 2 <-> 1)
//   topk high / low       top-k at ratio 0.1 or 0.99 always
//   topk accordion        top-k switched per layer by the Accordion detector (0.99 <-> 0.1)
//   qsgd high / low       QSGD at 4 or 8 bits always (named by --runs only)
//   signsgd high / low    EF-signSGD with one scale per layer or per 128 elements always (named
//                         by --runs only)
//
// PowerSGD has one pair of levels per low rank (config.powersgd_low_ranks); run_spec::pair picks
// one. What a layer's state does when Accordion switches it is config.level_change (keep or reset).
//
// A static run is the synchronizer with a static_policy, so every run goes through the same code.
// Layers the compressor leaves uncompressed (PowerSGD's biases) are found by the synchronizer and
// reported as `dense`.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <bellows/collectives/local.hpp>
#include <bellows/compressors/identity.hpp>
#include <bellows/compressors/powersgd.hpp>
#include <bellows/compressors/qsgd.hpp>
#include <bellows/compressors/signsgd.hpp>
#include <bellows/compressors/topk.hpp>
#include <bellows/core/error.hpp>
#include <bellows/cpu/executor.hpp>
#include <bellows/plan/exchange.hpp>
#include <bellows/regime/accordion.hpp>
#include <bellows/regime/static_policy.hpp>
#include <bellows/sync/synchronizer.hpp>

#if defined(FMNIST_CUDA)
#include "device.hpp"
#endif
#if defined(FMNIST_RUNS_LIBRARY_MPI)
#include <bellows/collectives/mpi.hpp>
#endif

#include "idx.hpp"
#include "train.hpp"

namespace fmnist {

enum class method : std::uint8_t { uncompressed, powersgd, topk, qsgd, signsgd };
/// static_low runs the low compression level (rank 4, ratio 0.99) always, static_high the high one.
enum class policy : std::uint8_t { static_high, static_low, accordion };

[[nodiscard]] constexpr std::string_view to_string(method m) noexcept {
  switch (m) {
    case method::uncompressed: return "uncompressed";
    case method::powersgd: return "powersgd";
    case method::topk: return "topk";
    case method::qsgd: return "qsgd";
    case method::signsgd: return "signsgd";
  }
  return "?";
}

/// A family's name in labels and descriptions: "PowerSGD", "top-k", "QSGD", "EF-signSGD".
[[nodiscard]] constexpr std::string_view display_name(method m) noexcept {
  switch (m) {
    case method::uncompressed: return "uncompressed";
    case method::powersgd: return "PowerSGD";
    case method::topk: return "top-k";
    case method::qsgd: return "QSGD";
    case method::signsgd: return "EF-signSGD";
  }
  return "?";
}

[[nodiscard]] constexpr std::string_view to_string(policy p) noexcept {
  switch (p) {
    case policy::static_high: return "static high";
    case policy::static_low: return "static low";
    case policy::accordion: return "accordion";
  }
  return "?";
}

struct run_spec {
  method how = method::uncompressed;
  policy when = policy::static_low;  ///< ignored for uncompressed
  /// PowerSGD's pair of levels: low rank config.powersgd_low_ranks[pair] with the high rank. 0 for
  /// the others, and for static high (one high level per family).
  std::size_t pair = 0;

  /// "uncompressed", "powersgd-high", "topk-accordion", "powersgd-accordion-pair2", ...: the
  /// run's key in results.json and --runs.
  [[nodiscard]] std::string id() const {
    if (how == method::uncompressed) return "uncompressed";
    std::string s(to_string(how));
    s += when == policy::static_high ? "-high" : when == policy::static_low ? "-low" : "-accordion";
    if (pair > 0) s += "-pair" + std::to_string(pair + 1);
    return s;
  }
  friend bool operator==(const run_spec&, const run_spec&) = default;
};

/// Every run of a comparison with `powersgd_pairs` PowerSGD low ranks, in the order of the
/// tables: uncompressed; PowerSGD static low per pair, static high, Accordion per pair; top-k
/// static low, static high, Accordion.
[[nodiscard]] inline std::vector<run_spec> all_runs(std::size_t powersgd_pairs) {
  std::vector<run_spec> runs{{method::uncompressed, policy::static_low}};
  for (std::size_t k = 0; k < powersgd_pairs; ++k) runs.push_back({method::powersgd, policy::static_low, k});
  runs.push_back({method::powersgd, policy::static_high});
  for (std::size_t k = 0; k < powersgd_pairs; ++k) runs.push_back({method::powersgd, policy::accordion, k});
  for (const policy p : {policy::static_low, policy::static_high, policy::accordion}) runs.push_back({method::topk, p});
  return runs;
}

/// The runs --runs may name: all_runs, then QSGD's and EF-signSGD's static low and static high,
/// which the full comparison leaves out (its results predate them).
[[nodiscard]] inline std::vector<run_spec> known_runs(std::size_t powersgd_pairs) {
  std::vector<run_spec> runs = all_runs(powersgd_pairs);
  for (const method m : {method::qsgd, method::signsgd})
    for (const policy p : {policy::static_low, policy::static_high}) runs.push_back({m, p});
  return runs;
}

/// The level a layer ran at during an epoch.
enum class level : std::uint8_t {
  low,    ///< the low compression level (critical regime)
  high,   ///< the high compression level
  dense,  ///< averaged uncompressed (the uncompressed run; layers the compressor leaves alone)
};

[[nodiscard]] constexpr std::string_view to_string(level l) noexcept {
  return l == level::low ? "low" : l == level::high ? "high" : "dense";
}

struct comparison_config {
  train_options train;  ///< epochs, schedule, workers, batch, data limits; train.seed is unused
  std::vector<std::uint64_t> seeds{1, 2};
  std::vector<std::size_t> powersgd_low_ranks{4, 2};  ///< one pair of levels with the high rank each
  std::vector<run_spec> runs = all_runs(2);
  std::size_t powersgd_high_rank = 1;
  double topk_low_ratio = 0.99;
  double topk_high_ratio = 0.1;
  unsigned qsgd_low_bits = 8;  ///< QSGD's levels: bits per element (its default bucket of 512)
  unsigned qsgd_high_bits = 4;
  std::size_t signsgd_low_bucket = 128;  ///< EF-signSGD's levels: elements per scale (0: the layer)
  std::size_t signsgd_high_bucket = 0;
  /// How the top-k, QSGD and EF-signSGD runs' ranks average: gather (every rank's payload to
  /// every rank), leader (top-k only: one rank's indices per step, docs/spec.md#top-k-leader) or
  /// scatter (chunk owners, docs/spec.md#scatter-exchange).
  bellows::exchange exchange = bellows::exchange::gather;
  /// Under scatter: whether the chunks' owners keep the error of their second compression (the
  /// compressors' owner_memory); empty: each codec's default (on for top-k and EF-signSGD, off
  /// for QSGD).
  std::optional<bool> owner_memory;
  bellows::accordion_params accordion{};
  /// What a layer's compressor state does when Accordion switches its level.
  bellows::level_change level_change = bellows::level_change::keep;
  /// Threads of the executor the compressors share. The workers are already one thread each,
  /// so 1 keeps W threads on the machine's cores instead of W plus a pool.
  unsigned threads = 1;
  /// Average the compressed runs on the GPU through the device Synchronizer (fmnist_demo
  /// --backend cuda; only where FMNIST_CUDA is defined: device.hpp). The uncompressed run stays
  /// on the CPU: bellows::identity has no device version. The results are the CPU run's.
  bool on_device = false;
  /// Why the settings are what they are, for results.md (empty: nothing said).
  std::string rationale;

  /// The label of a run in tables and legends: "PowerSGD Accordion (rank 4 ↔ 1)", ...
  [[nodiscard]] std::string label(const run_spec& r) const {
    if (r.how == method::uncompressed) return "uncompressed";
    const auto number = [](double v) {
      std::string s = std::to_string(v);
      s.erase(s.find_last_not_of('0') + 1);
      if (s.back() == '.') s.pop_back();
      return s;
    };
    const bool psgd = r.how == method::powersgd;
    std::string low, high, unit;
    switch (r.how) {
      case method::powersgd:
        low = std::to_string(powersgd_low_ranks.at(r.pair)), high = std::to_string(powersgd_high_rank);
        unit = "rank ";
        break;
      case method::qsgd:
        low = std::to_string(qsgd_low_bits), high = std::to_string(qsgd_high_bits), unit = "bits ";
        break;
      case method::signsgd:
        low = std::to_string(signsgd_low_bucket), high = std::to_string(signsgd_high_bucket), unit = "bucket ";
        break;
      default: low = number(topk_low_ratio), high = number(topk_high_ratio), unit = "ratio ";
    }
    const std::string s = std::string(display_name(r.how)) + " ";
    // The exchange is named where it is not the default, so the labels of gather runs stay.
    const std::string by = psgd || exchange == bellows::exchange::gather ? "" : ", " + exchange_words();
    if (r.when == policy::accordion) return s + "Accordion (" + unit + low + " ↔ " + high + by + ")";
    return s + (r.when == policy::static_low ? "static low (" + unit + low : "static high (" + unit + high) + by + ")";
  }

  /// The exchange as labels and descriptions name it: "scatter", or "scatter, owner memory off"
  /// where the owner memory is set.
  [[nodiscard]] std::string exchange_words() const {
    std::string s(to_string(exchange));
    if (owner_memory) s += *owner_memory ? ", owner memory on" : ", owner memory off";
    return s;
  }

  /// `p` with this configuration's exchange and, where it is set, owner memory.
  template <class Params>
  [[nodiscard]] Params exchanged(Params p) const {
    p.exchange = exchange;
    if (owner_memory) p.owner_memory = *owner_memory;
    return p;
  }

  /// Whether a run of family `m` is among the runs.
  [[nodiscard]] bool trains(method m) const noexcept {
    return std::any_of(runs.begin(), runs.end(), [m](const run_spec& r) { return r.how == m; });
  }

  /// Raises bellows::error naming the bad value.
  void validate() const {
    BELLOWS_EXPECTS(!seeds.empty(), "fmnist comparison: no seeds");
    BELLOWS_EXPECTS(!runs.empty(), "fmnist comparison: no runs");
    BELLOWS_EXPECTS(!powersgd_low_ranks.empty(), "fmnist comparison: no PowerSGD low rank");
    for (const std::size_t r : powersgd_low_ranks)
      BELLOWS_EXPECTS(r >= 1, "fmnist comparison: PowerSGD ranks must be >= 1, got low rank ", r);
    BELLOWS_EXPECTS(powersgd_high_rank >= 1, "fmnist comparison: PowerSGD ranks must be >= 1, got high rank ",
                    powersgd_high_rank);
    for (const run_spec& r : runs) {
      const bool paired = r.how == method::powersgd && r.when != policy::static_high;
      const std::size_t pairs = paired ? powersgd_low_ranks.size() : 1;
      BELLOWS_EXPECTS(r.pair < pairs, "fmnist comparison: run '", r.id(), "' needs ", r.pair + 1,
                      " low levels, the configuration has ", pairs);
    }
    BELLOWS_EXPECTS(topk_low_ratio > 0 && topk_low_ratio <= 1 && topk_high_ratio > 0 && topk_high_ratio <= 1,
                    "fmnist comparison: top-k ratios must be in (0, 1], got low ", topk_low_ratio, " and high ",
                    topk_high_ratio);
    BELLOWS_EXPECTS(!owner_memory || exchange == bellows::exchange::scatter,
                    "fmnist comparison: an owner memory is the scatter exchange's, the exchange is ",
                    to_string(exchange));
    for (const run_spec& r : runs) {
      const bool codec = r.how == method::qsgd || r.how == method::signsgd;
      BELLOWS_EXPECTS(!codec || exchange != bellows::exchange::leader, "fmnist comparison: run '", r.id(),
                      "' exchanges by gather or scatter; the leader is top-k's only");
      BELLOWS_EXPECTS(!codec || r.when != policy::accordion, "fmnist comparison: run '", r.id(),
                      "': QSGD and EF-signSGD run static only");
      BELLOWS_EXPECTS(!codec || !on_device, "fmnist comparison: run '", r.id(),
                      "' trains on the CPU only (--backend cuda takes the PowerSGD and top-k runs)");
    }
    bellows::qsgd_params{.bits = qsgd_low_bits}.validate();
    bellows::qsgd_params{.bits = qsgd_high_bits}.validate();
    bellows::signsgd_params{.bucket = signsgd_low_bucket}.validate();
    bellows::signsgd_params{.bucket = signsgd_high_bucket}.validate();
    accordion.validate();
    BELLOWS_EXPECTS((train.checkpoint.empty() && train.resume.empty()) || (runs.size() == 1 && seeds.size() == 1),
                    "fmnist comparison: a checkpoint holds one training; choose one run and one seed "
                    "(got ",
                    runs.size(), " runs and ", seeds.size(), " seeds)");
  }
};

/// Sets the number of epochs and moves the learning-rate decays with it: x0.1 at 50% and at 75%
/// of the epochs (one decay when both fall on the same epoch, none in a run of one epoch).
inline void set_epochs(comparison_config& config, std::size_t epochs) {
  config.train.epochs = epochs;
  std::vector<std::size_t>& milestones = config.train.schedule.milestones;
  milestones.clear();
  for (const std::size_t m : {epochs / 2, epochs * 3 / 4})
    if (m > 0 && (milestones.empty() || m > milestones.back())) milestones.push_back(m);
}

/// The full comparison of scripts/demo.sh: every run, two seeds, 48 epochs of 10000 images each
/// (a fresh subset of the 60000 every epoch) at lr 0.05 (x0.1 from epochs 24 and 36), an
/// Accordion check after every epoch. The schedule was fixed before its first run;
/// docs/experiments/fmnist.md and the results.md of a run say why and what it forces.
[[nodiscard]] inline comparison_config full_comparison() {
  comparison_config config;
  config.train.schedule.base = 0.05f;
  set_epochs(config, 48);
  config.train.epoch_limit = 10000;
  config.accordion.interval = 1;
  config.rationale = "Why these settings (fixed before the run, not tuned to its outcome). The schedule must leave "
                     "Accordion room to save floats: with the paper's rule every epoch up to the second check and "
                     "every epoch from a learning-rate decay to the next check run at the low level whatever the "
                     "norms say. The previous 12 epochs with a check every 2 forced 6 of 12 epochs low (a floor "
                     "of 65% of static low's floats for PowerSGD 4 <-> 1, above the 60% target). Here 48 shorter "
                     "epochs (10000 images each, a fresh shuffle of the 60000 every epoch: 8 passes over the data, "
                     "what 18 runs can train in about 15 minutes on 2 unloaded cores) with a check after every "
                     "epoch force 4 epochs (0, 1, 24, 36) of 48 low; the floor in each verdict gives the "
                     "share of static low's floats that this alone costs. Decays x0.1 at 50% and 75% of the epochs "
                     "and lr 0.05 as before (at 0.1 PowerSGD rank 1 was unstable). The paper checks every 10 of 300 "
                     "epochs (every 3.3% of the training); a check per epoch here is every 2.1%. eta 0.5 as in the "
                     "paper. PowerSGD runs the paper's pair rank 2 <-> 1 beside 4 <-> 1.";
  return config;
}

/// The short one of scripts/demo.sh --quick and the test suite: every run, one seed, 6 epochs of
/// 4800 training and 1000 test images, a check every epoch.
[[nodiscard]] inline comparison_config quick_comparison() {
  comparison_config config;
  config.train.schedule.base = 0.05f;
  set_epochs(config, 6);
  config.seeds = {1};
  config.train.train_limit = 4800;
  config.train.test_limit = 1000;
  config.accordion.interval = 1;
  config.rationale = "The quick configuration shows that everything runs; 4800 images and 6 epochs say nothing "
                     "about the claim. scripts/demo.sh without --quick trains the comparison that does.";
  return config;
}

/// One epoch of one run as rank 0 saw it, with the level each layer ran at during it.
struct epoch_record {
  epoch_report report;        ///< losses, accuracy, cumulative traffic, seconds
  std::vector<level> levels;  ///< one per layer, in force during this epoch
};

struct run_result {
  run_spec spec;
  std::uint64_t seed = 0;
  std::vector<bellows::layer_info> layers;  ///< the model's tensors: id, name, shape
  std::vector<epoch_record> epochs;         ///< every epoch, on a resume those of the checkpoint too
  double seconds = 0;          ///< wall time of the whole run (on a resume: the checkpoint's epochs' plus this one's)
  std::vector<float> weights;  ///< the final parameters
};

/// Trains on train_options::workers threads of this process (fmnist::train).
struct on_threads {
  template <class MakeAveraging, class OnEpoch>
  train_result operator()(const dataset& data, const train_options& options, MakeAveraging make,
                          OnEpoch on_epoch) const {
    return train(data, options, std::move(make), std::move(on_epoch));
  }
};

/// Trains as one rank of `comm` (fmnist::train_rank); every rank runs the same comparison.
template <bellows::Collective Coll>
struct on_rank {
  Coll* comm;
  template <class MakeAveraging, class OnEpoch>
  train_result operator()(const dataset& data, const train_options& options, MakeAveraging make,
                          OnEpoch on_epoch) const {
    return train_rank(data, options, *comm, std::move(make), std::move(on_epoch));
  }
};

/// Called on rank 0 after each epoch of each run (after its checkpoint), with the run so far.
using progress_callback = std::function<void(const run_result&)>;

namespace detail {

/// The levels of a synchronizer's layers during an epoch: dense where the run is uncompressed or
/// the compressor leaves the layer alone, else low or high as the epoch's report recorded.
template <class Sync>
[[nodiscard]] std::vector<level> levels_of(const Sync& sync, bool uncompressed, const epoch_report& report) {
  std::vector<level> out;
  const auto telemetry = sync.telemetry();
  for (std::size_t id = 0; id < telemetry.size(); ++id)
    out.push_back(uncompressed || !telemetry[id].participates ? level::dense
                  : (report.high_levels >> id & 1) != 0       ? level::high
                                                              : level::low);
  return out;
}

/// Records a run's epochs on rank 0 with the levels each ran at; on a resume, the epochs of the
/// checkpoint first.
struct recorder {
  run_result* result;
  bool uncompressed;
  std::chrono::steady_clock::time_point start;
  const progress_callback* progress;
  double* resumed_seconds;  ///< wall time of the checkpoint's epochs (shared by the loop's copies)

  template <class Sync>
  void operator()(const epoch_report& report, const Sync& sync) const {
    result->epochs.push_back({report, levels_of(sync, uncompressed, report)});
    result->seconds =
        *resumed_seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (*progress) (*progress)(*result);
  }
  /// Called by the training loop after a resume, with the restored synchronizer and the reports
  /// of the epochs the checkpoint holds.
  template <class Sync>
  void resumed(const Sync& sync, const std::vector<epoch_report>& done) const {
    for (const epoch_report& report : done) {
      result->epochs.push_back({report, levels_of(sync, uncompressed, report)});
      *resumed_seconds += report.seconds;
    }
    result->seconds = *resumed_seconds;
  }
};

/// Trains one run for one seed with synchronizers built by make_sync() (layers not yet added).
template <class Trainer, class MakeSync>
run_result run_one(const dataset& data, const comparison_config& config, const run_spec& spec, std::uint64_t seed,
                   const Trainer& trainer, MakeSync make_sync, const progress_callback& progress) {
  train_options options = config.train;
  options.seed = seed;
  run_result result{spec, seed, {}, {}, 0, {}};
  double resumed_seconds = 0;
  const recorder record{&result, spec.how == method::uncompressed, std::chrono::steady_clock::now(), &progress,
                        &resumed_seconds};
  std::once_flag first;
  result.weights = trainer(
                       data, options,
                       [&](std::span<const bellows::layer_info> layers) {
                         auto sync = make_sync();
                         sync.set_level_change(config.level_change);
                         for (const bellows::layer_info& l : layers) sync.add_layer(l.name, l.shape);
                         std::call_once(first, [&] { result.layers.assign(layers.begin(), layers.end()); });
                         return sync;
                       },
                       record)
                       .weights;
  return result;
}

}  // namespace detail

/// Trains every run of `config` for every seed (runs in order, seeds inner) and returns the
/// results in that order. `trainer` runs the workers: on threads (the default), or on_rank{&comm}
/// as one rank of a collective, on every rank (the epochs are recorded on rank 0).
template <class Trainer = on_threads>
std::vector<run_result> run_comparison(const dataset& data, const comparison_config& config,
                                       const progress_callback& progress = {}, Trainer trainer = {}) {
  config.validate();
  bellows::cpu::executor exec(config.threads);
  using bellows::regime;
  const auto static_regime = [](policy p) { return p == policy::static_high ? regime::normal : regime::critical; };
  std::vector<run_result> results;
  for (const run_spec& spec : config.runs) {
    for (const std::uint64_t seed : config.seeds) {
      const auto run = [&](auto make_sync) {
        results.push_back(detail::run_one(data, config, spec, seed, trainer, make_sync, progress));
      };
      // QSGD and EF-signSGD run static only: an Accordion synchronizer of each would add a fifth
      // of the compile time of every file that includes this one, for runs nobody asked for.
      const auto run_static = [&](const auto& critical, const auto& normal) {
        run([&] {
          return bellows::synchronizer(critical, normal, bellows::static_policy(static_regime(spec.when)), exec);
        });
      };
      // The instances of a family for critical and normal layers (the low and the high compression
      // level) under the run's policy.
      const auto run_levels = [&](const auto& critical, const auto& normal) {
        if (spec.when == policy::accordion)
          run([&] {
            return bellows::synchronizer(critical, normal, bellows::accordion(config.accordion, exec), exec);
          });
        else
          run_static(critical, normal);
      };
#if defined(FMNIST_CUDA)
      if (config.on_device && spec.how != method::uncompressed) {
        device_spec d;
        d.powersgd = spec.how == method::powersgd;
        d.powersgd_low = {.rank = config.powersgd_low_ranks.at(spec.pair)};
        d.powersgd_high = {.rank = config.powersgd_high_rank};
        d.topk_low = config.exchanged(bellows::topk_params{.ratio = config.topk_low_ratio});
        d.topk_high = config.exchanged(bellows::topk_params{.ratio = config.topk_high_ratio});
        if (spec.when == policy::accordion) d.accordion = config.accordion;
        d.fixed = static_regime(spec.when);
        run([&] { return device_averaging(d); });
        continue;
      }
#endif
      if (spec.how == method::uncompressed)
        run([&] {
          return bellows::synchronizer(bellows::identity<>(exec), bellows::identity<>(exec),
                                       bellows::static_policy(regime::critical), exec);
        });
      else if (spec.how == method::powersgd)
        run_levels(bellows::powersgd<>({.rank = config.powersgd_low_ranks.at(spec.pair)}, exec),
                   bellows::powersgd<>({.rank = config.powersgd_high_rank}, exec));
      else if (spec.how == method::qsgd)
        run_static(bellows::qsgd<>(config.exchanged(bellows::qsgd_params{.bits = config.qsgd_low_bits}), exec),
                   bellows::qsgd<>(config.exchanged(bellows::qsgd_params{.bits = config.qsgd_high_bits}), exec));
      else if (spec.how == method::signsgd)
        run_static(
            bellows::signsgd<>(config.exchanged(bellows::signsgd_params{.bucket = config.signsgd_low_bucket}), exec),
            bellows::signsgd<>(config.exchanged(bellows::signsgd_params{.bucket = config.signsgd_high_bucket}), exec));
      else
        run_levels(bellows::topk<>(config.exchanged(bellows::topk_params{.ratio = config.topk_low_ratio}), exec),
                   bellows::topk<>(config.exchanged(bellows::topk_params{.ratio = config.topk_high_ratio}), exec));
    }
  }
  return results;
}

#if defined(FMNIST_RUNS_LIBRARY)
// Programs and tests that link fmnist_runs (runs.cmake) take the comparison on threads from it,
// compiled once (runs_threads.cpp), instead of compiling it each (40 s); those that link
// fmnist_runs_mpi take the comparison over MPI from it too (runs_mpi.cpp).
extern template std::vector<run_result> run_comparison<on_threads>(const dataset&, const comparison_config&,
                                                                   const progress_callback&, on_threads);
#endif
#if defined(FMNIST_RUNS_LIBRARY_MPI)
extern template std::vector<run_result> run_comparison<on_rank<bellows::collectives::mpi>>(
    const dataset&, const comparison_config&, const progress_callback&, on_rank<bellows::collectives::mpi>);
#endif

}  // namespace fmnist
