// SPDX-License-Identifier: Apache-2.0
// For the CPU emulation of CUDA: see cub_and_thrust.h.
#pragma once
#include "../../cub_and_thrust.h"
