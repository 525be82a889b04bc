// SPDX-License-Identifier: Apache-2.0
// QSGD on the device: qsgd<cuda::executor>, the compressor of compressors/qsgd.hpp with its
// state, payloads and arithmetic in device memory, exchanged through a DeviceCollective
// (collectives::nccl). Every rank's result, error memory and payload bytes are those of
// qsgd<cpu::executor> for the same inputs, bit for bit: the same payload format
// (detail::qsgd_format), the same Philox noise, and every sum and quotient rounded in the CPU's
// order.
//
// One step, all on the executor's stream (the collective's too):
//   m = g + e (with a memory) -> quantize into this rank's slot -> header, padding
//   -> allgather of the slots -> validation of every payload on the device (one verdict per rank)
//   -> the verdicts copied back: the one wait of the step, since reduce returns the status
//   -> when every payload is good and finite: the average of the decoded payloads into g, and
//      e = m - (this rank's decoded payload), in one kernel, enqueued and not waited for.
// A malformed payload raises wire_error with the message the CPU's validation gives for it
// (cuda::payload_slots copies it back for detail::qsgd_format::check), naming the rank.
//
// PayloadCodec on device memory, for a trainer that carries the payloads itself: encode
// quantizes its input as it is into the caller's device storage, the CPU's bytes, with the same
// kernels as a step; validate runs the step's validation kernel over the one payload; decode_add
// adds the decoded payload with cuda::unpack_dequantize, the CPU's sums.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "bellows/compressors/detail/device_payload.cuh"
#include "bellows/compressors/detail/qsgd_format.hpp"
#include "bellows/compressors/qsgd.hpp"
#include "bellows/concepts.hpp"
#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/cuda/buffer.cuh"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/transfer.cuh"
#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/launch.cuh"
#include "bellows/compressors/detail/device_state.cuh"
#include "bellows/cuda/payload_slots.cuh"
#include "bellows/cuda/quantize.cuh"
#include "bellows/cuda/scaled_payload.cuh"

namespace bellows {

template <>
class qsgd<cuda::executor> {
public:
  /// One layer: step counter, error memory and workspace, all but the counter in device memory.
  /// The payload slots are sized by the first step (they depend on the ranks).
  struct state {
    layer_info layer;
    std::uint64_t step = 0;
    cuda::device_buffer<float> memory;       ///< e, zero at first (empty without a memory)
    cuda::device_buffer<float> compensated;  ///< m = g + e (empty without a memory)
    cuda::payload_slots slots;               ///< every rank's payload of the step, and the verdicts
  };

  explicit qsgd(const qsgd_params& params = {}, cuda::executor& exec = cuda::executor::shared())
      : format_(params), exec_(&exec) {}

  [[nodiscard]] const qsgd_params& params() const noexcept { return format_.params(); }
  [[nodiscard]] bellows::aggregation aggregation() const noexcept { return bellows::aggregation::allgather; }

  /// Validates the layer and sizes its state; reserves the executor's workspace for the words of
  /// a PayloadCodec call (a non-finite flag and a verdict).
  [[nodiscard]] state make_state(const layer_info& layer) const {
    detail::qsgd_format::check_layer(layer);
    exec_->reserve(cuda::payload_words::bytes());
    state st;
    st.layer = layer;
    st.memory = detail::zero_memory(params().feedback, layer.size(), *exec_);
    st.compensated = cuda::device_buffer<float>(st.memory.size());
    return st;
  }

