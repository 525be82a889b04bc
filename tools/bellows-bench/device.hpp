// SPDX-License-Identifier: Apache-2.0
// bellows-bench's cuda backend (--backend cuda), built when CUDA is on (bellows-bench/device.cu,
// compiled by nvcc; BELLOWS_BENCH_CUDA is then defined): the device compressor of a method of
// compressors/list.hpp, measured on one rank.
#pragma once

#include <string_view>

#include "bellows-bench/measure.hpp"
#include "bellows/core/method.hpp"
#include "bellows/core/shape.hpp"

namespace bellows::tool {

/// True when a CUDA device is present.
[[nodiscard]] bool device_present();

/// Builds the device compressor of method `name` with `settings` and makes its state for the
/// layer: raises bellows::error when the method is not on the device, refuses the configuration
/// there, or there is no CUDA device.
void check_on_device(std::string_view name, const method_settings& settings, const layer_info& layer);

/// Measures it as measure() measures the CPU compressor, on one rank with no transport: before
/// each call the input is copied to the device (not timed), the call is timed with CUDA events,
/// and the output is copied back for the distortion; the floor is one device read of the input.
[[nodiscard]] method_result measure_on_device(std::string_view name, const method_settings& settings,
                                              const run_request& req);

}  // namespace bellows::tool
