// SPDX-License-Identifier: Apache-2.0
// Accordion on the device: basic_accordion<cuda::executor> (regime/accordion.hpp, written once)
// with its gradient sums in device memory, fed device gradients, and exchanging its norms in
// device memory through a DeviceCollective on the executor's stream. It sums and takes norms in
// the CPU's order (cuda/float_array.cuh), so it reaches the CPU detector's decisions bit for bit,
// and its checkpoint record is the CPU's.
//
// Waits for the stream: observe() once per observed call (it reads its finiteness flag back;
// observe_finite(), which the Synchronizer calls, never); end_epoch() once at a check epoch
// (the summed norms); state(), save() and restore() for their copies.
#pragma once

#include "bellows/cuda/elementwise.cuh"
#include "bellows/cuda/executor.cuh"
#include "bellows/cuda/float_array.cuh"
#include "bellows/regime/accordion.hpp"

namespace bellows {

static_assert(LevelDetector<basic_accordion<cuda::executor>> && ObservingDetector<basic_accordion<cuda::executor>> &&
                  CheckpointedDetector<basic_accordion<cuda::executor>>,
              "basic_accordion<cuda::executor> must be a checkpointed, observing LevelDetector");
static_assert(RegimeDetector<basic_accordion<cuda::executor>, archetypes::device_collective>,
              "basic_accordion<cuda::executor> must model RegimeDetector over a DeviceCollective");

}  // namespace bellows
