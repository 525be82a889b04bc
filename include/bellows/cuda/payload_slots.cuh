// SPDX-License-Identifier: Apache-2.0
// The device's payload slots (plan/payload_slots.hpp): where the compressors that average by
// allgather (QSGD, EF-signSGD, top-k, rand-k per rank) keep the payloads of a step: one slot per
// rank, exchanged in place by a DeviceCollective's allgather_slots, and the
// words their kernels report in: this rank's non-finite flag, then one verdict per rank on its
// payload and the worst of them, then (for payloads of a variable count) each rank's count, then
// the gate the averaging kernels read (0.0f when every payload is good and finite). The checks
// copy the verdicts and counts into pinned host memory without a wait; they are read after the
// caller's next wait for the stream (a bucket's, a step's), so a step's layers share one wait.
// The same words for a call on one payload (a PayloadCodec's encode, validate or decode_add on
// device memory) come from the executor's workspace (payload_words), and a payload the device
// refuses is checked again on a host copy (with_host_copy, validate_device_payload), by the
// CPU's validation.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "bellows/core/error.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/cuda/buffer.cuh"
#include "bellows/cuda/check.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/float_array.cuh"
#include "bellows/plan/payload_slots.hpp"

namespace bellows::cuda {

/// Bits of a verdict, OR-ed by the validation kernels per rank and over all ranks.
inline constexpr unsigned payload_non_finite = 1u;  ///< the sender flagged its input non-finite
inline constexpr unsigned payload_malformed = 2u;   ///< the payload breaks the wire format or the layer

/// Calls f(bytes) on a host copy of the device bytes `payload`, made after the work enqueued on
/// the executor's stream (this waits for it), and returns what f returns. The copy starts at the
/// same address modulo 8 as `payload` does, so that the wire reader's alignment check sees on
/// the host what it would see on the device. It allocates: for the paths to a wire_error and for
/// header-only payloads, never for a step's hot path.
template <class F>
decltype(auto) with_host_copy(executor& exec, std::span<const std::byte> payload, F&& f) {
  const std::size_t shift = reinterpret_cast<std::uintptr_t>(payload.data()) % 8;
  std::vector<std::uint64_t> copy((shift + payload.size() + 7) / 8 + 1);
  std::byte* at = reinterpret_cast<std::byte*>(copy.data()) + shift;
  if (!payload.empty())
    BELLOWS_CUDA_CHECK(cudaMemcpyAsync(at, payload.data(), payload.size(), cudaMemcpyDeviceToHost, exec.stream()));
  exec.synchronize();
  return std::forward<F>(f)(std::span<const std::byte>(at, payload.size()));
}

/// The device words of a call on one payload, carved from the executor's workspace: a
/// non-finite flag for the encoding kernels, then the two verdict words (the payload's, the
/// worst) of a validation kernel run over it as the one slot of one rank, then its count.
struct payload_words {
  unsigned* non_finite = nullptr;
  unsigned* verdicts = nullptr;
  std::uint32_t* count = nullptr;
  std::size_t used = 0;

  payload_words() = default;
  explicit payload_words(arena a) {
    non_finite = a.take<unsigned>(4);
    verdicts = non_finite != nullptr ? non_finite + 1 : nullptr;
    count = non_finite != nullptr ? non_finite + 3 : nullptr;
    used = a.used();
  }

  /// Device bytes the words take (reserve them in the executor at make_state).
  [[nodiscard]] static std::size_t bytes() { return payload_words(arena()).used; }
};

class payload_slots {
public:
  static constexpr std::size_t alignment = 256;

  /// The words of a call on one payload, carved from the executor's workspace (reserve() them
  /// at make_state), the non-finite flag cleared on the executor's stream.
  struct words : payload_words {
    explicit words(executor& exec) : payload_words(exec.workspace()) {
      BELLOWS_CUDA_CHECK(cudaMemsetAsync(non_finite, 0, sizeof(unsigned), exec.stream()));
    }
    static void reserve(executor& exec) { exec.reserve(payload_words::bytes()); }
  };

  /// Makes room for `ranks` payloads of at most `bytes` each (allocating only the first time, or
  /// to grow) and zeroes the flag, the verdicts, the counts and the gate; enqueued on the
  /// executor's stream.
  void prepare(executor& exec, std::size_t ranks, std::size_t bytes) {
    const cudaStream_t stream = exec.stream();
    ranks_ = ranks;
    bytes_ = bytes;
    slot_ = (bytes + alignment - 1) / alignment * alignment;
    slots_.fit(ranks * slot_, stream);
    base_ = slots_.data();
    room_ = slot_;
    flags_.fit(2 * ranks + 3, stream);
    if (verdicts_.size() < 2 * ranks + 1) {
      exec.synchronize();  // a copy enqueued before may still fill the old ones
      verdicts_ = host_values<unsigned>(exec, 2 * ranks + 1);
    }
    BELLOWS_CUDA_CHECK(cudaMemsetAsync(flags_.data(), 0, (2 * ranks + 3) * sizeof(unsigned), stream));
  }

