// SPDX-License-Identifier: Apache-2.0
// The Synchronizer on the device: synchronizer<C, D, cuda::executor> (sync/synchronizer.hpp,
// written once) over device compressors (compressors/*.cuh), a detector that reads device
// gradients (basic_accordion<cuda::executor>, or static_policy, which reads none) and a
// DeviceCollective (collectives::nccl) enqueuing on the executor's stream.
//
// What a step waits for on the host: each compressor's reduce waits once (its verdicts, or its
// flag), so L waits for L layers; in an epoch the detector observes, the finiteness vote adds one
// (the L flags read back after their allreduce); measure_gradient_norms(true) adds one (the L
// norms read back). The first step also allreduces 24 host floats (the layer agreement), which
// collectives::nccl stages through device memory. Nothing on the step allocates after the first.
#pragma once

#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/float_array.cuh"
#include "bellows/regime/accordion.cuh"
#include "bellows/sync/synchronizer.hpp"
