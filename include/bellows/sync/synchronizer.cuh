// SPDX-License-Identifier: Apache-2.0
// The Synchronizer on the device: synchronizer<C, D, cuda::executor> (sync/synchronizer.hpp,
// written once) over device compressors (compressors/*.cuh), a detector that reads device
// gradients (basic_accordion<cuda::executor>, or static_policy, which reads none) and a
// DeviceCollective (collectives::nccl) enqueuing on the executor's stream.
//
// What a step waits for on the host: step() waits once, after the phases of all its buckets
// (step_bucket once per bucket, whose statuses it returns): no phase waits, since every
// compressor's verdicts (and the sparse codecs' counts) gate its writes on the device and go to
// pinned host memory, and measure_gradient_norms(true) sends the norms back before that wait. A
// bucket of one layer waits as that layer's reduce does (once; twice for a matrix PowerSGD
// compresses). In an epoch the detector observes, each bucket's finiteness vote adds one (its
// flags read back before its exchange). tests/cuda/test_synchronizer.cu counts them on the
// emulation.
// The first step also allreduces 24 host floats (the layer agreement), which collectives::nccl
// stages through device memory. Nothing on the step allocates once the buckets' buffers have
// grown.
#pragma once

#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/float_array.cuh"
#include "bellows/regime/accordion.cuh"
#include "bellows/sync/synchronizer.hpp"
