// SPDX-License-Identifier: Apache-2.0
// The Synchronizer: the one object a trainer holds. It registers the model's layers once, then per
// step runs each layer's gradient through the compressor of its current level and the user's
// collective, feeds the regime detector, and per epoch asks the detector for the next levels.
//
// Buckets. A step exchanges its layers a bucket at a time, in one collective call per round and
// operation of the bucket (sync/bucket_exchange.hpp, on the compressors' phases), whatever the
// layers' levels. step() runs the synchronizer's own buckets: consecutive layers grouped from the
// last back by a byte budget (set_bucket_bytes; 25 MiB by default), fixed at the first step and
// recorded in checkpoints. A trainer that groups its layers itself, as DDP does, hands each
// bucket over with step_bucket as its gradients become ready; its buckets may change between
// steps, since every state is per layer. Either way every output and state is what each layer's
// own reduce would give: the buckets change the calls, not the bits.
//
// Levels. The synchronizer holds two instances of one compressor type, `critical` (the low
// compression level of critical regimes: rank 4, ratio 0.99, 8 bits, ...) and `normal` (the high
// compression level, elsewhere), and one state per layer that both instances run on, so a layer
// that changes level keeps its error memory (and, for PowerSGD, the shared columns of its query). With level_change::reset a layer that changes
// level starts from the fresh state of its new level instead (memory zero, PowerSGD's query the
// first draw), as the Accordion authors' code does when it builds a new reducer; only the step
// counter carries over, so random streams keyed by it do not repeat. A static baseline is the
// same object with a static_policy detector.
//
// Non-finite gradients skip their layer, not its bucket. Outside the epochs in which the detector
// observes, each compressor's own first round makes the ranks agree (its flag travels in the
// bucket's first call). In observed epochs the detector must see only gradients every rank found
// finite, so each bucket begins with one allreduce of one flag per layer of it (4 bytes per
// layer); a layer flagged on any rank is skipped on every rank with step_status::non_finite, its
// traffic not counted, and nothing of it changes. Accordion observes each layer as its bucket
// arrives, which is all it needs: its sums are per layer.
//
// Backends. The class is written once over its executor. With cpu::executor the gradients are
// host memory; with cuda::executor (sync/synchronizer.cuh) they are device memory, the
// compressors are the device ones, the detector a basic_accordion<cuda::executor> (or a
// static_policy), the collective a DeviceCollective on the executor's stream, and the flags and
// norms are computed and exchanged in device memory and read back (sync/synchronizer.cuh counts
// the waits).
// Everything else (levels, telemetry, checkpoints) is this file's host code, for both.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bellows/concepts.hpp"
#include "bellows/core/checked.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/cpu/float_array.hpp"
#include "bellows/plan/float_array.hpp"
#include "bellows/regime/accordion_types.hpp"
#include "bellows/sync/bucket_exchange.hpp"

namespace bellows {

/// What a layer's compressor state does when the layer changes level (synchronizer option).
enum class level_change : std::uint8_t {
  keep,   ///< keep the state: error memory, and PowerSGD's first min(r_old, r_new) query columns
  reset,  ///< the new level's fresh state: memory zero, PowerSGD's query drawn as at step 0
};

[[nodiscard]] constexpr const char* to_string(level_change c) noexcept {
  return c == level_change::keep ? "keep" : "reset";
}

/// What the synchronizer knows of a layer after its steps so far.
struct layer_telemetry {
  std::string name;
  bellows::shape shape;
  bool participates = true;         ///< takes part in regime detection (the compressor compresses it)
  regime level = regime::critical;  ///< level in force: critical = low compression, normal = high
  step_status last_status = step_status::ok;
  std::uint64_t steps = 0;                                    ///< steps that went through (status ok)
  std::uint64_t skipped = 0;                                  ///< steps skipped as non_finite
  traffic sent{};                                             ///< accumulated over all steps
  float grad_norm = std::numeric_limits<float>::quiet_NaN();  ///< last raw local ||g|| (if measured)
};

/// C is the compressor of both levels; D a LevelDetector. What the synchronizer does beyond
/// Compressor and LevelDetector depends on the capabilities they model (concepts.hpp): a
/// SelectiveCompressor's uncompressed layers take no part in regime detection; an
/// ObservingDetector makes the ranks agree on finiteness only in the epochs it observes; a
/// CheckpointedCompressor with a CheckpointedDetector gives checkpoint(), save(), load() and restore().
template <class C, LevelDetector D, class Exec = cpu::executor>
class synchronizer {
public:
  using compressor_type = C;
  using state_type = typename C::state;

