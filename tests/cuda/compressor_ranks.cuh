// SPDX-License-Identifier: Apache-2.0
// The device compressors' tests against the CPU's: the same compressor template run for some
// steps on every rank, once as C<cpu::executor> over the local collective and once as
// C<cuda::executor> over NCCL (one rank per device), with the same inputs; what each rank saw is
// recorded for comparison bit for bit.
#pragma once

#include <bellows/collectives/local.hpp>
#include <bellows/collectives/nccl.cuh>
#include <bellows/concepts.hpp>
#include <bellows/core/gather_buffer.hpp>
#include <bellows/core/shape.hpp>
#include <bellows/core/traffic.hpp>
#include <bellows/cpu/executor.hpp>
#include <bellows/cuda/buffer.cuh>
#include <bellows/cuda/executor.cuh>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "device_test.cuh"
#include "nccl_ranks.cuh"

namespace bellows::test {

/// What one rank saw: per step the status, the traffic and inout afterwards; then the error
/// memory and the step counter.
struct rank_trace {
  std::vector<step_status> status;
  std::vector<traffic> sent;
  std::vector<std::vector<float>> out;
  std::vector<float> memory;
  std::uint64_t step = 0;
};

/// The device error memory of a state, copied back.
inline std::vector<float> memory_of(const cuda::device_buffer<float>& memory) {
  std::vector<float> e(memory.size());
  BELLOWS_CUDA_CHECK(cudaDeviceSynchronize());
  if (!e.empty())
    BELLOWS_CUDA_CHECK(cudaMemcpy(e.data(), memory.data(), e.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return e;
}

/// `steps` steps of C<cpu::executor>(params) on `ranks` threads over the local collective; the
/// input of a step is input(step, rank).
template <template <class> class C, class Params, class Input>
std::vector<rank_trace> trace_on_cpu(const Params& params, const layer_info& layer, std::size_t ranks,
                                     std::size_t steps, Input input) {
  std::vector<rank_trace> traces(ranks);
  collectives::local_group group(ranks);
  group.run([&](collectives::local& comm) {
    cpu::executor exec(1);
    C<cpu::executor> c(params, exec);
    auto st = c.make_state(layer);
    rank_trace& t = traces[comm.rank()];
    for (std::size_t s = 0; s < steps; ++s) {
      std::vector<float> g = input(s, comm.rank());
      const reduce_result r = c.reduce(st, g, comm);
      t.status.push_back(r.status);
      t.sent.push_back(r.sent);
      t.out.push_back(g);
    }
    t.memory.assign(st.memory.values().begin(), st.memory.values().end());
    t.step = st.step;
  });
  return traces;
}

/// The same on the device: C<cuda::executor>(params) on every device, over NCCL.
template <template <class> class C, class Params, class Input>
std::vector<rank_trace> trace_on_device(const Params& params, const layer_info& layer, std::size_t steps,
                                        Input input) {
  std::vector<rank_trace> traces(static_cast<std::size_t>(cuda::device_count()));
  on_every_device([&](std::size_t rank, collectives::nccl& coll) {
    cuda::executor exec(coll.stream());
    C<cuda::executor> c(params, exec);
    auto st = c.make_state(layer);
    rank_trace& t = traces[rank];
    for (std::size_t s = 0; s < steps; ++s) {
      device_array<float> g(input(s, rank));
      const reduce_result r = c.reduce(st, g.span(), coll);
      t.status.push_back(r.status);
      t.sent.push_back(r.sent);
      t.out.push_back(g.host());
    }
    t.memory = memory_of(st.memory);
    t.step = st.step;
  });
  return traces;
}

/// A DeviceCollective over the NCCL one that, after each gather of slots, writes the `width`
/// low bytes of `value` (little-endian) at byte `offset` of rank `victim`'s payload, as a
/// transport that corrupts data would.
struct corrupting {
  collectives::nccl& inner;
  std::size_t victim, offset;
  std::uint32_t value;
  std::size_t width = 1;

  [[nodiscard]] std::size_t rank() const noexcept { return inner.rank(); }
  [[nodiscard]] std::size_t size() const noexcept { return inner.size(); }
  [[nodiscard]] cudaStream_t stream() const noexcept { return inner.stream(); }
  void allreduce_sum(std::span<float> v) { inner.allreduce_sum(v); }
  void allgather(std::span<const std::byte> mine, gather_buffer& out) { inner.allgather(mine, out); }
  void allgather_slots(std::span<const std::byte> mine, std::span<std::byte> slots, std::size_t slot) {
    inner.allgather_slots(mine, slots, slot);
    BELLOWS_CUDA_CHECK(cudaMemcpyAsync(slots.data() + victim * slot + offset, &value, width,
                                       cudaMemcpyHostToDevice, inner.stream()));
    BELLOWS_CUDA_CHECK(cudaStreamSynchronize(inner.stream()));
  }
};
static_assert(DeviceCollective<corrupting>);

/// Checks that every rank saw the same on the device as on the CPU, bit for bit.
inline void check_same_traces(const std::vector<rank_trace>& got, const std::vector<rank_trace>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t r = 0; r < got.size(); ++r) {
    CAPTURE(r);
    CHECK(got[r].status == want[r].status);
    CHECK(got[r].sent == want[r].sent);
    CHECK(got[r].step == want[r].step);
    CHECK(same_bytes(got[r].memory, want[r].memory));
    REQUIRE(got[r].out.size() == want[r].out.size());
    for (std::size_t s = 0; s < got[r].out.size(); ++s) {
      CAPTURE(s);
      CHECK(same_bytes(got[r].out[s], want[r].out[s]));
    }
  }
}

}  // namespace bellows::test
