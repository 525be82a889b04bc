// SPDX-License-Identifier: Apache-2.0
// Parameters and saved state of the Accordion detector (regime/accordion.hpp): plain structs that
// a trainer fills, stores and restores without knowing the detector's internals.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "bellows/core/error.hpp"
#include "bellows/plan/regime.hpp"

namespace bellows {

/// Configuration of the Accordion detector (docs/spec.md#accordion).
struct accordion_params {
  /// A layer is critical at a check when |norm_prev - norm_now| / norm_prev >= eta.
  float eta = 0.5f;
  /// Checks happen at the end of epochs e with e % interval == 0.
  std::size_t interval = 10;
  /// When true, every end_epoch also allgathers each rank's decisions and detector state
  /// (20 + 5 L bytes for L layers) and raises bellows::error on every rank if any two differ.
  /// Cost: one allgather per epoch; off by default because the allreduce already makes every
  /// rank decide the same, unless the collective returns different sums to different ranks.
  bool check_agreement = false;

  /// Raises bellows::error naming the bad value.
  void validate() const {
    BELLOWS_EXPECTS(std::isfinite(eta) && eta > 0, "accordion: eta must be a finite number > 0, got ", eta);
    BELLOWS_EXPECTS(interval >= 1, "accordion: interval must be at least 1 epoch, got ", interval);
  }
};

/// The two batch sizes of Accordion's batch-size variant: `small` in critical regimes, `large`
/// elsewhere (per worker, or global: the detector does not care which the trainer means).
struct batch_sizes {
  std::size_t small = 0;
  std::size_t large = 0;

  /// Raises bellows::error naming the bad value.
  void validate() const {
    BELLOWS_EXPECTS(small >= 1, "accordion batch size: the small batch size must be >= 1, got ", small);
    BELLOWS_EXPECTS(large >= small, "accordion batch size: the large batch size (", large,
                    ") must be >= the small one (", small, ")");
  }
};

/// Everything the Accordion detector remembers between steps, one entry per registered layer in
/// every vector. `accordion::state()` returns it and `accordion::restore()` takes it back, so a
/// resumed run decides exactly as the uninterrupted one; a Synchronizer serialises it field by
/// field. Excluded layers keep an empty `sums` entry.
struct accordion_state {
  std::uint64_t epoch = 0;               ///< the epoch in progress (end_epoch calls so far)
  std::uint64_t checks = 0;              ///< checks done so far (0: no previous check)
  float lr = 0.0f;                       ///< the learning rate of the last end_epoch; 0 before it
  std::vector<regime> regimes;           ///< the decision in force
  std::vector<float> norm_prev;          ///< the mean-gradient norm found at the last check
  std::vector<std::uint64_t> steps;      ///< steps observed in the current check epoch
  std::vector<std::vector<float>> sums;  ///< the gradient summed over those steps

  friend bool operator==(const accordion_state&, const accordion_state&) = default;
};

}  // namespace bellows
