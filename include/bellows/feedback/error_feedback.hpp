// SPDX-License-Identifier: Apache-2.0
// Error feedback: the memory that carries into the next step what compression left out
// (Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory", 2018).
//
// `layer_memory<Exec>` is one layer's memory in a backend's memory (`error_memory` on the CPU);
// compressors that fuse the update into their own passes keep one in their per-layer state. `error_feedback` models the ErrorFeedback concept over many
// layers, for composing a memory with any compressor by hand.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "bellows/concepts.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
#include "bellows/cpu/float_array.hpp"
#include "bellows/plan/float_array.hpp"
#include "bellows/plan/feedback.hpp"

namespace bellows {

/// One layer's error memory in the backend's memory: n floats (none for `feedback::none`), zero
/// at the start. Compressors written once over an executor keep one in their per-layer state.
template <class Exec>
class layer_memory {
public:
  layer_memory() = default;
  layer_memory(Exec& exec, feedback kind, std::size_t n) : kind_(kind), e_(exec, kind == feedback::none ? 0 : n) {}

  [[nodiscard]] feedback kind() const noexcept { return kind_; }
  [[nodiscard]] bool enabled() const noexcept { return kind_ != feedback::none; }
  /// The values, in the backend's memory.
  [[nodiscard]] std::span<float> values() noexcept { return e_.span(); }
  [[nodiscard]] std::span<const float> values() const noexcept { return e_.span(); }
  /// The values readable on the host (waits for the executor; `staging` as float_array::host).
  [[nodiscard]] std::span<const float> host(Exec& exec, std::vector<float>& staging) const {
    return e_.host(exec, staging);
  }
  /// Host values in (as many as the memory holds), complete on return.
  void assign(Exec& exec, std::span<const float> from) { e_.assign(exec, from); }

  /// Raises bellows::error, naming the compressor `who` and the layer, when this memory is not of
  /// `kind`: a state made by a compressor of one feedback, used by one of another.
  void check_kind(std::string_view who, std::string_view layer, feedback kind) const {
    BELLOWS_EXPECTS(kind_ == kind, who, ": layer '", layer, "' has a state made with feedback ", to_string(kind_),
                    ", used by a compressor with feedback ", to_string(kind));
  }

  /// Called when the trainer's learning rate changes from lr_old to lr_new: a `scaled` memory is
  /// multiplied by lr_old / lr_new (the quotient in float), so it stands for the same parameter
  /// update; others ignore it. Raises bellows::error, naming `who`, for a rate that is not > 0.
  void rescale(Exec& exec, float lr_old, float lr_new, std::string_view who = "error_memory") {
    BELLOWS_EXPECTS(lr_old > 0 && lr_new > 0, who, ": learning rates must be > 0, got ", lr_old, " and ", lr_new);
    if (kind_ == feedback::scaled && lr_old != lr_new) scale(exec, e_.span(), lr_old / lr_new);
  }

private:
  feedback kind_ = feedback::none;
  float_array_for<Exec> e_;
};

/// One layer's error memory in host memory.
using error_memory = layer_memory<cpu::executor>;

/// ErrorFeedback over the layers of a model, for any compressor: compensate before compressing,
/// update with what this rank's compensated gradient became.
class error_feedback {
public:
  explicit error_feedback(feedback kind, cpu::executor& exec = cpu::executor::shared()) : kind_(kind), exec_(&exec) {}

  [[nodiscard]] feedback kind() const noexcept { return kind_; }

  /// Layers are added in id order 0, 1, 2, ...
  void add_layer(const layer_info& layer) {
    BELLOWS_EXPECTS(layer.id == layers_.size(), "error_feedback: layer '", layer.name, "' has id ", layer.id,
                    ", expected the next id ", layers_.size());
    layers_.emplace_back(*exec_, kind_, layer.size());
    names_.push_back(layer.name);
  }

  /// grad = grad + e.
  void compensate(std::size_t id, std::span<float> grad) {
    error_memory& m = checked(id, grad.size());
    if (m.enabled()) cpu::add_into(*exec_, grad, m.values());
  }

  /// e = compensated - contribution.
  void update(std::size_t id, std::span<const float> compensated, std::span<const float> contribution) {
    error_memory& m = checked(id, compensated.size());
    BELLOWS_EXPECTS(contribution.size() == compensated.size(), "error_feedback: layer '", names_[id],
                    "': contribution of ", contribution.size(), " elements for ", compensated.size());
    if (m.enabled()) cpu::subtract(*exec_, m.values(), compensated, contribution);
  }

  /// Tells every memory of a change of learning rate (only `scaled` memories act on it).
  void set_learning_rate(float lr) {
    BELLOWS_EXPECTS(lr > 0, "error_feedback: learning rate must be > 0, got ", lr);
    if (lr_ > 0)
      for (error_memory& m : layers_) m.rescale(*exec_, lr_, lr);
    lr_ = lr;
  }

  [[nodiscard]] error_memory& memory(std::size_t id) { return checked(id, layers_.at(id).values().size()); }
  [[nodiscard]] std::size_t layers() const noexcept { return layers_.size(); }

private:
  error_memory& checked(std::size_t id, std::size_t n) {
    BELLOWS_EXPECTS(id < layers_.size(), "error_feedback: unknown layer id ", id, " of ", layers_.size(),
                    " registered");
    error_memory& m = layers_[id];
    BELLOWS_EXPECTS(!m.enabled() || n == m.values().size(), "error_feedback: layer '", names_[id], "' has ",
                    m.values().size(), " elements, the buffer ", n);
    return m;
  }

  feedback kind_;
  cpu::executor* exec_;
  float lr_ = 0.0f;
  std::vector<error_memory> layers_;
  std::vector<std::string> names_;
};

static_assert(ErrorFeedback<error_feedback>, "error_feedback must model ErrorFeedback");

}  // namespace bellows
