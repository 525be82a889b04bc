// SPDX-License-Identifier: Apache-2.0
// fmnist_demo --backend cuda: a worker's averaging through the device Synchronizer. The worker's
// gradients are copied to the GPU before each step and the averages back after it; the
// synchronizer (synchronizer<C<cuda::executor>, D, cuda::executor>) runs there over the demo's
// local collective, staged through the host (collectives::staged), so a run averages as the CPU
// run does: top-k bit for bit, PowerSGD within the rounding of its products (which sum in another
// order on the device). Its definition is device.cu, built (with FMNIST_CUDA defined) when CUDA is
// on. Every worker thread uses the current device of its thread (device 0 unless it sets another).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <bellows/collectives/local.hpp>
#include <bellows/compressors/powersgd_types.hpp>
#include <bellows/compressors/topk_types.hpp>
#include <bellows/core/shape.hpp>
#include <bellows/core/traffic.hpp>
#include <bellows/regime/accordion_types.hpp>
#include <bellows/sync/synchronizer.hpp>

namespace fmnist {

/// What a device run averages with: one compressor family at two levels, and the policy.
struct device_spec {
  bool powersgd = false;  ///< else top-k
  bellows::powersgd_params powersgd_low{}, powersgd_high{};
  bellows::topk_params topk_low{}, topk_high{};
  std::optional<bellows::accordion_params> accordion;  ///< else a static policy at `fixed`
  bellows::regime fixed = bellows::regime::critical;
};

/// The members of bellows::synchronizer that the training loop and the recorder use, with the
/// synchronizer itself on the device. Movable, not copyable.
class device_averaging {
public:
  explicit device_averaging(const device_spec& spec);
  device_averaging(device_averaging&&) noexcept;
  device_averaging& operator=(device_averaging&&) noexcept;
  ~device_averaging();

  void set_level_change(bellows::level_change c);
  std::uint32_t add_layer(std::string name, bellows::shape shape);
  /// Copies `grads` to the device, steps, copies the averages back (waits for them).
  std::span<const bellows::step_status> step(std::span<const std::span<float>> grads,
                                             bellows::collectives::local& comm);
  std::span<const bellows::regime> end_epoch(float lr, bellows::collectives::local& comm);
  [[nodiscard]] std::span<const bellows::layer_telemetry> telemetry() const;
  [[nodiscard]] bellows::traffic total_sent() const;
  [[nodiscard]] std::vector<std::byte> checkpoint(bellows::rank_place at) const;
  void restore(std::span<const std::byte> bytes, bellows::rank_place at);

  struct impl;  ///< device.cu

private:
  std::unique_ptr<impl> impl_;
};

/// True when a CUDA device is present.
[[nodiscard]] bool device_present();

}  // namespace fmnist
