// SPDX-License-Identifier: Apache-2.0
// Top-k on the device: topk<cuda::executor>, the compressor of compressors/topk.hpp (exact or
// approximate mode) over the device's kernels (cuda/select.cuh, cuda/sparse_payload.cuh), its
// state and payloads in device memory, exchanged through a DeviceCollective (collectives::nccl)
// on the executor's stream. Every rank's result, error memory, step counter, payload bytes and
// traffic are the CPU's, bit for bit: the same kept set (ties to the lower index, and in
// approximate mode the CPU's sample), and the sums in the CPU's order. The device selects from
// layers below 2^31 elements; make_state refuses larger ones.
#pragma once

#include "bellows/compressors/topk.hpp"
#include "bellows/concepts.hpp"
#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/float_array.cuh"
#include "bellows/cuda/index_list.cuh"
#include "bellows/cuda/payload_slots.cuh"
#include "bellows/cuda/sparse.cuh"
#include "bellows/cuda/sparse_payload.cuh"

namespace bellows {

static_assert(Compressor<topk<cuda::executor>, archetypes::device_collective>,
              "topk<cuda::executor> must model Compressor over a DeviceCollective");
static_assert(CheckpointedCompressor<topk<cuda::executor>>, "topk<cuda::executor> must model CheckpointedCompressor");
static_assert(PayloadCodec<topk<cuda::executor>>, "topk<cuda::executor> must model PayloadCodec (device memory)");

}  // namespace bellows
