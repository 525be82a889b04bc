// SPDX-License-Identifier: Apache-2.0
// Accordion's regime detector (Agarwal et al., "Accordion: Adaptive Gradient Communication via
// Critical Learning Regime Identification", MLSys 2021) with the changes docs/spec.md#accordion names,
// and its batch-size variant.
//
// Epochs. The detector counts them itself: epoch 0 is in progress after construction, and each
// end_epoch(e, ...) ends epoch e and starts e + 1. The `epoch` argument must equal that count
// (epochs numbered from 0, each ended once, in order); anything else raises. A resumed run gets
// the count back through restore().
//
// Backends. basic_accordion<Exec> is written once: `accordion` (cpu::executor) keeps its sums in
// host memory, basic_accordion<cuda::executor> (regime/accordion.cuh) in device memory, where it
// takes device gradients; both sum and take norms in the same order, so they decide alike.
//
// Accumulation. During a check epoch (epoch % interval == 0) observe() adds each raw local
// gradient of a participating layer into a float sum of the layer's size (allocated at
// add_layer; observe never allocates); in other epochs it returns at once. A float sum over s
// steps is off from the exact sum by at most about s * 6e-8 relative (2e-5 over a 300-step
// epoch), which moves the relative norm change that the rule compares with eta (0.5 by default)
// by as little; double sums would cost 8 bytes per parameter of host memory instead of 4 and
// two thirds more memory traffic per observed step. Finite gradients of magnitude near
// FLT_MAX / steps can make a sum overflow to +-Inf: that layer's norm is then Inf on every rank
// (the norms are allreduced), its check is critical, and it is remembered as norm 0, so that
// the next check is critical too; a checkpoint taken mid-epoch keeps the infinite sums.
//
// Decision. At the end of a check epoch each rank takes the L2 norm of its own mean gradient per
// layer (sum / steps observed, in double, rounded to float: cpu::mean_norm), one allreduce_sum
// of those L floats (in the backend's memory) divided by W gives every rank the same per-layer
// norm, and the rule of docs/spec.md#the-rule decides from it alone, so every rank reaches the
// same decisions without a broadcast.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bellows/concepts.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/gather_buffer.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/cpu/float_array.hpp"
#include "bellows/plan/float_array.hpp"
#include "bellows/regime/accordion_types.hpp"

namespace bellows {

/// The Accordion detector over the layers of a model; models RegimeDetector. Gradients and sums
/// live in Exec's memory (host for cpu::executor, device for cuda::executor); decisions, norms
/// and state() on the host.
/// Usage per rank: add_layer for every layer (ids 0, 1, 2, ...), then per step observe(id, g)
/// with each layer's raw local gradient, and per epoch end_epoch(epoch, lr, collective), where
/// `lr` is the learning rate of the epoch that starts next. Before the first check every
/// participating layer is critical (there is no previous check).
template <class Exec>
class basic_accordion {
public:
  /// `accordion({})` takes the default parameters. There is no default constructor: with one,
  /// `{}` could also make a temporary accordion to copy, and `accordion({})` would be ambiguous.
  explicit basic_accordion(accordion_params params, Exec& exec = Exec::shared())
      : params_(params), exec_(&exec), flag_(exec, 1) {
    params_.validate();
  }

  /// Registers the next layer (ids 0, 1, 2, ... in order), before the first end_epoch.
  void add_layer(const layer_info& layer, participation p = participation::included) {
    BELLOWS_EXPECTS(layer.id == layers_.size(), "accordion: layer '", layer.name, "' has id ", layer.id,
                    ", expected the next id ", layers_.size());
    BELLOWS_EXPECTS(state_.epoch == 0, "accordion: layer '", layer.name,
                    "' registered after epoch 0 ended; register every layer before training");
    layers_.push_back(layer);
    participation_.push_back(p);
    state_.regimes.push_back(regime::critical);
    state_.norm_prev.push_back(0.0f);
    state_.steps.push_back(0);
    sums_.emplace_back(*exec_, p == participation::included ? layer.size() : 0);
    if (p == participation::included) included_.push_back(layer.id);
    mine_.resize(agreement_header + layers_.size() * (1 + sizeof(float)));
  }

