// SPDX-License-Identifier: Apache-2.0
// The Synchronizer on the device: synchronizer<C, D, cuda::executor> (sync/synchronizer.hpp,
// written once) over device compressors (compressors/*.cuh), a detector that reads device
// gradients (basic_accordion<cuda::executor>, or static_policy, which reads none) and a
// DeviceCollective (collectives::nccl) enqueuing on the executor's stream.
//
// What a step waits for on the host: a bucket of several layers waits once after its last phase
// (sync/bucket_exchange.hpp), and once more per layer it averages from gathered payloads (QSGD,
// EF-signSGD, top-k and per-rank rand-k read their payloads' verdicts); a bucket of one layer
// waits as that layer's reduce does (once; twice for a matrix PowerSGD compresses). In an epoch
// the detector observes, each bucket's finiteness vote adds one (its flags read back after their
// allreduce); measure_gradient_norms(true) adds one per step (the L norms read back). The first
// step also allreduces 24 host floats (the layer agreement), which collectives::nccl stages
// through device memory. Nothing on the step allocates once the buckets' buffers have grown.
#pragma once

#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/float_array.cuh"
#include "bellows/regime/accordion.cuh"
#include "bellows/sync/synchronizer.hpp"
