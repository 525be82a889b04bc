// SPDX-License-Identifier: Apache-2.0
// What the device top-k and rand-k (compressors/topk.cuh, compressors/randk.cuh) share around
// their selection: a layer's step counter and error memory with its staged successor, the checks
// before a step, the commit once every rank was finite, the checkpoint record of the CPU's
// sparse compressors (compressors/detail/step_record.hpp), and the PayloadCodec members on
// device memory but for the selection of encode: max_payload_bytes, validate and decode_add.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "bellows/compressors/detail/sparse_codec.hpp"
#include "bellows/compressors/detail/step_checks.hpp"
#include "bellows/compressors/detail/step_record.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/cuda/buffer.cuh"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/float_array.cuh"
#include "bellows/feedback/error_feedback.hpp"
#include "bellows/cuda/launch.cuh"
#include "bellows/cuda/payload_slots.cuh"
#include "bellows/cuda/sparse.cuh"
#include "bellows/plan/sparse.hpp"

namespace bellows::detail {

/// The part of a device sparse state that lives from step to step.
struct device_sparse_state {
  layer_info layer;
  std::uint64_t step = 0;
  layer_memory<cuda::executor> memory;  ///< e, zero at first (no values without a memory)
  layer_memory<cuda::executor> staged;  ///< the next e, current once every rank was finite
};

/// Where the k entries of a sparse payload with 32-bit indices lie: the indices right after the
/// header, then the values.
[[nodiscard]] inline sparse_arrays<std::uint32_t> sparse_entries_at(std::byte* payload, std::size_t k) noexcept {
  return {{reinterpret_cast<std::uint32_t*>(payload + wire::header_bytes), k},
          {reinterpret_cast<float*>(payload + wire::header_bytes + 4 * k), k}};
}

/// What a selection into a payload reports in device memory: its non-finite flag, and its count
/// when that varies (null: the least count, which is then the only one).
struct device_selection {
  const unsigned* non_finite = nullptr;
  const std::uint32_t* count = nullptr;
};

/// Derived (CRTP) provides `name`, `codec` (its wire::codec) and counts(layer) -> {least, most}
/// entries of its payloads, and its Params provide ratio, k and feedback.
template <class Derived, class Params>
class device_sparse_codec {
public:
  [[nodiscard]] const Params& params() const noexcept { return params_; }

  // PayloadCodec on device memory (Derived adds encode): the CPU compressor's members, with the
  // payload and the accumulator in device memory, enqueued on the executor's stream.

  /// The bytes of a payload of the most entries for the layer, as on the CPU.
  [[nodiscard]] std::size_t max_payload_bytes(const device_sparse_state& st) const {
    return sparse_payload_bytes(st.layer.size(), derived().counts(st.layer).second);
  }

  /// The CPU's validate of a payload in device memory: raises bellows::wire_error with the CPU's
  /// message for a malformed payload, returns non_finite for a flagged one. Waits for the
  /// executor's stream once, to return the status (twice on the way to a wire_error): see
  /// detail::validate_device_payload. A payload's count is read from its size.
  [[nodiscard]] step_status validate(const device_sparse_state& st, std::span<const std::byte> payload) const {
    const auto [least, most] = derived().counts(st.layer);
    const std::size_t n = st.layer.size(), count = count_of(payload.size(), least, most);
    const wire::header want = sparse_header(n, count);
    return cuda::validate_device_payload(
        Derived::name, st.layer, *exec_, payload, sparse_payload_bytes(n, count), wire::header_bytes,
        [&](const cuda::payload_words& words) {
          const unsigned blocks = std::min(cuda::blocks_for(count + 1, 256), 4096u);
          cuda::detail::launch(&cuda::detail::check_sparse_payloads_kernel, blocks, 256u, exec_->stream(),
                               payload.data(), payload.size(), std::size_t{1}, want, count, count, words.verdicts,
                               words.count);
        },
        [&](std::span<const std::byte> bytes) {
          return read_sparse(bytes, Derived::codec, st.layer, least, most).status;
        });
  }