  /// `critical` serves the layers in a critical regime (the low compression level), `normal` the
  /// others (the high level); `detector` decides which is which.
  synchronizer(C critical, C normal, D detector, Exec& exec = Exec::shared())
      : critical_(std::move(critical)), normal_(std::move(normal)), detector_(std::move(detector)), exec_(&exec),
        exchange_(exec) {}

  /// Registers the next layer and returns its id (0, 1, 2, ... in call order). Every rank
  /// registers the same layers in the same order; the first step checks that and raises if not.
  std::uint32_t add_layer(std::string name, bellows::shape shp) {
    return register_layer(std::move(name), shp, false, 0);
  }

  /// add_layer for a layer with a random-stream key of its own: it draws the numbers of
  /// layer_info::stream with `key`, whatever its id. Every rank registers the same key (the
  /// first step checks that). A checkpoint records names and shapes, not keys: restore it into
  /// layers registered with the keys it was taken with (bellows_torch derives them from names).
  std::uint32_t add_layer(std::string name, bellows::shape shp, std::uint64_t key) {
    return register_layer(std::move(name), shp, true, key);
  }

  /// One training step: `grads[id]` is layer id's local gradient, replaced by the average over
  /// ranks of the compressed contributions. A collective call: the synchronizer's own buckets
  /// (set_bucket_bytes), from the last back, each as step_bucket exchanges one, with one wait
  /// for the executor after all of them. Returns one status per layer.
  template <Collective Coll>
  std::span<const step_status> step(std::span<const std::span<float>> grads, Coll& coll) {
    BELLOWS_EXPECTS(grads.size() == layers_.size(), "synchronizer: step got ", grads.size(), " gradients for ",
                    layers_.size(), " registered layers");
    BELLOWS_EXPECTS(handed_ == 0, "synchronizer: step called while a step by buckets has ", handed_, " of ",
                    layers_.size(), " layers handed over; hand over the others (step_bucket) first");
    if (layers_.empty()) {
      if (steps_ == 0) verify_layers(coll);
      end_step();
      return statuses_;
    }
    if (bounds_.empty()) bounds_ = plan_buckets(layers_, bucket_bytes_);  // the first step
    try {
      for (std::size_t b = bounds_.size() - 1; b-- > 0;) {
        const std::size_t first = bounds_[b], count = bounds_[b + 1] - first;
        start_bucket(std::span<const std::uint32_t>(ids_).subspan(first, count), grads.subspan(first, count), coll);
      }
      settle();
    } catch (...) {
      abandon_step();
      throw;
    }
    return statuses_;
  }

  /// One bucket of the step in progress, as a trainer hands buckets over while its backward pass
  /// runs: `grads[i]` is layer ids[i]'s local gradient, replaced by the average. A collective
  /// call: every rank hands over the same layers in the same order. Any layers not yet handed
  /// over in this step make a bucket, in any grouping, which may change from step to step; the
  /// step ends when every layer has been handed over once. One collective call per round and
  /// operation of the bucket, and in the epochs the detector observes, one allreduce of the
  /// bucket's finiteness flags before them. Returns the bucket's statuses, in the order of ids.
  template <Collective Coll>
  std::span<const step_status> step_bucket(std::span<const std::uint32_t> ids, std::span<const std::span<float>> grads,
                                           Coll& coll) {
    try {
      start_bucket(ids, grads, coll);
      settle();
    } catch (...) {
      abandon_bucket();
      throw;
    }
    return settled_;
  }

  /// The byte budget of the synchronizer's own buckets (step): consecutive layers, grouped from
  /// the last layer back while their gradients' bytes fit, as DDP's bucket_cap_mb does; a layer
  /// larger than the budget is a bucket alone; 0 makes every layer a bucket alone. Default 25 MiB.
  /// Every rank must set the same, before the first step, after which the buckets are fixed
  /// (and recorded in checkpoints).
  void set_bucket_bytes(std::size_t bytes) {
    BELLOWS_EXPECTS(steps_ == 0 && handed_ == 0 && bounds_.empty(),
                    "synchronizer: set_bucket_bytes after the buckets were fixed (by the first step or a "
                    "checkpoint); set it before the first step");
    bucket_bytes_ = bytes;
  }

  /// The synchronizer's own buckets as the first layer of each and then the layer count:
  /// bucket b is layers [buckets()[b], buckets()[b + 1]). Empty before the first step (or a load).
  [[nodiscard]] std::span<const std::uint32_t> buckets() const noexcept { return bounds_; }