  /// The payloads a caller gathered (device memory), in place of the slots' own, after a
  /// prepare(exec, ranks, 0) that cleared the words: rank r's, of at most `bytes`, at base + r *
  /// stride (a multiple of 8 bytes).
  void view(std::byte* base, std::size_t stride, std::size_t ranks, std::size_t bytes) noexcept {
    base_ = base;
    slot_ = stride;
    ranks_ = ranks;
    bytes_ = room_ = bytes;
  }

  /// Rank r's payload storage: the `bytes` of prepare, at the start of its slot.
  [[nodiscard]] std::span<std::byte> mine(std::size_t r) const noexcept { return {of(r), bytes_}; }
  /// The step's allgather of rank r's payload into every slot, in place.
  template <class Coll>
  void gather(Coll& coll, std::size_t r) {
    coll.allgather_slots(std::span<const std::byte>(mine(r)), all(), slot_);
  }

  [[nodiscard]] std::size_t slot() const noexcept { return slot_; }
  [[nodiscard]] std::size_t ranks() const noexcept { return ranks_; }
  /// Every slot, in rank order (device memory).
  [[nodiscard]] std::span<std::byte> all() const noexcept { return {base_, ranks_ * slot_}; }
  /// The slot of rank r.
  [[nodiscard]] std::byte* of(std::size_t r) const noexcept { return base_ + r * slot_; }
  /// Set by this rank's kernels when its input is not finite.
  [[nodiscard]] unsigned* non_finite() const noexcept { return flags_.data(); }
  /// ranks() + 1 words for the validation kernels: rank r's verdict, then the worst.
  [[nodiscard]] unsigned* verdicts() const noexcept { return flags_.data() + 1; }
  /// ranks() words for the validation kernels of payloads of a variable count: rank r's count.
  [[nodiscard]] std::uint32_t* counts() const noexcept { return flags_.data() + ranks_ + 2; }

  /// The gate the averaging kernels read: 0.0f when every payload is good and finite, set to
  /// 1.0f by the validation kernels otherwise.
  [[nodiscard]] float* gate() const noexcept { return reinterpret_cast<float*>(flags_.data() + 2 * ranks_ + 2); }
  /// Whether the host may enqueue the average: always, since its kernels read gate() on the
  /// device (the CPU's slots answer from their checks).
  [[nodiscard]] static constexpr bool may_average() noexcept { return true; }

  /// After a validation kernel: enqueues the copy of the verdicts and the counts into pinned
  /// host memory, complete after the next wait for the executor's stream.
  void send_verdicts(executor& exec) {
    BELLOWS_CUDA_CHECK(cudaMemcpyAsync(&verdicts_[0], verdicts(), (2 * ranks_ + 1) * sizeof(unsigned),
                                       cudaMemcpyDeviceToHost, exec.stream()));
  }
  /// After send_verdicts and a wait for the stream: the worst verdict of all ranks.
  [[nodiscard]] unsigned worst() const noexcept { return verdicts_[ranks_]; }
  /// After send_verdicts and a wait: rank r's count, where a validation kernel wrote it.
  [[nodiscard]] std::size_t count(std::size_t r) const noexcept { return verdicts_[ranks_ + 1 + r]; }
  /// The count of rank r for kept(), after the next wait (the copy of the counts).
  void keep_count(std::size_t r) noexcept { kept_rank_ = r; }
  [[nodiscard]] std::size_t kept() const noexcept { return count(kept_rank_); }
  /// Rank r's count in device memory, where a validation kernel writes it.
  [[nodiscard]] const std::uint32_t* device_count(std::size_t r) const noexcept { return counts() + r; }

  /// After send_verdicts and a wait for the stream: the step's status, non_finite when any
  /// payload was flagged. A malformed one raises the wire_error `check(bytes)` (the CPU's
  /// validation) raises for it (report_malformed).
  template <class Check>
  [[nodiscard]] step_status status(executor& exec, std::string_view who, const layer_info& layer, Check&& check) const {
    if ((worst() & payload_malformed) != 0) report_malformed(exec, who, layer, std::forward<Check>(check));
    return worst() != 0 ? step_status::non_finite : step_status::ok;
  }