  /// The CPU's decode_add on device memory: validates as validate does (waiting for the stream
  /// once), and when the payload is good and finite adds its entries to `acc` (n floats), the
  /// CPU's sums; that is enqueued, not waited for. `acc` is untouched on error or non_finite.
  /// Raises bellows::error when `acc` does not fit the layer.
  [[nodiscard]] step_status decode_add(const device_sparse_state& st, std::span<const std::byte> payload,
                                       std::span<float> acc) const {
    check_buffer(Derived::name, st.layer, acc.size());
    const step_status s = validate(st, payload);
    if (s != step_status::ok) return s;
    const auto [least, most] = derived().counts(st.layer);
    const std::size_t k = count_of(payload.size(), least, most);  // validated: the payload has k entries
    const std::byte* entries = payload.data() + wire::header_bytes;
    cuda::scatter_add(*exec_, acc, {reinterpret_cast<const std::uint32_t*>(entries), k},
                      {reinterpret_cast<const float*>(entries + 4 * k), k});
    return s;
  }

  /// The CPU compressor's checkpoint record (step counter, then the error memory): either
  /// backend reads what the other wrote. Both wait for the executor's stream.
  void save(const device_sparse_state& st, checkpoint_writer& out) const {
    save_step_record(*exec_, st.step, st.memory, out);
  }
  /// When the trainer's learning rate changes from lr_old to lr_new: a feedback::scaled memory
  /// is multiplied by lr_old / lr_new, as on the CPU (enqueued); other memories are left alone.
  void rescale(device_sparse_state& st, float lr_old, float lr_new) const {
    st.memory.rescale(*exec_, lr_old, lr_new, Derived::name);
  }

  /// Reads what save wrote for the same layer and configuration; checks before it changes anything.
  void load(device_sparse_state& st, checkpoint_reader& in) const {
    load_step_record(*exec_, st.step, st.memory, in, Derived::name, Derived::name);
  }

protected:
  device_sparse_codec(const Params& params, cuda::executor& exec) : params_(params), exec_(&exec) {}

  /// k for the layer.
  [[nodiscard]] std::size_t kept(const layer_info& layer) const noexcept {
    return kept_count(layer, params_.ratio, params_.k);
  }

  /// A fresh state's layer and zero memory (enqueued on the executor's stream).
  void start(device_sparse_state& st, const layer_info& layer) const {
    st.layer = layer;
    st.memory = layer_memory<cuda::executor>(*exec_, params_.feedback, layer.size());
    st.staged = layer_memory<cuda::executor>(*exec_, params_.feedback, layer.size());
  }

  /// The checks before a step enqueues anything: the buffer fits the layer, the collective's
  /// stream is the executor's and the memory fits the feedback. A state made by a compressor
  /// that keeps another number of elements (the other level of a Synchronizer) is then resized
  /// by the caller, as the CPU's fit() does.
  template <class Coll>
  void check(const device_sparse_state& st, std::size_t inout_size, Coll& coll) const {
    check_buffer(Derived::name, st.layer, inout_size);
    check_stream(Derived::name, st.layer, coll, *exec_);
    st.memory.check_kind(Derived::name, st.layer.name, params_.feedback);
  }

  /// The header write_sparse writes for k entries of a layer of n elements (below 2^32).
  [[nodiscard]] static wire::header sparse_header(std::size_t n, std::size_t k) {
    wire::header h{};
    h.codec = Derived::codec.id;
    h.n = n;
    h.count = k;
    h.body_bytes = sparse_payload_bytes(n, k) - wire::header_bytes;
    return h;
  }

  /// The checks before an encode enqueues anything: `in` fits the layer, the state keeps `k`
  /// elements as this compressor does, and `out` holds max_payload_bytes from a multiple of 8.
  void check_encode(const device_sparse_state& st, std::size_t in_size, std::span<const std::byte> out,
                    std::size_t k) const {
    check_buffer(Derived::name, st.layer, in_size);
    BELLOWS_EXPECTS(k == kept(st.layer), Derived::name, ": layer '", st.layer.name, "': the state keeps ", k,
                    " elements, this compressor another number (make the state with it)");
    wire::check_storage(Derived::name, st.layer.name, out, max_payload_bytes(st));
  }

  /// The end of an encode whose kernels wrote k entries (or *selected.count) after the header of
  /// `out` and set *selected.non_finite for non-finite input: writes the header (that of the
  /// empty payload flagged non-finite, when it is set), copies the flag and the count back and
  /// waits for the stream, and returns the payload: its header alone when flagged, as on the CPU.
  std::span<std::byte> finish_encode(const device_sparse_state& st, std::span<std::byte> out, std::size_t k,
                                     device_selection selected) const {
    const cudaStream_t stream = exec_->stream();
    cuda::detail::launch(&cuda::detail::finish_sparse_payload_kernel, 1u, 1u, stream, out.data(),
                         sparse_header(st.layer.size(), k), selected.non_finite, selected.count);
    unsigned flagged = 0;
    std::uint32_t count = static_cast<std::uint32_t>(k);
    BELLOWS_CUDA_CHECK(cudaMemcpyAsync(&flagged, selected.non_finite, sizeof flagged, cudaMemcpyDeviceToHost, stream));
    if (selected.count != nullptr)
      BELLOWS_CUDA_CHECK(cudaMemcpyAsync(&count, selected.count, sizeof count, cudaMemcpyDeviceToHost, stream));
    exec_->synchronize();
    return out.first(flagged != 0 ? wire::header_bytes : sparse_payload_bytes(st.layer.size(), count));
  }