  /// Ends the epoch: `lr` is the learning rate of the epoch that starts next. A collective call;
  /// returns the levels in force for the next epoch, identical on every rank.
  template <Collective Coll>
  std::span<const regime> end_epoch(float lr, Coll& coll) {
    const std::span<const regime> next = detector_.end_epoch(epoch_, lr, coll);
    for (std::size_t id = 0; id < layers_.size(); ++id) {
      layer_telemetry& t = telemetry_[id];
      if (level_change_ == level_change::reset && t.participates && next[id] != t.level) {
        // Allocates, once per switch at an epoch's end.
        state_type fresh = (next[id] == regime::critical ? critical_ : normal_).make_state(layers_[id]);
        fresh.step = states_[id].step;
        states_[id] = std::move(fresh);
      }
      t.level = next[id];
    }
    ++epoch_;
    return next;
  }

  /// What a layer's state does when the layer changes level (default keep). Every rank must set
  /// the same; a checkpoint records it and restores only into a synchronizer set the same way.
  void set_level_change(level_change c) noexcept { level_change_ = c; }

  /// Measure each layer's raw local gradient norm per step (one extra read of every gradient;
  /// on the device a sequential one, and one more wait for the stream per step).
  void measure_gradient_norms(bool on) noexcept { measure_norms_ = on; }

  [[nodiscard]] std::size_t layers() const noexcept { return layers_.size(); }
  [[nodiscard]] const layer_info& layer(std::size_t id) const { return layers_.at(id); }
  [[nodiscard]] std::span<const layer_telemetry> telemetry() const noexcept { return telemetry_; }
  /// Traffic of all layers and steps.
  [[nodiscard]] traffic total_sent() const noexcept {
    traffic t;
    for (const layer_telemetry& l : telemetry_) t += l.sent;
    return t;
  }
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }
  [[nodiscard]] D& detector() noexcept { return detector_; }
  [[nodiscard]] const D& detector() const noexcept { return detector_; }
  [[nodiscard]] const state_type& state(std::size_t id) const { return states_.at(id); }

  /// The whole state (compressor states, detector, counters, telemetry) as checkpoint bytes of
  /// rank `at` (a Collective, or rank_place{rank, world}): they restore only at the same place.
  // (clang-format-14 would join the requires clause to the declaration)
  // clang-format off
  [[nodiscard]] std::vector<std::byte> checkpoint(rank_place at) const
    requires CheckpointedCompressor<C> && CheckpointedDetector<D>
  {
    // clang-format on
    BELLOWS_EXPECTS(handed_ == 0, "synchronizer: checkpoint in the middle of a step (", handed_, " of ", layers_.size(),
                    " layers handed over); take it between steps");
    checkpoint_writer w;
    w.put(file_magic);
    w.put(file_version);
    w.put<std::uint64_t>(at.rank());
    w.put<std::uint64_t>(at.size());
    w.put<std::uint64_t>(layers_.size());
    for (const layer_info& l : layers_) {
      w.put_string(l.name);
      w.put<std::uint64_t>(l.shape.rank());
      for (std::size_t d = 0; d < l.shape.rank(); ++d) w.put<std::uint64_t>(l.shape[d]);
    }
    w.put(steps_);
    w.put(epoch_);
    w.put(level_change_);
    w.put<std::uint64_t>(bounds_.size());
    for (const std::uint32_t b : bounds_) w.put(b);
    for (std::size_t id = 0; id < layers_.size(); ++id) {
      const layer_telemetry& t = telemetry_[id];
      w.put(t.level);
      w.put(t.steps);
      w.put(t.skipped);
      w.put(t.sent);
      critical_.save(states_[id], w);
    }
    detector_.save(w);
    return {w.bytes().begin(), w.bytes().end()};
  }

  /// The file of rank `rank` in a checkpoint directory: `<dir>/rank<rank>.ckpt`.
  [[nodiscard]] static std::filesystem::path checkpoint_file(const std::filesystem::path& dir, std::size_t rank) {
    return dir / ("rank" + std::to_string(rank) + ".ckpt");
  }

