// SPDX-License-Identifier: Apache-2.0
// The device compressors' tests against the CPU's: the same compressor template run for some
// steps on every rank, once as C<cpu::executor> over the local collective and once as
// C<cuda::executor> over NCCL (one rank per device), with the same inputs; what each rank saw is
// recorded for comparison bit for bit.
#pragma once

#include <bellows/collectives/local.hpp>
#include <bellows/collectives/nccl.cuh>
#include <bellows/concepts.hpp>
#include <bellows/core/checkpoint.hpp>
#include <bellows/core/error.hpp>
#include <bellows/core/gather_buffer.hpp>
#include <bellows/core/shape.hpp>
#include <bellows/core/traffic.hpp>
#include <bellows/cpu/executor.hpp>
#include <bellows/cuda/buffer.cuh>
#include <bellows/cuda/executor.cuh>
#include <bellows/feedback/error_feedback.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
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
std::vector<rank_trace> trace_on_device(const Params& params, const layer_info& layer, std::size_t steps, Input input) {
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
    BELLOWS_CUDA_CHECK(
        cudaMemcpyAsync(slots.data() + victim * slot + offset, &value, width, cudaMemcpyHostToDevice, inner.stream()));
    BELLOWS_CUDA_CHECK(cudaStreamSynchronize(inner.stream()));
  }
};
static_assert(DeviceCollective<corrupting>);

/// A byte-level corruption of one rank's payload after the gather, and a piece of the message
/// the CPU's validation gives for it.
struct corruption {
  std::size_t offset;
  std::uint32_t value;
  std::size_t width;
  std::string says;
};

/// Runs fn(rank, collective) on every device and checks that it returned true on every rank.
template <class Fn>
void check_every_rank(Fn fn) {
  std::atomic<std::size_t> right{0};
  on_every_device([&](std::size_t rank, collectives::nccl& coll) {
    if (fn(rank, coll)) ++right;
  });
  CHECK(right == static_cast<std::size_t>(cuda::device_count()));
}

/// True when call() raises E with a message that contains `says`.
template <class E, class Call>
bool raises(Call&& call, std::string_view says) {
  try {
    call();
  } catch (const E& err) {
    if (std::string_view(err.what()).find(says) != std::string_view::npos) return true;
    MESSAGE(err.what());
  }
  return false;
}

/// One good step of C<cuda::executor>(params), then a step whose gathered payload of the last
/// rank is corrupted as `bad` says: every rank raises wire_error naming that rank and holding
/// `bad.says`, and neither the error memory, the step counter nor the input change.
/// input(step, rank) is rank's gradient at a step.
template <template <class> class C, class Params, class Input>
void check_malformed(const Params& params, const layer_info& layer, Input input, const corruption& bad) {
  const std::size_t victim = static_cast<std::size_t>(cuda::device_count()) - 1;
  check_every_rank([&](std::size_t rank, collectives::nccl& coll) {
    cuda::executor exec(coll.stream());
    C<cuda::executor> c(params, exec);
    auto st = c.make_state(layer);
    device_array<float> g0(input(0, rank));
    bool ok = c.reduce(st, g0.span(), coll).status == step_status::ok;
    const std::vector<float> e = memory_of(st.memory), g = input(1, rank);
    device_array<float> g1(g);
    corrupting lossy{coll, victim, bad.offset, bad.value, bad.width};
    try {
      (void)c.reduce(st, g1.span(), lossy);
      ok = false;
    } catch (const wire_error& err) {
      const std::string_view says = err.what();
      ok &= says.find("rank " + std::to_string(victim)) != std::string_view::npos &&
            says.find(bad.says) != std::string_view::npos;
      if (!ok) MESSAGE(err.what());
    }
    return ok && st.step == 1 && same_bytes(memory_of(st.memory), e) && same_bytes(g1.host(), g);
  });
}

/// What every device compressor refuses before it enqueues anything: a collective on another
/// stream than its executor's, a buffer of another size than the layer's, and a state made with
/// an error memory by a compressor without one (params must have a memory). A good step follows.
/// (A state made by a compressor of another level is followed, as on the CPU: the Synchronizer's
/// tests, tests/cuda/test_synchronizer.cu, step both levels on one state.)
template <template <class> class C, class Params, class Input>
void check_refusals(const Params& params, const layer_info& layer, Input input) {
  check_every_rank([&](std::size_t rank, collectives::nccl& coll) {
    cudaStream_t stream = nullptr;
    BELLOWS_CUDA_CHECK(cudaStreamCreate(&stream));
    bool ok = true;
    {
      cuda::executor elsewhere(stream), exec(coll.stream());
      C<cuda::executor> wrong_stream(params, elsewhere), c(params, exec);
      auto st = c.make_state(layer);
      device_array<float> g(input(0, rank)), short_g(layer.size() - 1);
      ok &= raises<error>([&] { (void)wrong_stream.reduce(st, g.span(), coll); }, "different streams");
      ok &= raises<error>([&] { (void)c.reduce(st, short_g.span(), coll); },
                          "the buffer " + std::to_string(layer.size() - 1));
      Params without = params;
      without.feedback = feedback::none;
      C<cuda::executor> memoryless(without, exec);
      ok &= raises<error>([&] { (void)memoryless.reduce(st, g.span(), coll); },
                          "used by a compressor with feedback none");
      ok &= st.step == 0 && c.reduce(st, g.span(), coll).status == step_status::ok && st.step == 1;
    }
    BELLOWS_CUDA_CHECK(cudaStreamDestroy(stream));
    return ok;
  });
}

/// A step of C<cuda::executor>(params) with a memory, then checkpoints both ways: the device's
/// record loads into C<cpu::executor> with the same memory and step; the CPU's, with one element
/// changed, loads back into a fresh device state; a truncated record raises wire_error and
/// changes nothing.
template <template <class> class C, class Params, class Input>
void check_checkpoints(const Params& params, const layer_info& layer, Input input) {
  check_every_rank([&](std::size_t rank, collectives::nccl& coll) {
    cuda::executor exec(coll.stream());
    C<cuda::executor> c(params, exec);
    auto st = c.make_state(layer);
    device_array<float> g(input(0, rank));
    bool ok = c.reduce(st, g.span(), coll).status == step_status::ok;
    std::vector<float> e = memory_of(st.memory);
    ok &= std::any_of(e.begin(), e.end(), [](float x) { return x != 0.0f; });

    checkpoint_writer saved;
    c.save(st, saved);
    cpu::executor host(1);
    C<cpu::executor> on_host(params, host);
    auto host_st = on_host.make_state(layer);
    checkpoint_reader from_device(saved.bytes());
    on_host.load(host_st, from_device);
    ok &= host_st.step == 1 &&
          same_bytes(std::vector<float>(host_st.memory.values().begin(), host_st.memory.values().end()), e);

    host_st.memory.values()[layer.size() / 2] = 0.25f;
    e[layer.size() / 2] = 0.25f;
    checkpoint_writer from_host;
    on_host.save(host_st, from_host);
    auto fresh = c.make_state(layer);
    checkpoint_reader back(from_host.bytes());
    c.load(fresh, back);
    ok &= fresh.step == 1 && same_bytes(memory_of(fresh.memory), e);

    checkpoint_reader cut(from_host.bytes().first(from_host.bytes().size() - 4));
    ok &= raises<wire_error>([&] { c.load(fresh, cut); }, "");
    return ok && fresh.step == 1 && same_bytes(memory_of(fresh.memory), e);
  });
}

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
