// SPDX-License-Identifier: Apache-2.0
// PowerSGD on the device: powersgd<cuda::executor>, the compressor of compressors/powersgd.hpp
// over the device's kernels, its error memory, query and workspaces in device memory, exchanged
// by the two allreduces of a DeviceCollective (collectives::nccl) on the executor's stream. What
// differs from the CPU is only where the sums run: the products sum in another order
// (cuda/skinny_gemm.cuh), so P, Q and what is built from them agree with the CPU's within float
// rounding; statuses, counters, traffic and dense averages are the CPU's bit for bit.
#pragma once

#include "bellows/compressors/powersgd.hpp"
#include "bellows/concepts.hpp"
#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/float_array.cuh"
#include "bellows/cuda/gram_schmidt.cuh"
#include "bellows/cuda/normals.cuh"
#include "bellows/cuda/skinny_gemm.cuh"

namespace bellows {

static_assert(Compressor<powersgd<cuda::executor>, archetypes::device_collective>,
              "powersgd<cuda::executor> must model Compressor over a DeviceCollective");
static_assert(CheckpointedCompressor<powersgd<cuda::executor>>,
              "powersgd<cuda::executor> must model CheckpointedCompressor");

}  // namespace bellows