  /// True when observe(id, ...) would accumulate now: the layer takes part and the epoch in
  /// progress is a check epoch. A trainer may skip preparing the gradient otherwise.
  [[nodiscard]] bool observing(std::size_t id) const {
    check_id(id);
    return participation_[id] == participation::included && check_epoch(state_.epoch);
  }

  /// Adds one step's raw local gradient of layer `id` to the epoch's sum (a no-op outside check
  /// epochs and for excluded layers). A gradient holding NaN or Inf changes nothing and returns
  /// step_status::non_finite; this check is local, so a trainer that wants all ranks to skip
  /// together calls observe only for steps the ranks agreed were finite. On the device the
  /// check reads its flag back: one wait for the stream per observed call.
  step_status observe(std::size_t id, std::span<const float> grad) {
    check_size(id, grad);
    if (!observing(id)) return step_status::ok;
    fill(*exec_, flag_.span(), 0.0f);
    flag_non_finite(*exec_, grad, flag_.span().data());
    if (flag_.host(*exec_, flag_host_)[0] != 0.0f) return step_status::non_finite;
    accumulate(id, grad);
    return step_status::ok;
  }

  /// observe() for a gradient the caller has already found finite (the Synchronizer agrees on
  /// that across ranks first): the same, without the pass that looks for NaN and Inf.
  void observe_finite(std::size_t id, std::span<const float> grad) {
    check_size(id, grad);
    if (observing(id)) accumulate(id, grad);
  }

  /// Ends epoch `epoch` (which must be the one in progress); `lr` is the learning rate of the
  /// next epoch. A collective call on every rank: at a check epoch one allreduce_sum of one float
  /// per participating layer, and with check_agreement one allgather; otherwise no traffic.
  /// Returns one regime per layer, in force for the next epoch and identical on every rank.
  template <Collective C>
  std::span<const regime> end_epoch(std::size_t epoch, float lr, C& coll) {
    BELLOWS_EXPECTS(epoch == state_.epoch, "accordion: end_epoch(", epoch, ") while epoch ", state_.epoch,
                    " is in progress (epochs are numbered from 0 and each is ended once, in order)");
    BELLOWS_EXPECTS(std::isfinite(lr) && lr > 0, "accordion: the learning rate must be a finite number > 0, got ", lr);
    if (check_epoch(epoch)) check(coll);
    // A learning-rate decay at this boundary: low compression everywhere until the next check.
    if (state_.lr > 0 && lr < state_.lr)
      for (std::uint32_t id : included_) state_.regimes[id] = regime::critical;
    state_.lr = lr;
    ++state_.epoch;
    if (params_.check_agreement) agree(coll);
    return state_.regimes;
  }

  /// The decisions in force, one per layer.
  [[nodiscard]] std::span<const regime> regimes() const noexcept { return state_.regimes; }
  /// The epoch in progress.
  [[nodiscard]] std::uint64_t epoch() const noexcept { return state_.epoch; }
  [[nodiscard]] std::size_t layers() const noexcept { return layers_.size(); }
  [[nodiscard]] bool participates(std::size_t id) const {
    check_id(id);
    return participation_[id] == participation::included;
  }
  [[nodiscard]] const accordion_params& params() const noexcept { return params_; }

  /// The whole state, for saving: a copy, whose sums are read back from the backend's memory.
  [[nodiscard]] accordion_state state() const {
    accordion_state s = state_;
    s.sums.resize(sums_.size());
    std::vector<float> staging;
    for (std::size_t id = 0; id < sums_.size(); ++id) {
      const std::span<const float> sum = sums_[id].host(*exec_, staging);
      s.sums[id].assign(sum.begin(), sum.end());
    }
    return s;
  }

