// SPDX-License-Identifier: Apache-2.0
// fmnist_demo --backend cuda (device.hpp): the device Synchronizer behind the members the training
// loop uses.
#include <cuda_runtime.h>

#include <bellows/collectives/staged.cuh>
#include <bellows/compressors/powersgd.cuh>
#include <bellows/compressors/topk.cuh>
#include <bellows/cuda/buffer.cuh>
#include <bellows/cuda/check.cuh>
#include <bellows/cuda/executor.cuh>
#include <bellows/regime/accordion.cuh>
#include <bellows/regime/static_policy.hpp>
#include <bellows/sync/synchronizer.cuh>

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fmnist/device.hpp"

namespace fmnist {

struct device_averaging::impl {
  virtual ~impl() = default;
  virtual void set_level_change(bellows::level_change c) = 0;
  virtual std::uint32_t add_layer(std::string name, bellows::shape shape) = 0;
  virtual std::span<const bellows::step_status> step(std::span<const std::span<float>> grads,
                                                     bellows::collectives::local& comm) = 0;
  virtual std::span<const bellows::regime> end_epoch(float lr, bellows::collectives::local& comm) = 0;
  [[nodiscard]] virtual std::span<const bellows::layer_telemetry> telemetry() const = 0;
  [[nodiscard]] virtual bellows::traffic total_sent() const = 0;
  [[nodiscard]] virtual std::vector<std::byte> checkpoint(bellows::rank_place at) const = 0;
  virtual void restore(std::span<const std::byte> bytes, bellows::rank_place at) = 0;
};

namespace {

/// A stream of this object's own, made first and destroyed last.
struct owned_stream {
  cudaStream_t stream = nullptr;
  owned_stream() { BELLOWS_CUDA_CHECK(cudaStreamCreate(&stream)); }
  owned_stream(const owned_stream&) = delete;
  owned_stream& operator=(const owned_stream&) = delete;
  ~owned_stream() { (void)cudaStreamDestroy(stream); }
};

template <template <class> class C, class Params, class D>
class on_device final : public device_averaging::impl {
public:
  using compressor = C<bellows::cuda::executor>;

  /// make_detector(executor) gives the detector, on the synchronizer's executor.
  template <class MakeDetector>
  on_device(const Params& low, const Params& high, MakeDetector make_detector)
      : exec_(stream_.stream), sync_(compressor(low, exec_), compressor(high, exec_), make_detector(exec_), exec_) {}

  void set_level_change(bellows::level_change c) override { sync_.set_level_change(c); }

  std::uint32_t add_layer(std::string name, bellows::shape shape) override {
    grads_.emplace_back(shape.size());
    spans_.push_back(grads_.back().span());
    return sync_.add_layer(std::move(name), shape);
  }

  std::span<const bellows::step_status> step(std::span<const std::span<float>> grads,
                                             bellows::collectives::local& comm) override {
    BELLOWS_EXPECTS(grads.size() == grads_.size(), "fmnist device averaging: ", grads.size(), " gradients for ",
                    grads_.size(), " layers");
    for (std::size_t id = 0; id < grads.size(); ++id)
      BELLOWS_CUDA_CHECK(cudaMemcpyAsync(grads_[id].data(), grads[id].data(), grads[id].size_bytes(),
                                         cudaMemcpyHostToDevice, stream_.stream));
    const std::span<const bellows::step_status> statuses = sync_.step(spans_, collective(comm));
    for (std::size_t id = 0; id < grads.size(); ++id)
      BELLOWS_CUDA_CHECK(cudaMemcpyAsync(grads[id].data(), grads_[id].data(), grads[id].size_bytes(),
                                         cudaMemcpyDeviceToHost, stream_.stream));
    exec_.synchronize();
    return statuses;
  }

  std::span<const bellows::regime> end_epoch(float lr, bellows::collectives::local& comm) override {
    return sync_.end_epoch(lr, collective(comm));
  }
  [[nodiscard]] std::span<const bellows::layer_telemetry> telemetry() const override { return sync_.telemetry(); }
  [[nodiscard]] bellows::traffic total_sent() const override { return sync_.total_sent(); }
  [[nodiscard]] std::vector<std::byte> checkpoint(bellows::rank_place at) const override {
    return sync_.checkpoint(at);
  }
  void restore(std::span<const std::byte> bytes, bellows::rank_place at) override { sync_.restore(bytes, at); }

private:
  /// The worker's collective, staged: made at the first exchange (a worker keeps its collective).
  bellows::collectives::staged<bellows::collectives::local>& collective(bellows::collectives::local& comm) {
    if (!staged_) staged_.emplace(comm, stream_.stream);
    return *staged_;
  }

  owned_stream stream_;
  bellows::cuda::executor exec_;
  bellows::synchronizer<compressor, D, bellows::cuda::executor> sync_;
  std::vector<bellows::cuda::device_buffer<float>> grads_;
  std::vector<std::span<float>> spans_;
  std::optional<bellows::collectives::staged<bellows::collectives::local>> staged_;
};

template <template <class> class C, class Params>
std::unique_ptr<device_averaging::impl> make(const Params& low, const Params& high, const device_spec& spec) {
  using accordion = bellows::basic_accordion<bellows::cuda::executor>;
  if (spec.accordion)
    return std::make_unique<on_device<C, Params, accordion>>(
        low, high, [&](bellows::cuda::executor& exec) { return accordion(*spec.accordion, exec); });
  return std::make_unique<on_device<C, Params, bellows::static_policy>>(
      low, high, [&](bellows::cuda::executor&) { return bellows::static_policy(spec.fixed); });
}

}  // namespace

device_averaging::device_averaging(const device_spec& spec)
    : impl_(spec.powersgd ? make<bellows::powersgd>(spec.powersgd_low, spec.powersgd_high, spec)
                          : make<bellows::topk>(spec.topk_low, spec.topk_high, spec)) {}
device_averaging::device_averaging(device_averaging&&) noexcept = default;
device_averaging& device_averaging::operator=(device_averaging&&) noexcept = default;
device_averaging::~device_averaging() = default;

void device_averaging::set_level_change(bellows::level_change c) { impl_->set_level_change(c); }
std::uint32_t device_averaging::add_layer(std::string name, bellows::shape shape) {
  return impl_->add_layer(std::move(name), shape);
}
std::span<const bellows::step_status> device_averaging::step(std::span<const std::span<float>> grads,
                                                             bellows::collectives::local& comm) {
  return impl_->step(grads, comm);
}
std::span<const bellows::regime> device_averaging::end_epoch(float lr, bellows::collectives::local& comm) {
  return impl_->end_epoch(lr, comm);
}
std::span<const bellows::layer_telemetry> device_averaging::telemetry() const { return impl_->telemetry(); }
bellows::traffic device_averaging::total_sent() const { return impl_->total_sent(); }
std::vector<std::byte> device_averaging::checkpoint(bellows::rank_place at) const { return impl_->checkpoint(at); }
void device_averaging::restore(std::span<const std::byte> bytes, bellows::rank_place at) { impl_->restore(bytes, at); }

bool device_present() { return bellows::cuda::device_count() > 0; }

}  // namespace fmnist
