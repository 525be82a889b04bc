// SPDX-License-Identifier: Apache-2.0
// Rand-k on the device: randk<cuda::executor>, the compressor of compressors/randk.hpp over the
// device's kernels (cuda/sample.cuh, cuda/sparse_payload.cuh), its state in device memory,
// exchanged through a DeviceCollective (collectives::nccl) on the executor's stream. Every rank's
// result, error memory, step counter and payload bytes are the CPU's, bit for bit: the same draw
// and the same quotients for the average. The device draws from layers below 2^32 elements;
// make_state refuses larger ones.
#pragma once

#include "bellows/compressors/randk.hpp"
#include "bellows/concepts.hpp"
#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/float_array.cuh"
#include "bellows/cuda/payload_slots.cuh"
#include "bellows/cuda/sparse.cuh"
#include "bellows/cuda/sparse_payload.cuh"

namespace bellows {

static_assert(Compressor<randk<cuda::executor>, archetypes::device_collective>,
              "randk<cuda::executor> must model Compressor over a DeviceCollective");
static_assert(CheckpointedCompressor<randk<cuda::executor>>, "randk<cuda::executor> must model CheckpointedCompressor");
static_assert(PayloadCodec<randk<cuda::executor>>, "randk<cuda::executor> must model PayloadCodec (device memory)");

}  // namespace bellows