  /// Writes checkpoint(at) to checkpoint_file(dir, at.rank()), creating `dir` if needed, atomically:
  /// a crash during the save leaves the previous file. Every rank saves its own file.
  void save(const std::filesystem::path& dir, rank_place at) const {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) fail("synchronizer: cannot create the checkpoint directory ", dir, ": ", ec.message());
    write_file_atomically(checkpoint_file(dir, at.rank()), checkpoint(at));
  }

  /// Restores this rank's file of a checkpoint directory that save() wrote at the same world
  /// size. Register every layer first. Raises bellows::wire_error, changing nothing, for a file
  /// of another rank, world size or other layers.
  void load(const std::filesystem::path& dir, rank_place at) { load_file(checkpoint_file(dir, at.rank()), at, false); }

  /// The elastic restart, at any world size: restores rank 0's file of the directory, keeping
  /// its levels, detector, counters and telemetry, but starts every layer's compressor state
  /// fresh, as a level_change::reset switch does (memory zero, PowerSGD's query drawn anew;
  /// the step counter carries over). Every new rank reads the same file.
  void load_elastic(const std::filesystem::path& dir, rank_place at) { load_file(checkpoint_file(dir, 0), at, true); }

  /// Restores checkpoint() bytes of rank `at`. They are validated completely first: bytes of
  /// another rank or world size, of another version, for other layers, or truncated raise
  /// bellows::wire_error and change nothing. Files of versions 2 and 3 record no rank, and load
  /// unchecked.
  void restore(std::span<const std::byte> bytes, rank_place at) { read_checkpoint(bytes, at, false); }

  /// restore() for the elastic restart (load_elastic): bytes of any rank and world size; every
  /// layer's compressor state starts fresh.
  void restore_elastic(std::span<const std::byte> bytes, rank_place at) { read_checkpoint(bytes, at, true); }