  /// Puts back a state saved from a detector with the same layers and participation; raises
  /// bellows::error naming the first layer or field that does not fit, and then changes nothing.
  void restore(accordion_state saved) {
    const std::size_t n = layers_.size();
    BELLOWS_EXPECTS(
        saved.regimes.size() == n && saved.norm_prev.size() == n && saved.steps.size() == n && saved.sums.size() == n,
        "accordion restore: the saved state has ", saved.regimes.size(), " regimes, ", saved.norm_prev.size(),
        " norms, ", saved.steps.size(), " step counts and ", saved.sums.size(), " sums for ", n, " registered layers");
    BELLOWS_EXPECTS(std::isfinite(saved.lr) && saved.lr >= 0,
                    "accordion restore: the saved learning rate must be a finite number >= 0, got ", saved.lr);
    for (std::size_t id = 0; id < n; ++id) {
      const bool in = participation_[id] == participation::included;
      const regime r = saved.regimes[id];
      BELLOWS_EXPECTS(r == regime::critical || r == regime::normal, "accordion restore: layer '", layers_[id].name,
                      "': unknown saved regime value ", static_cast<int>(r));
      BELLOWS_EXPECTS(saved.sums[id].size() == (in ? layers_[id].size() : 0), "accordion restore: layer '",
                      layers_[id].name, "' (", in ? "included" : "excluded", ", ", layers_[id].size(),
                      " elements) has a saved sum of ", saved.sums[id].size(), " elements");
      BELLOWS_EXPECTS(std::isfinite(saved.norm_prev[id]) && saved.norm_prev[id] >= 0, "accordion restore: layer '",
                      layers_[id].name, "': the saved norm must be a finite number >= 0, got ", saved.norm_prev[id]);
    }
    for (std::size_t id = 0; id < n; ++id) sums_[id].assign(*exec_, saved.sums[id]);
    saved.sums.clear();  // they live in sums_
    state_ = std::move(saved);
  }

  /// Checkpoint: state() field by field, each array with its length (the same bytes from
  /// either backend).
  void save(checkpoint_writer& w) const {
    w.put(state_.epoch);
    w.put(state_.checks);
    w.put(state_.lr);
    w.put_array(std::span<const regime>(state_.regimes));
    w.put_array(std::span<const float>(state_.norm_prev));
    w.put_array(std::span<const std::uint64_t>(state_.steps));
    std::vector<float> staging;
    for (const float_array_for<Exec>& sum : sums_) w.put_array(sum.host(*exec_, staging));
  }

  /// Reads what save() wrote for a detector with the same layers; anything that does not fit
  /// raises bellows::wire_error and changes nothing.
  void load(checkpoint_reader& r) {
    accordion_state saved = state_;  // the shapes to read into
    saved.sums.resize(sums_.size());
    for (std::size_t id = 0; id < sums_.size(); ++id) saved.sums[id].resize(sums_[id].size());
    saved.epoch = r.get<std::uint64_t>("accordion epoch");
    saved.checks = r.get<std::uint64_t>("accordion checks");
    saved.lr = r.get<float>("accordion learning rate");
    r.get_array(std::span<regime>(saved.regimes), "accordion regimes");
    r.get_array(std::span<float>(saved.norm_prev), "accordion norms");
    r.get_array(std::span<std::uint64_t>(saved.steps), "accordion step counts");
    for (std::vector<float>& sum : saved.sums) {
      r.get_array(std::span<float>(sum), "accordion gradient sum");
      for (float v : sum)  // +-Inf is a sum that overflowed; NaN no sum of finite values gives
        if (std::isnan(v)) fail<wire_error>("accordion: a saved gradient sum is NaN");
    }
    try {
      restore(std::move(saved));
    } catch (const wire_error&) {
      throw;
    } catch (const error& e) {
      fail<wire_error>(e.what());
    }
  }

private:
  static constexpr std::size_t agreement_header = 2 * sizeof(std::uint64_t) + sizeof(float);

  [[nodiscard]] bool check_epoch(std::uint64_t epoch) const noexcept { return epoch % params_.interval == 0; }

  void check_id(std::size_t id) const {
    BELLOWS_EXPECTS(id < layers_.size(), "accordion: unknown layer id ", id, " of ", layers_.size(),
                    " registered layers");
  }

