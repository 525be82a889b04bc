// SPDX-License-Identifier: Apache-2.0
// NCCL ranks for the CUDA tests: one communicator per visible device, in one group, each driven
// by its own thread of this process with its own stream. On the CUDA emulation
// (tests/emulation), which reports three devices, that is three ranks.
#pragma once

#include <bellows/collectives/nccl.cuh>

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "bellows/cuda/check.cuh"

namespace bellows::test {

/// Runs body(rank, collective) on one thread per device, each with its own stream and its own
/// collectives::nccl over that device's communicator; rethrows the first exception any rank
/// raised, after every thread has finished. A rank that throws between collectives leaves the
/// others waiting in their next one, as with real NCCL.
template <class Body>
void on_every_device(Body body) {
  const int w = bellows::cuda::device_count();
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(w));
  std::vector<int> devices(static_cast<std::size_t>(w));
  for (int d = 0; d < w; ++d) devices[static_cast<std::size_t>(d)] = d;
  BELLOWS_NCCL_CHECK(ncclCommInitAll(comms.data(), w, devices.data()));
  std::mutex m;
  std::exception_ptr failure;
  std::vector<std::thread> ranks;
  for (int d = 0; d < w; ++d)
    ranks.emplace_back([&, d] {
      try {
        BELLOWS_CUDA_CHECK(cudaSetDevice(d));
        cudaStream_t stream = nullptr;
        BELLOWS_CUDA_CHECK(cudaStreamCreate(&stream));
        {
          bellows::collectives::nccl coll(comms[static_cast<std::size_t>(d)], stream);
          body(static_cast<std::size_t>(d), coll);
        }
        BELLOWS_CUDA_CHECK(cudaStreamDestroy(stream));
      } catch (...) {
        std::lock_guard lock(m);
        if (!failure) failure = std::current_exception();
      }
    });
  for (auto& t : ranks) t.join();
  for (ncclComm_t c : comms) ncclCommDestroy(c);
  if (failure) std::rethrow_exception(failure);
}

}  // namespace bellows::test