private:
  static constexpr std::uint32_t file_magic = 0x43574C42u;  // "BLWC"
  // 2: Accordion's sums in float; 3: the level-change option (a version-2 file reads as keep);
  // 4: the rank, the world size, and the layers' names and shapes instead of their hash;
  // 5: the buckets (a file of an earlier version loads with none: the next step plans them)
  static constexpr std::uint32_t file_version = 5;

  void load_file(const std::filesystem::path& file, rank_place at, bool elastic) {
    try {
      read_checkpoint(read_file(file), at, elastic);
    } catch (const wire_error& e) {
      fail<wire_error>(file.string(), ": ", e.what());
    }
  }

  // (clang-format-14 would join the requires clause to the declaration)
  // clang-format off
  void read_checkpoint(std::span<const std::byte> bytes, rank_place at, bool elastic)
    requires CheckpointedCompressor<C> && CheckpointedDetector<D>
  {
    // clang-format on
    checkpoint_reader r(bytes);
    if (r.get<std::uint32_t>("magic") != file_magic)
      fail<wire_error>("synchronizer: not a bellows checkpoint (bad magic)");
    const auto version = r.get<std::uint32_t>("version");
    if (version < 2 || version > file_version)
      fail<wire_error>("synchronizer: checkpoint version ", version, ", this build reads 2 to ", file_version);
    if (version >= 4) {
      const auto rank = r.get<std::uint64_t>("rank"), world = r.get<std::uint64_t>("world size");
      if (!elastic && (rank != at.rank() || world != at.size()))
        fail<wire_error>("synchronizer: the checkpoint is rank ", rank, "'s of ", world, " ranks, this is rank ",
                         at.rank(), " of ", at.size(),
                         "; each rank loads its own file (load_elastic restarts at another world size)");
      check_saved_layers(r, bytes.size());
    } else if (r.get<std::uint64_t>("layer hash") != hash_ || r.get<std::uint64_t>("layer count") != layers_.size()) {
      fail<wire_error>("synchronizer: checkpoint (version ", version,
                       ", which records no layer names) saved for other layers than the ", layers_.size(),
                       " registered here (names, shapes or count differ)",
                       layers_.empty() ? "; register every layer (add_layer) before load" : "");
    }
    // Restore into copies (fresh states: a load replaces all of a state), and commit only when
    // everything has been read. The detector loads in place and is put back from its own
    // record if anything after that fails.
    auto telemetry = telemetry_;
    std::vector<state_type> states;
    states.reserve(layers_.size());
    const auto steps = r.get<std::uint64_t>("steps");
    const auto epoch = r.get<std::uint64_t>("epoch");
    // Version 2 predates the option: its runs kept their state on a level change.
    if (const auto c = version == 2 ? level_change::keep : r.get<level_change>("level change"); c != level_change_) {
      if (c != level_change::keep && c != level_change::reset)
        fail<wire_error>("synchronizer: checkpoint holds an invalid level change");
      fail<wire_error>("synchronizer: checkpoint saved with level change '", to_string(c),
                       "', this synchronizer is set to '", to_string(level_change_), "'");
    }
    std::vector<std::uint32_t> bounds;
    if (version >= 5) read_buckets(r, bounds);
    for (std::size_t id = 0; id < layers_.size(); ++id) {
      layer_telemetry& t = telemetry[id];
      t.level = r.get<regime>("level");
      if (t.level != regime::critical && t.level != regime::normal)
        fail<wire_error>("synchronizer: layer '", layers_[id].name, "' has an invalid level");
      t.steps = r.get<std::uint64_t>("layer steps");
      t.skipped = r.get<std::uint64_t>("layer skipped steps");
      t.sent = r.get<traffic>("layer traffic");
      states.push_back(critical_.make_state(layers_[id]));
      critical_.load(states.back(), r);
      if (elastic) {  // another rank's memory is no use here: the fresh state of the layer's level
        state_type fresh = (t.level == regime::critical ? critical_ : normal_).make_state(layers_[id]);
        fresh.step = states.back().step;
        states.back() = std::move(fresh);
      }
    }
    checkpoint_writer before;
    detector_.save(before);
    try {
      detector_.load(r);
      r.finish();
      // A detector that counts epochs itself must be at the synchronizer's: a file that pairs
      // them otherwise is corrupt, and would fail at the next end_epoch.
      if constexpr (requires { detector_.epoch(); })
        if (detector_.epoch() != epoch)
          fail<wire_error>("synchronizer: checkpoint of epoch ", epoch, " holds a detector at epoch ",
                           detector_.epoch());
    } catch (...) {
      checkpoint_reader back(before.bytes());
      detector_.load(back);
      throw;
    }
    telemetry_ = std::move(telemetry);
    states_ = std::move(states);
    bounds_ = std::move(bounds);
    steps_ = steps;
    epoch_ = epoch;
  }

  /// Reads the buckets of a version-5 checkpoint into `bounds`: none, or the first layer of each
  /// from 0 up, then the layer count.
  void read_buckets(checkpoint_reader& r, std::vector<std::uint32_t>& bounds) const {
    const auto count = r.get<std::uint64_t>("bucket count");
    if (count == 0) return;
    if (count > layers_.size() + 1 || count < 2)
      fail<wire_error>("synchronizer: the checkpoint holds ", count - 1, " buckets for ", layers_.size(), " layers");
    bounds.resize(count);
    for (std::uint32_t& b : bounds) b = r.get<std::uint32_t>("bucket bound");
    for (std::size_t b = 1; b < count; ++b)
      if (bounds[b] <= bounds[b - 1]) fail<wire_error>("synchronizer: the checkpoint's buckets are out of order");
    if (bounds.front() != 0 || bounds.back() != layers_.size())
      fail<wire_error>("synchronizer: the checkpoint's buckets do not cover the ", layers_.size(), " layers");
  }

  /// Reads the layer list of a version-4 checkpoint and raises wire_error naming the first layer
  /// that differs from the registered ones (both names and shapes), or the counts.
  void check_saved_layers(checkpoint_reader& r, std::size_t file_bytes) const {
    const auto count = r.get<std::uint64_t>("layer count");
    auto saved_layer = [&r, file_bytes]() {
      layer_info l;
      l.name = r.get_string("layer name", file_bytes);  // as long as add_layer took
      const auto dims = r.get<std::uint64_t>("layer dimensions");
      if (dims > shape::max_dims) fail<wire_error>("checkpoint: layer '", l.name, "' has ", dims, " dimensions");
      std::size_t elements = 1;
      for (std::uint64_t d = 0; d < dims; ++d) {
        const auto extent = r.get<std::uint64_t>("layer dimension");
        elements = detail::saturating_mul(elements, extent);
        if (elements == std::numeric_limits<std::size_t>::max())
          fail<wire_error>("checkpoint: layer '", l.name, "' has more elements than a size holds");
        l.shape.push_back(extent);
      }
      return l;
    };
    auto describe = [](const layer_info& l) { return detail::concat("'", l.name, "' of shape ", l.shape.to_string()); };
    const std::size_t common = std::min<std::uint64_t>(count, layers_.size());
    for (std::size_t id = 0; id < common; ++id) {
      const layer_info saved = saved_layer();
      if (saved.name != layers_[id].name || saved.shape != layers_[id].shape)
        fail<wire_error>("synchronizer: checkpoint saved for other layers: layer ", id, " is ", describe(saved),
                         " in the file, ", describe(layers_[id]), " here");
    }
    if (count == layers_.size()) return;
    if (layers_.empty())
      fail<wire_error>("synchronizer: the checkpoint holds ", count,
                       " layers and none is registered here; register every layer (add_layer) before load");
    if (count > layers_.size())
      fail<wire_error>("synchronizer: the checkpoint holds ", count, " layers, ", layers_.size(),
                       " are registered here; the first missing here is ", describe(saved_layer()));
    fail<wire_error>("synchronizer: the checkpoint holds ", count, " layers, ", layers_.size(),
                     " are registered here; the first not in the file is ", describe(layers_[count]));
  }

  std::uint32_t register_layer(std::string name, bellows::shape shp, bool keyed, std::uint64_t key) {
    BELLOWS_EXPECTS(steps_ == 0 && epoch_ == 0, "synchronizer: layer '", name,
                    "' registered after training started; register every layer first");
    const auto id = static_cast<std::uint32_t>(layers_.size());
    const layer_info info{id, std::move(name), shp, keyed, key};
    state_type st = critical_.make_state(info);
    (void)normal_.make_state(info);  // validates the normal level's configuration for this layer
    bool participates = true;
    if constexpr (SelectiveCompressor<C>) participates = critical_.compresses(st);
    detector_.add_layer(info, participates ? participation::included : participation::excluded);
    layer_telemetry t{info.name, shp, participates, regime::critical, step_status::ok, 0, 0, {}, {}};
    t.level = detector_.regimes()[id];
    telemetry_.push_back(std::move(t));
    states_.push_back(std::move(st));
    layers_.push_back(info);
    ids_.push_back(id);
    handed_over_.push_back(0);
    statuses_.push_back(step_status::ok);
    hash_ = mix(hash_, info);
    return id;
  }

  [[nodiscard]] bool observing(std::size_t id) const {
    if constexpr (ObservingDetector<D>)
      return detector_.observing(id);
    else
      return true;
  }
  [[nodiscard]] bool observing_any() const {
    for (std::size_t id = 0; id < layers_.size(); ++id)
      if (observing(id)) return true;
    return false;
  }

  /// A bucket's exchange up to its wait: refusals, the first step's layer check, the vote (in
  /// observed epochs), the norms, the detector's observations, then the exchange started
  /// (bucket_exchange::start). Its layers join the ones settle() concludes.
  template <Collective Coll>
  void start_bucket(std::span<const std::uint32_t> ids, std::span<const std::span<float>> grads, Coll& coll) {
    check_bucket(ids, grads);
    if (steps_ == 0 && handed_ == 0 && settling_.empty()) verify_layers(coll);
    if (flags_.size() != layers_.size()) {  // the first step
      flags_ = float_array_for<Exec>(*exec_, layers_.size());
      norms_ = float_array_for<Exec>(*exec_, layers_.size());
      norms_back_ = host_values_for<Exec, float>(*exec_, layers_.size());
    }
    const bool observe = observing_any();
    std::span<const float> flagged;
    if (observe) flagged = agree_finite(ids, grads, coll);
    if (measure_norms_)  // before the exchange replaces the gradients
      for (std::size_t i = 0; i < ids.size(); ++i) mean_norm(*exec_, grads[i], 1.0, norms_.span().data() + ids[i]);
    const std::size_t first = bucket_.size();
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::uint32_t id = ids[i];
      settling_.push_back(id);
      if (observe && flagged[i] != 0.0f) {
        statuses_[id] = step_status::non_finite;
        handed_over_[id] = voted_out;
        continue;
      }
      handed_over_[id] = handed;
      if (observe && observing(id)) {
        if constexpr (ObservingDetector<D>)
          detector_.observe_finite(id, grads[i]);  // agreed finite above: no second scan
        else
          (void)detector_.observe(id, grads[i]);
      }
      bucket_.push_back({telemetry_[id].level == regime::critical ? &critical_ : &normal_, &states_[id], grads[i]});
      in_bucket_.push_back(id);
    }
    results_.resize(bucket_.size());
    const std::span<const bucket_layer<C>> bucket = std::span<const bucket_layer<C>>(bucket_).subspan(first);
    const std::span<reduce_result> results = std::span<reduce_result>(results_).subspan(first);
    if constexpr (PhasedCompressor<C>) {
      if (exchange_.start(bucket, results, coll)) started_.push_back({first, bucket_.size()});
    } else {  // a compressor without phases: its reduce per layer
      for (std::size_t i = 0; i < bucket.size(); ++i)
        results[i] = bucket[i].compressor->reduce(*bucket[i].state, bucket[i].grad, coll);
    }
  }

  /// The buckets started since the last settle: one wait for the executor (when some bucket
  /// needs it), every layer's conclude, the statuses and telemetry; ends the step once every
  /// layer has been handed over.
  void settle() {
    const bool ends_step = handed_ + settling_.size() == layers_.size();
    if (ends_step && measure_norms_) norms_.send(*exec_, norms_back_);  // read after the wait below
    if (!started_.empty() || (ends_step && measure_norms_)) {
      exec_->synchronize();  // the one wait for all the buckets started, and the norms'

      if constexpr (PhasedCompressor<C>) {
        const auto layers = [&](std::size_t first, std::size_t end) {
          return std::span<const bucket_layer<C>>(bucket_).subspan(first, end - first);
        };
        for (const auto& [first, end] : started_) exchange_.verify(layers(first, end));  // all before any conclude
        for (const auto& [first, end] : started_)
          exchange_.conclude(layers(first, end), std::span<reduce_result>(results_).subspan(first, end - first));
      }
    }
    for (std::size_t i = 0; i < in_bucket_.size(); ++i) {
      statuses_[in_bucket_[i]] = results_[i].status;
      telemetry_[in_bucket_[i]].sent += results_[i].sent;
    }
    settled_.clear();
    for (const std::uint32_t id : settling_) {
      layer_telemetry& t = telemetry_[id];
      t.last_status = statuses_[id];
      ++(t.last_status == step_status::ok ? t.steps : t.skipped);
      settled_.push_back(t.last_status);
    }
    handed_ += settling_.size();
    clear_started();
    if (handed_ == layers_.size()) end_step();
  }

  /// After a failure in step: no layer of it was concluded (no counter advanced, no staged
  /// memory or query became current), so the step is undone as a whole (the gradients of the
  /// buckets that ran hold their averages; no state changed).
  void abandon_step() {
    clear_started();
    std::ranges::fill(handed_over_, 0);
    handed_ = 0;
  }
  /// After a failure in step_bucket: its layers are not handed over; the buckets before stay.
  void abandon_bucket() {
    for (const std::uint32_t id : settling_) handed_over_[id] = 0;
    clear_started();
  }
  void clear_started() {
    bucket_.clear();
    in_bucket_.clear();
    results_.clear();
    started_.clear();
    settling_.clear();
  }

  /// The finiteness vote of a bucket: per layer ids[i], the number of ranks whose gradient of
  /// it holds NaN or Inf, at i (host memory; on the device read back, a wait for the stream).
  template <Collective Coll>
  std::span<const float> agree_finite(std::span<const std::uint32_t> ids, std::span<const std::span<float>> grads,
                                      Coll& coll) {
    const std::span<float> flags = flags_.span().first(ids.size());
    fill(*exec_, flags, 0.0f);
    for (std::size_t i = 0; i < ids.size(); ++i) flag_non_finite(*exec_, grads[i], flags.data() + i);
    coll.allreduce_sum(flags);
    return flags_.host(*exec_, flags_host_).first(ids.size());
  }

  /// Refuses, before anything changes, a bucket with a layer that is not registered, was handed
  /// over already in this step or twice in it, or whose gradient has another length.
  void check_bucket(std::span<const std::uint32_t> ids, std::span<const std::span<float>> grads) {
    BELLOWS_EXPECTS(grads.size() == ids.size(), "synchronizer: a bucket of ", ids.size(), " layers got ", grads.size(),
                    " gradients");
    for (std::size_t i = 0; i < ids.size(); ++i) {
      BELLOWS_EXPECTS(ids[i] < layers_.size(), "synchronizer: a bucket names layer ", ids[i], " of ", layers_.size(),
                      " registered");
      BELLOWS_EXPECTS(grads[i].size() == layers_[ids[i]].size(), "synchronizer: layer '", layers_[ids[i]].name,
                      "' of shape ", layers_[ids[i]].shape.to_string(), " has ", layers_[ids[i]].size(),
                      " elements, its gradient ", grads[i].size());
    }
    std::size_t marked = 0;
    for (; marked < ids.size() && handed_over_[ids[marked]] == 0; ++marked) handed_over_[ids[marked]] = checking;
    const bool fresh = marked == ids.size();
    for (std::size_t i = 0; i < marked; ++i) handed_over_[ids[i]] = 0;
    if (!fresh)
      fail("synchronizer: layer '", layers_[ids[marked]].name, "' handed over twice in step ", steps_,
           "; hand over each layer once per step");
  }

  /// After the last bucket of a step: the norms measured, the counters.
  void end_step() {
    if (measure_norms_)  // sent back before settle's wait
      for (std::size_t id = 0; id < layers_.size(); ++id)
        if (handed_over_[id] != voted_out) telemetry_[id].grad_norm = norms_back_[id];
    std::ranges::fill(handed_over_, 0);
    handed_ = 0;
    ++steps_;
  }

  /// Every rank registered the same layers: one allreduce of the bytes b of the layer count and
  /// of a hash of the names and shapes, each beside its square; the sum of squares equals
  /// (sum)^2 / W for every byte exactly when all ranks hold the same bytes, and every rank
  /// computes the same verdict from the same sums (exact in float for up to 256 ranks). When
  /// the counts agree but the hashes do not, a second allreduce of one such hash per layer finds
  /// the first layer that differs, which each rank names as it has it.
  template <Collective Coll>
  void verify_layers(Coll& coll) {
    std::vector<float> sums(24);  // the first step only
    put_byte_sums(sums, 0, hash_, 8);
    put_byte_sums(sums, 16, layers_.size(), 4);
    coll.allreduce_sum(std::span<float>(sums));
    const double w = static_cast<double>(coll.size());
    if (!same_bytes(sums, 16, 4, w)) {
      double mean = 0;
      for (int b = 3; b >= 0; --b) mean = mean * 256 + sums[16 + b] / w;
      fail("synchronizer: the ranks registered different numbers of layers: this rank ", layers_.size(),
           ", the mean over the ", coll.size(), " ranks ", mean);
    }
    if (same_bytes(sums, 0, 8, w)) return;
    sums.assign(16 * layers_.size(), 0.0f);
    for (std::size_t id = 0; id < layers_.size(); ++id) put_byte_sums(sums, 16 * id, mix(offset_basis, layers_[id]), 8);
    coll.allreduce_sum(std::span<float>(sums));
    for (std::size_t id = 0; id < layers_.size(); ++id)
      if (!same_bytes(sums, 16 * id, 8, w))
        fail("synchronizer: the ranks registered different layers: layer ", id,
             " differs between ranks; this rank has '", layers_[id].name, "' of shape ", layers_[id].shape.to_string());
    fail("synchronizer: the ranks registered different layers, in an order that no single layer shows");
  }

  /// sums[at + b] = byte b of v, sums[at + bytes + b] = its square, for b < bytes.
  static void put_byte_sums(std::span<float> sums, std::size_t at, std::uint64_t v, int bytes) {
    for (int b = 0; b < bytes; ++b) {
      const auto byte = static_cast<float>((v >> (8 * b)) & 0xFF);
      sums[at + b] = byte;
      sums[at + bytes + b] = byte * byte;
    }
  }
  /// Whether put_byte_sums' entries at `at`, summed over `w` ranks, came from equal bytes.
  static bool same_bytes(std::span<const float> sums, std::size_t at, int bytes, double w) {
    for (int b = 0; b < bytes; ++b)
      if (double{sums[at + b]} * sums[at + b] != w * sums[at + bytes + b]) return false;
    return true;
  }

  /// FNV-1a over a layer's name, dimensions and stream key (if it has one), chained.
  static std::uint64_t mix(std::uint64_t h, const layer_info& info) {
    auto add = [&h](std::uint64_t v) {
      for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xFF)) * 0x100000001B3ULL;
    };
    for (char ch : info.name) add(static_cast<unsigned char>(ch));
    add(info.shape.rank());
    for (std::size_t d = 0; d < info.shape.rank(); ++d) add(info.shape[d]);
    if (info.keyed) add(info.key);
    return h;
  }

  // handed_over_: per layer, in the step in progress
  static constexpr std::uint8_t handed = 1, voted_out = 2, checking = 3;

  C critical_, normal_;  // the compressors of regime::critical and regime::normal
  D detector_;
  Exec* exec_;
  bucket_exchange<Exec> exchange_;
  std::vector<layer_info> layers_;
  std::vector<state_type> states_;
  std::vector<layer_telemetry> telemetry_;
  std::vector<step_status> statuses_;      // per layer, of the step in progress or the last
  std::vector<std::uint32_t> ids_;         // 0, 1, 2, ...: the layers of step's buckets
  std::vector<std::uint8_t> handed_over_;  // per layer: handed, voted_out, or 0
  std::size_t handed_ = 0;                 // layers handed over in the step in progress
  std::vector<std::uint32_t> bounds_;      // the own buckets (buckets())
  std::size_t bucket_bytes_ = std::size_t{25} << 20;
  // The buckets started and not yet settled: their layers (bucket_, in_bucket_, results_), the
  // spans of bucket_ that a wait and conclude settle (started_), and the ids handed over with
  // them (settling_), whose statuses step_bucket returns (settled_).
  std::vector<bucket_layer<C>> bucket_;
  std::vector<std::uint32_t> in_bucket_;
  std::vector<reduce_result> results_;
  std::vector<std::pair<std::size_t, std::size_t>> started_;
  std::vector<std::uint32_t> settling_;
  std::vector<step_status> settled_;

  float_array_for<Exec> flags_, norms_;      // one per layer: the finiteness vote, the measured norms
  std::vector<float> flags_host_;            // the vote's host copy (used on the device)
  host_values_for<Exec, float> norms_back_;  // the norms' (pinned on the device)
  static constexpr std::uint64_t offset_basis = 0xCBF29CE484222325ULL;  // FNV-1a's
  std::uint64_t hash_ = offset_basis;
  std::uint64_t steps_ = 0, epoch_ = 0;
  bool measure_norms_ = false;
  level_change level_change_ = level_change::keep;
};

}  // namespace bellows

#if defined(__CUDACC__)  // the device backend, for device code
#include "bellows/sync/synchronizer.cuh"
#endif
