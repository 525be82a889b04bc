// SPDX-License-Identifier: Apache-2.0
// The identity compressor on the device: identity<cuda::executor>, the class of
// compressors/identity.hpp over the device's kernels, averaging device memory through a
// DeviceCollective on the executor's stream with the CPU's bits (one float's verdict, then the
// data, divided by W). Its PayloadCodec members are the CPU's only.
#pragma once

#include "bellows/compressors/identity.hpp"
#include "bellows/concepts.hpp"
#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/float_array.cuh"

namespace bellows {

static_assert(Compressor<identity<cuda::executor>, archetypes::device_collective>,
              "identity<cuda::executor> must model Compressor over a DeviceCollective");
static_assert(CheckpointedCompressor<identity<cuda::executor>>,
              "identity<cuda::executor> must model CheckpointedCompressor");

}  // namespace bellows
