// SPDX-License-Identifier: Apache-2.0
// What the device top-k and rand-k (compressors/topk.cuh, compressors/randk.cuh) share around
// their selection: a layer's step counter and error memory with its staged successor, the checks
// before a step, the commit once every rank was finite, and the checkpoint record of the CPU's
// sparse compressors (compressors/detail/step_record.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "bellows/compressors/detail/device_state.cuh"
#include "bellows/compressors/detail/sparse_codec.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/cuda/buffer.cuh"
#include "bellows/cuda/executor.cuh"

namespace bellows::detail {

/// The part of a device sparse state that lives from step to step.
struct device_sparse_state {
  layer_info layer;
  std::uint64_t step = 0;
  cuda::device_buffer<float> memory;  ///< e, zero at first (empty without a memory)
  cuda::device_buffer<float> staged;  ///< the next e, current once every rank was finite
};

/// Derived (CRTP) provides `name` and its Params provide ratio, k and feedback.
template <class Derived, class Params>
class device_sparse_codec {
public:
  [[nodiscard]] const Params& params() const noexcept { return params_; }

  /// The CPU compressor's checkpoint record (step counter, then the error memory): either
  /// backend reads what the other wrote. Both wait for the executor's stream.
  void save(const device_sparse_state& st, checkpoint_writer& out) const {
    save_step_record(*exec_, st.step, st.memory, out);
  }
  /// Reads what save wrote for the same layer and configuration; checks before it changes anything.
  void load(device_sparse_state& st, checkpoint_reader& in) const {
    load_step_record(*exec_, st.step, st.memory, in, Derived::name, Derived::name);
  }

protected:
  device_sparse_codec(const Params& params, cuda::executor& exec) : params_(params), exec_(&exec) {}

  /// k for the layer, validating the parameters for it (raising bellows::error naming both).
  [[nodiscard]] std::size_t kept(const layer_info& layer) const {
    return kept_count(Derived::name, layer, params_.ratio, params_.k);
  }

  /// A fresh state's layer and zero memory (enqueued on the executor's stream).
  void start(device_sparse_state& st, const layer_info& layer) const {
    st.layer = layer;
    st.memory = zero_memory(params_.feedback, layer.size(), *exec_);
    st.staged = cuda::device_buffer<float>(st.memory.size());
  }

  /// The checks before a step enqueues anything: the buffer fits the layer, the collective's
  /// stream is the executor's and the memory fits the feedback. A state made by a compressor
  /// that keeps another number of elements (the other level of a Synchronizer) is then resized
  /// by the caller, as the CPU's fit() does.
  void check(const device_sparse_state& st, std::size_t inout_size, cudaStream_t stream) const {
    check_step(Derived::name, st.layer, inout_size, stream, *exec_);
    check_memory(Derived::name, st.layer, st.memory, params_.feedback);
  }

  /// After a step every rank found finite: the staged memory becomes current.
  static void commit(device_sparse_state& st) noexcept {
    std::swap(st.memory, st.staged);
    ++st.step;
  }

  Params params_;
  cuda::executor* exec_;
};

}  // namespace bellows::detail