  void check_size(std::size_t id, std::span<const float> grad) const {
    check_id(id);
    BELLOWS_EXPECTS(grad.size() == layers_[id].size(), "accordion: layer '", layers_[id].name, "' of shape ",
                    layers_[id].shape.to_string(), " has ", layers_[id].size(), " elements, the gradient ",
                    grad.size());
  }

  void accumulate(std::size_t id, std::span<const float> grad) {
    add_into(*exec_, sums_[id].span(), grad);
    ++state_.steps[id];
  }

  /// The rule of docs/spec.md#the-rule: critical with no previous check, a previous norm of 0, or a relative
  /// change of at least eta.
  [[nodiscard]] bool critical(float prev, float now) const noexcept {
    if (state_.checks == 0 || prev == 0.0f) return true;
    const double change = std::abs(static_cast<double>(prev) - static_cast<double>(now));
    return change / static_cast<double>(prev) >= static_cast<double>(params_.eta);
  }

  /// Each participating layer's mean-gradient norm (0 for a layer it observed no step of),
  /// taken where the sums live, one allreduce_sum of them, and the rule applied on the host.
  template <Collective C>
  void check(C& coll) {
    if (norms_.size() != included_.size()) norms_ = float_array_for<Exec>(*exec_, included_.size());  // at the first
    for (std::size_t k = 0; k < included_.size(); ++k) {
      const std::uint32_t id = included_[k];
      mean_norm(*exec_, sums_[id].span(), static_cast<double>(state_.steps[id]), norms_.span().data() + k);
    }
    coll.allreduce_sum(norms_.span());
    const std::span<const float> summed = norms_.host(*exec_, norms_host_);
    const auto ranks = static_cast<float>(coll.size());
    for (std::size_t k = 0; k < included_.size(); ++k) {
      const std::uint32_t id = included_[k];
      const float now = summed[k] / ranks;
      const bool overflowed = !std::isfinite(now);  // on every rank alike
      state_.regimes[id] = overflowed || critical(state_.norm_prev[id], now) ? regime::critical : regime::normal;
      state_.norm_prev[id] = overflowed ? 0.0f : now;
      fill(*exec_, sums_[id].span(), 0.0f);
      state_.steps[id] = 0;
    }
    ++state_.checks;
  }

  /// Allgathers what every later decision depends on (epoch, checks, learning rate, regimes,
  /// norms) and raises on every rank if any rank's bytes differ from this rank's.
  template <Collective C>
  void agree(C& coll) {
    write_agreement(mine_);
    coll.allgather(std::span<const std::byte>(mine_), gathered_);
    for (std::size_t r = 0; r < gathered_.blocks(); ++r) {
      const std::span<const std::byte> theirs = gathered_.block(r);
      if (theirs.size() == mine_.size() && std::memcmp(theirs.data(), mine_.data(), mine_.size()) == 0) continue;
      fail("accordion: ranks disagree after epoch ", state_.epoch - 1, ": rank ", coll.rank(), " and rank ", r,
           " differ in ", first_difference(theirs),
           " (the collective returned different sums to different ranks, or the ranks "
           "registered different layers or passed different learning rates)");
    }
  }

  void write_agreement(std::span<std::byte> out) const {
    std::byte* p = out.data();
    const auto put = [&p](const auto& value) {
      std::memcpy(p, &value, sizeof(value));
      p += sizeof(value);
    };
    put(state_.epoch);
    put(state_.checks);
    put(state_.lr);
    for (regime r : state_.regimes) put(r);
    for (float norm : state_.norm_prev) put(norm);
  }