  /// One step (a collective call; see the file's comment). `inout` is device memory; the
  /// collective enqueues on the executor's stream. Waits for that stream once, for the verdicts;
  /// the average and the memory's update are still running when it returns.
  template <DeviceCollective Coll>
  reduce_result reduce(state& st, std::span<float> inout, Coll& coll) {
    detail::check_step("qsgd", st.layer, inout.size(), coll.stream(), *exec_);
    detail::check_memory("qsgd", st.layer, st.memory, params().feedback);
    const std::size_t n = st.layer.size(), ranks = coll.size(), rank = coll.rank();
    const code_layout l = format_.layout(n);
    const std::size_t bytes = format_.payload_bytes(n), codes_at = format_.codes_offset(n);
    const cudaStream_t stream = exec_->stream();
    cuda::payload_slots& slots = st.slots;
    slots.prepare(ranks, bytes, stream);

    std::span<const float> m = inout;
    if (!st.memory.span().empty()) {
      add(*exec_, st.compensated.span(), inout, st.memory.span());
      m = st.compensated.span();
    }
    std::byte* mine = slots.of(rank);
    quantize_pack(*exec_, m, l, params().norm, format_.stream(st.step, st.layer, rank),
                  {reinterpret_cast<float*>(mine + wire::header_bytes), l.buckets()},
                  {reinterpret_cast<std::uint8_t*>(mine + codes_at), l.code_bytes()}, slots.non_finite());
    cuda::detail::launch(&cuda::detail::finish_payload_kernel, 1, 1, stream, mine, format_.header(n),
                         slots.non_finite(), codes_at + l.code_bytes(), bytes);
    coll.allgather_slots(std::span<const std::byte>(mine, bytes), slots.all(), slots.slot());

    const std::size_t items = ranks * (l.buckets() + 1);
    const unsigned blocks = std::min(cuda::blocks_for(items, 256), 4096u);
    cuda::detail::launch(&cuda::detail::check_payloads_kernel, blocks, 256u, stream, slots.all().data(), slots.slot(),
                         ranks, format_.header(n), codes_at, l.code_bytes(), static_cast<unsigned>(n * l.bits % 8),
                         slots.verdicts());
    slots.read_verdicts(*exec_);

    const traffic sent = format_.sent(n);
    if ((slots.worst() & cuda::payload_malformed) != 0)
      slots.report_malformed(*exec_, "qsgd", st.layer,
                             [&](std::span<const std::byte> payload) { (void)format_.check(st.layer, payload); });
    if (slots.worst() != 0) return {step_status::non_finite, sent};
    if (n != 0) {
      const auto run = [&]<unsigned Bits>(cuda::detail::code_decoder<Bits> decode) {
        cuda::detail::launch(&cuda::detail::average_payloads_kernel<cuda::detail::code_decoder<Bits>>,
                             cuda::detail::stride_blocks(n), cuda::detail::elementwise_threads, stream,
                             slots.all().data(), slots.slot(), ranks, rank, n, decode, codes_at, inout.data(), m.data(),
                             st.memory.data());
      };
      switch (l.bits) {
        case 2: run(cuda::detail::code_decoder<2>{l.bucket}); break;
        case 4: run(cuda::detail::code_decoder<4>{l.bucket}); break;
        default: run(cuda::detail::code_decoder<8>{l.bucket}); break;
      }
    }
    ++st.step;
    return {step_status::ok, sent};
  }

  // PayloadCodec on device memory: the CPU compressor's members, with `in`, `out`, the payload
  // and `acc` in device memory, enqueued on the executor's stream.

  /// The bytes of every payload of the layer, as on the CPU.
  [[nodiscard]] std::size_t max_payload_bytes(const state& st) const { return format_.payload_bytes(st.layer.size()); }

  /// This rank's payload for `in` as it is (m = g + e when the caller keeps a memory), with the
  /// noise of {seed, state.step, layer id, rank}, written into `out` (max_payload_bytes from a
  /// multiple of 8): the CPU's bytes. The step counter is not advanced. Enqueued, not waited for
  /// (every payload of a layer has one size). Raises bellows::error when `in` or `out` does not fit.
  [[nodiscard]] std::span<std::byte> encode(const state& st, std::span<const float> in, std::span<std::byte> out,
                                            std::size_t rank = 0) const {
    const std::size_t n = st.layer.size();
    detail::qsgd_format::check_size(st.layer, in.size());
    const std::size_t bytes = format_.payload_bytes(n), codes_at = format_.codes_offset(n);
    detail::check_payload_storage("qsgd", st.layer, out, bytes);
    const code_layout l = format_.layout(n);
    const cuda::payload_words words(exec_->workspace());
    BELLOWS_CUDA_CHECK(cudaMemsetAsync(words.non_finite, 0, sizeof(unsigned), exec_->stream()));
    quantize_pack(*exec_, in, l, params().norm, format_.stream(st.step, st.layer, rank),
                  {reinterpret_cast<float*>(out.data() + wire::header_bytes), l.buckets()},
                  {reinterpret_cast<std::uint8_t*>(out.data() + codes_at), l.code_bytes()}, words.non_finite);
    cuda::detail::launch(&cuda::detail::finish_payload_kernel, 1, 1, exec_->stream(), out.data(), format_.header(n),
                         words.non_finite, codes_at + l.code_bytes(), bytes);
    return out.first(bytes);
  }

