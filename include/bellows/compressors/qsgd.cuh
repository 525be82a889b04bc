// SPDX-License-Identifier: Apache-2.0
// QSGD on the device: qsgd<cuda::executor>, the compressor of compressors/qsgd.hpp over the
// device's kernels (cuda/quantize.cuh, cuda/scaled_payload.cuh), its state and payloads in device
// memory, exchanged by the allgather_slots of a DeviceCollective (collectives::nccl) on the
// executor's stream. Every rank's result, error memory and payload bytes are the CPU's, bit for bit.
#pragma once

#include "bellows/compressors/qsgd.hpp"
#include "bellows/concepts.hpp"
#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/float_array.cuh"
#include "bellows/cuda/payload_slots.cuh"
#include "bellows/cuda/quantize.cuh"
#include "bellows/cuda/scaled_payload.cuh"

namespace bellows {

static_assert(Compressor<qsgd<cuda::executor>, archetypes::device_collective>,
              "qsgd<cuda::executor> must model Compressor over a DeviceCollective");
static_assert(CheckpointedCompressor<qsgd<cuda::executor>>, "qsgd<cuda::executor> must model CheckpointedCompressor");
static_assert(PayloadCodec<qsgd<cuda::executor>>, "qsgd<cuda::executor> must model PayloadCodec (device memory)");

}  // namespace bellows
