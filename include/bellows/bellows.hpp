// SPDX-License-Identifier: Apache-2.0
// The umbrella header: everything that builds with a plain C++20 compiler (no .cuh, no MPI).
#pragma once

#include "bellows/collectives/counting.hpp"
#include "bellows/collectives/local.hpp"
#include "bellows/compressors/identity.hpp"
#include "bellows/compressors/powersgd.hpp"
#include "bellows/compressors/qsgd.hpp"
#include "bellows/compressors/randk.hpp"
#include "bellows/compressors/topk.hpp"
#include "bellows/concepts.hpp"
#include "bellows/core/config.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/gather_buffer.hpp"
#include "bellows/core/philox.hpp"
#include "bellows/core/shape.hpp"
#include "bellows/core/traffic.hpp"
#include "bellows/core/view.hpp"
#include "bellows/core/wire.hpp"
#include "bellows/feedback/error_feedback.hpp"
#include "bellows/cpu/elementwise.hpp"
#include "bellows/cpu/executor.hpp"