  /// After a wait found a malformed payload: copies the first one back and raises the
  /// wire_error that `check(bytes)` (the CPU's validation) raises for it, naming the layer and
  /// the rank. The bytes are as many as its header claims, within the slot (a caller's payload's
  /// room), as a transport that carries sizes would have delivered them. Should the CPU accept
  /// what the device refused, raises bellows::error, since that is a bug of bellows.
  template <class Check>
  [[noreturn]] void report_malformed(executor& exec, std::string_view who, const layer_info& layer,
                                     Check&& check) const {
    std::size_t r = 0;
    while ((verdicts_[r] & payload_malformed) == 0) ++r;
    // a slot starts at a multiple of 8 bytes: so does its copy, as the reader needs
    with_host_copy(exec, {of(r), room_}, [&](std::span<const std::byte> bytes) {
      wire::header h;
      std::memcpy(static_cast<void*>(&h), bytes.data(), sizeof h);
      const std::size_t claimed =
          wire::header_bytes + std::min<std::uint64_t>(h.body_bytes, room_ - wire::header_bytes);
      try {
        check(bytes.first(claimed));
      } catch (const wire_error& e) {
        bellows::fail<wire_error>(who, ": layer '", layer.name, "': the payload of rank ", r, ": ", e.what());
      }
    });
    bellows::fail<error>(who, ": layer '", layer.name, "': the device found the payload of rank ", r,
                         " malformed and the host's validation did not (a bug in bellows)");
  }

private:
  device_buffer<std::byte> slots_;
  std::byte* base_ = nullptr;  ///< rank 0's slot: slots_, or a caller's gathered payloads
  device_buffer<unsigned> flags_;
  host_values<unsigned> verdicts_;  // pinned: the copy of the verdicts and counts
  std::size_t ranks_ = 0, slot_ = 0, bytes_ = 0, room_ = 0, kept_rank_ = 0;
};

/// The status of one payload in device memory, as the CPU's validation gives it.
///  - `full`: the bytes of a payload with entries; `flagged`: those of one flagged non-finite.
///  - `launch(words)` enqueues the codec's validation kernel over the payload as the one slot
///    of one rank, OR-ing into words.verdicts[0] and [1] (zeroed here); it runs only when the
///    payload has `full` bytes and starts at a multiple of 8, so its reads stay inside it.
///  - `host(bytes)` is the CPU's validation of host bytes: returns its status or raises
///    bellows::wire_error.
/// The device's verdict is copied back: one wait for the executor's stream. A payload the kernel
/// finds malformed, or one of another size or alignment (a flagged top-k payload is its header
/// alone), is copied back and judged by `host` (a second wait, on that path only): it raises the
/// CPU's wire_error, or returns the CPU's status. Should the host and the device disagree, raises
/// bellows::error, since that is a bug of bellows.
template <class Launch, class Host>
[[nodiscard]] step_status validate_device_payload(std::string_view who, const layer_info& layer, executor& exec,
                                                  std::span<const std::byte> payload, std::size_t full,
                                                  std::size_t flagged, Launch&& launch, Host&& host) {
  const bool fits =
      payload.size() == full && reinterpret_cast<std::uintptr_t>(payload.data()) % wire::body_alignment == 0;
  unsigned verdict = 0;
  if (fits) {
    const payload_words words(exec.workspace());
    BELLOWS_CUDA_CHECK(cudaMemsetAsync(words.verdicts, 0, 2 * sizeof(unsigned), exec.stream()));
    launch(words);
    BELLOWS_CUDA_CHECK(
        cudaMemcpyAsync(&verdict, words.verdicts, sizeof(unsigned), cudaMemcpyDeviceToHost, exec.stream()));
    exec.synchronize();
    if (verdict == 0) return step_status::ok;
    if (verdict == payload_non_finite && full == flagged) return step_status::non_finite;
  }
  const step_status s = with_host_copy(exec, payload, std::forward<Host>(host));
  // the host accepted what the device refused, or a payload the device could not judge with
  // entries: a payload with entries has `full` bytes
  if (fits || s == step_status::ok)
    bellows::fail<error>(who, ": layer '", layer.name, "': the device and the host disagree on a payload of ",
                         payload.size(), " bytes (a bug in bellows)");
  return s;
}

}  // namespace bellows::cuda

namespace bellows {
template <class Parts>
struct payload_slots_of<cuda::executor, Parts> {
  using type = cuda::payload_slots;
};
}  // namespace bellows