  /// Names the first field in which another rank's agreement block differs from this rank's.
  [[nodiscard]] std::string first_difference(std::span<const std::byte> theirs) const {
    if (theirs.size() != mine_.size())
      return detail::concat("layer count (a block of ", theirs.size(), " bytes, expected ", mine_.size(), ")");
    const auto differs = [&](std::size_t at, std::size_t bytes) {
      return std::memcmp(theirs.data() + at, mine_.data() + at, bytes) != 0;
    };
    if (differs(0, sizeof(std::uint64_t))) return "the epoch count";
    if (differs(sizeof(std::uint64_t), sizeof(std::uint64_t))) return "the check count";
    if (differs(2 * sizeof(std::uint64_t), sizeof(float))) return "the learning rate";
    const std::size_t n = layers_.size();
    for (std::size_t id = 0; id < n; ++id)
      if (differs(agreement_header + id, 1)) return "the regime of layer '" + layers_[id].name + "'";
    for (std::size_t id = 0; id < n; ++id)
      if (differs(agreement_header + n + id * sizeof(float), sizeof(float)))
        return "the gradient norm of layer '" + layers_[id].name + "'";
    return "their state";
  }

  accordion_params params_;
  Exec* exec_;
  std::vector<layer_info> layers_;
  std::vector<participation> participation_;
  std::vector<std::uint32_t> included_;        // ids of the participating layers, in order
  std::vector<float_array_for<Exec>> sums_;    // one per layer (empty for an excluded one)
  float_array_for<Exec> norms_;                // one per participating layer, exchanged at checks
  float_array_for<Exec> flag_;                 // observe()'s finiteness check
  std::vector<float> norms_host_, flag_host_;  // their host copies (used on the device)
  accordion_state state_;                      // all but the sums (state() adds them)
  std::vector<std::byte> mine_;                // this rank's agreement block
  gather_buffer gathered_;
};

/// The detector on the CPU, over host gradients.
using accordion = basic_accordion<cpu::executor>;

static_assert(RegimeDetector<accordion, archetypes::collective>, "accordion must model RegimeDetector");
static_assert(LevelDetector<accordion> && ObservingDetector<accordion> && CheckpointedDetector<accordion>,
              "accordion must be a checkpointed, observing LevelDetector, as the Synchronizer uses it");

/// Accordion's batch-size variant: the same detector chooses the batch size of each epoch, the
/// small one while any participating layer is critical, else the large one. (With one layer
/// spanning the whole model this is the paper's whole-model signal.) Scaling the learning rate
/// with the batch size, if the trainer wants it, is the trainer's business.
template <class Exec>
class basic_accordion_batch_size {
public:
  explicit basic_accordion_batch_size(batch_sizes sizes, accordion_params params = {}, Exec& exec = Exec::shared())
      : sizes_(sizes), detector_(params, exec) {
    sizes_.validate();
  }

  void add_layer(const layer_info& layer, participation p = participation::included) { detector_.add_layer(layer, p); }
  step_status observe(std::size_t id, std::span<const float> grad) { return detector_.observe(id, grad); }

  /// Ends the epoch as accordion::end_epoch does; returns the batch size of the next epoch.
  template <Collective C>
  std::size_t end_epoch(std::size_t epoch, float lr, C& coll) {
    detector_.end_epoch(epoch, lr, coll);
    return batch_size();
  }

  /// The batch size in force (the small one before the first check).
  [[nodiscard]] std::size_t batch_size() const {
    const std::span<const regime> r = detector_.regimes();
    for (std::size_t id = 0; id < r.size(); ++id)
      if (detector_.participates(id) && r[id] == regime::critical) return sizes_.small;
    return sizes_.large;
  }

  [[nodiscard]] const batch_sizes& sizes() const noexcept { return sizes_; }
  /// The underlying detector (per-layer regimes, state for save and restore).
  [[nodiscard]] basic_accordion<Exec>& detector() noexcept { return detector_; }
  [[nodiscard]] const basic_accordion<Exec>& detector() const noexcept { return detector_; }

private:
  batch_sizes sizes_;
  basic_accordion<Exec> detector_;
};

/// The batch-size variant on the CPU.
using accordion_batch_size = basic_accordion_batch_size<cpu::executor>;

}  // namespace bellows

#if defined(__CUDACC__)  // the device backend, for device code
#include "bellows/regime/accordion.cuh"
#endif