  /// A step averaged by allgather, as the CPU's sparse codecs average one: `write(entries)`
  /// enqueues what puts this rank's entries (room for the most) into its slot (and the next
  /// memory aside) and returns its device_selection; then the header (flagged and empty for
  /// non-finite input), one allgather_slots of whole slots, the validation of every rank's
  /// payload on the device, the verdicts and counts copied back (the one wait; a malformed
  /// payload raises the CPU validation's wire_error naming the rank), and when all are good and
  /// finite: `inout` zeroed, every rank's entries added in rank order, the sums divided by W. The
  /// traffic is this rank's payload, as on the CPU. The caller commits an ok step.
  template <class Coll, class Write>
  reduce_result average_by_allgather(cuda::payload_slots& slots, const device_sparse_state& st, std::span<float> inout,
                                     Coll& coll, Write&& write) const {
    const std::size_t n = st.layer.size(), ranks = coll.size(), rank = coll.rank();
    const auto [least, most] = derived().counts(st.layer);
    const std::size_t bytes = sparse_payload_bytes(n, most);
    const cudaStream_t stream = exec_->stream();
    slots.prepare(*exec_, ranks, bytes);
    const wire::header h = sparse_header(n, least);
    std::byte* mine = slots.of(rank);
    const device_selection selected = write(sparse_entries_at(mine, most));
    cuda::detail::launch(&cuda::detail::finish_sparse_payload_kernel, 1u, 1u, stream, mine, h, selected.non_finite,
                         selected.count);
    slots.gather(coll, rank);
    const unsigned blocks = std::min(cuda::blocks_for(ranks * (most + 1), 256), 4096u);
    cuda::detail::launch(&cuda::detail::check_sparse_payloads_kernel, blocks, 256u, stream, slots.all().data(),
                         slots.slot(), ranks, h, least, most, slots.verdicts(), slots.counts());
    slots.read_verdicts(*exec_);

    if ((slots.worst() & cuda::payload_malformed) != 0)
      slots.report_malformed(*exec_, Derived::name, st.layer, [&](std::span<const std::byte> payload) {
        (void)read_sparse(payload, Derived::codec, st.layer, least, most);
      });
    const bool mine_finite = (slots.verdict(rank) & cuda::payload_non_finite) == 0;
    const std::size_t kept = slots.count(rank);
    const reduce_result r{slots.worst() != 0 ? step_status::non_finite : step_status::ok,
                          mine_finite ? traffic{sparse_payload_bytes(n, kept), kept, kept}
                                      : traffic{wire::header_bytes, 0, 0}};
    if (r.status != step_status::ok) return r;
    fill(*exec_, inout, 0.0f);
    for (std::size_t q = 0; q < ranks; ++q) {
      const sparse_arrays<std::uint32_t> e = sparse_entries_at(slots.of(q), slots.count(q));
      scatter_add(*exec_, inout, std::span<const std::uint32_t>(e.index), std::span<const float>(e.value));
    }
    if (ranks != 1) divide(*exec_, inout, static_cast<float>(ranks));
    return r;
  }

  /// After a step every rank found finite: the staged memory becomes current.
  static void commit(device_sparse_state& st) noexcept {
    std::swap(st.memory, st.staged);
    ++st.step;
  }

  Params params_;
  cuda::executor* exec_;

private:
  [[nodiscard]] const Derived& derived() const noexcept { return static_cast<const Derived&>(*this); }

  /// The count a payload of `bytes` carries (32-bit indices), kept within [least, most]: a
  /// payload of another size then fails validation by its size.
  [[nodiscard]] static std::size_t count_of(std::size_t bytes, std::size_t least, std::size_t most) noexcept {
    const std::size_t entries =
        bytes > wire::header_bytes ? (bytes - wire::header_bytes) / cuda::detail::sparse_body_bytes(1) : 0;
    return std::clamp(entries, least, most);
  }
};

}  // namespace bellows::detail
