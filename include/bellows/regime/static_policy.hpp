// SPDX-License-Identifier: Apache-2.0
// The static policy: every participating layer always in one regime, so a compressor always
// runs at its low level (`critical`) or always at its high level (`normal`). The baselines that
// Accordion is measured against.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "bellows/concepts.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/regime/accordion_types.hpp"

namespace bellows {

/// A RegimeDetector that never changes its mind: no accumulation, no traffic. Excluded layers
/// are reported `critical`, as the Accordion detector reports them.
class static_policy {
public:
  explicit static_policy(regime always) : always_(always) {}

  /// Registers the next layer (ids 0, 1, 2, ... in order).
  void add_layer(const layer_info& layer, participation p = participation::included) {
    BELLOWS_EXPECTS(layer.id == regimes_.size(), "static_policy: layer '", layer.name, "' has id ", layer.id,
                    ", expected the next id ", regimes_.size());
    regimes_.push_back(p == participation::included ? always_ : regime::critical);
  }

  step_status observe(std::size_t id, std::span<const float> /*grad*/) const {
    BELLOWS_EXPECTS(id < regimes_.size(), "static_policy: unknown layer id ", id, " of ", regimes_.size(),
                    " registered layers");
    return step_status::ok;
  }

  /// Never: it observes nothing, so a Synchronizer needs no agreement on finiteness of its own
  /// (each compressor's first exchange makes the ranks agree).
  [[nodiscard]] bool observing(std::size_t id) const {
    BELLOWS_EXPECTS(id < regimes_.size(), "static_policy: unknown layer id ", id, " of ", regimes_.size(),
                    " registered layers");
    return false;
  }

  /// Nothing to observe (observing is never true); checks the id as observe does.
  void observe_finite(std::size_t id, std::span<const float> grad) const { (void)observe(id, grad); }

  template <Collective C>
  std::span<const regime> end_epoch(std::size_t /*epoch*/, float /*lr*/, C& /*coll*/) const noexcept {
    return regimes_;
  }

  [[nodiscard]] std::span<const regime> regimes() const noexcept { return regimes_; }

  /// Checkpoint: the fixed decisions, so a checkpoint of another policy is refused on load.
  void save(checkpoint_writer& w) const { w.put_array(std::span<const regime>(regimes_)); }
  void load(checkpoint_reader& r) const {
    std::vector<regime> saved(regimes_.size());
    r.get_array(std::span<regime>(saved), "static policy regimes");
    if (saved != regimes_) fail<wire_error>("static_policy: the checkpoint was saved with another static policy");
  }

private:
  regime always_;
  std::vector<regime> regimes_;
};

static_assert(RegimeDetector<static_policy, archetypes::collective>, "static_policy must model RegimeDetector");
static_assert(LevelDetector<static_policy> && ObservingDetector<static_policy> && CheckpointedDetector<static_policy>,
              "static_policy must be a checkpointed, observing LevelDetector, as the Synchronizer uses it");

}  // namespace bellows