  /// The CPU's validate of a payload in device memory: raises bellows::wire_error with the CPU's
  /// message for a malformed payload, returns non_finite for a flagged one. Waits for the
  /// executor's stream once, to return the status (twice on the way to a wire_error).
  [[nodiscard]] step_status validate(const state& st, std::span<const std::byte> payload) const {
    const std::size_t n = st.layer.size();
    const code_layout l = format_.layout(n);
    const std::size_t bytes = format_.payload_bytes(n);
    return detail::validate_device_payload(
        "qsgd", st.layer, *exec_, payload, bytes, bytes,
        [&](const cuda::payload_words& words) {
          const unsigned blocks = std::min(cuda::blocks_for(l.buckets() + 1, 256), 4096u);
          cuda::detail::launch(&cuda::detail::check_payloads_kernel, blocks, 256u, exec_->stream(), payload.data(),
                               bytes, std::size_t{1}, format_.header(n), format_.codes_offset(n), l.code_bytes(),
                               static_cast<unsigned>(n * l.bits % 8), words.verdicts);
        },
        [&](std::span<const std::byte> host) {
          const wire::reader r = format_.check(st.layer, host);
          return (r.head().flags & wire::flag::non_finite) ? step_status::non_finite : step_status::ok;
        });
  }

  /// The CPU's decode_add on device memory: validates as validate does (waiting for the stream
  /// once), and when the payload is good and finite adds its decoded values to `acc` (n floats),
  /// the CPU's sums; that is enqueued, not waited for. `acc` is untouched on error or non_finite.
  /// Raises bellows::error when `acc` does not fit the layer.
  [[nodiscard]] step_status decode_add(const state& st, std::span<const std::byte> payload,
                                       std::span<float> acc) const {
    detail::qsgd_format::check_size(st.layer, acc.size());
    const step_status s = validate(st, payload);
    if (s != step_status::ok) return s;
    const std::size_t n = st.layer.size();
    const code_layout l = format_.layout(n);
    unpack_dequantize(*exec_, {reinterpret_cast<const float*>(payload.data() + wire::header_bytes), l.buckets()},
                      {reinterpret_cast<const std::uint8_t*>(payload.data() + format_.codes_offset(n)), l.code_bytes()},
                      l, acc, true);
    return s;
  }

  /// The CPU compressor's checkpoint record (step counter, then the error memory): either
  /// backend reads what the other wrote. Both wait for the executor's stream.
  void save(const state& st, checkpoint_writer& out) const {
    detail::save_step_record(*exec_, st.step, st.memory, out);
  }
  /// When the trainer's learning rate changes from lr_old to lr_new: a feedback::scaled memory
  /// is multiplied by lr_old / lr_new, as state.memory.rescale(exec, lr_old, lr_new) does on the
  /// CPU (enqueued); other memories are left alone.
  void rescale(state& st, float lr_old, float lr_new) const {
    detail::rescale_memory("qsgd", *exec_, st.memory, params().feedback, lr_old, lr_new);
  }

  /// Reads what save wrote for the same layer and configuration; checks before it changes anything.
  void load(state& st, checkpoint_reader& in) const {
    detail::load_step_record(*exec_, st.step, st.memory, in, "qsgd step", "qsgd error memory");
  }

private:
  detail::qsgd_format format_;
  cuda::executor* exec_;
};

static_assert(Compressor<qsgd<cuda::executor>, archetypes::device_collective>,
              "qsgd<cuda::executor> must model Compressor over a DeviceCollective");
static_assert(PayloadCodec<qsgd<cuda::executor>>, "qsgd<cuda::executor> must model PayloadCodec (device memory)");

}  // namespace bellows
