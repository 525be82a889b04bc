// SPDX-License-Identifier: Apache-2.0
// A checkpoint round trip of one layer's state, for the tests of an exchange: `before` steps,
// save, load into a fresh state, then `after` steps of both, whose outputs and states must agree
// bit for bit (`same_state(a, b)` compares what the exchange keeps).
#pragma once

#include <bellows/core/checkpoint.hpp>
#include <bellows/core/shape.hpp>
#include <bellows/core/traffic.hpp>

#include <doctest/doctest.h>

#include <cstddef>

#include "bits.hpp"

namespace bellows::testing {

template <class C, class Coll, class Gradient, class SameState>
void check_resume(C& c, const layer_info& layer, Coll& comm, Gradient gradient, std::size_t before, std::size_t after,
                  SameState same_state) {
  auto st = c.make_state(layer);
  for (std::size_t t = 0; t < before; ++t) {
    auto g = gradient(layer.size(), comm.rank(), t);
    REQUIRE(c.reduce(st, g, comm).status == step_status::ok);
  }
  checkpoint_writer w;
  c.save(st, w);
  auto resumed = c.make_state(layer);
  checkpoint_reader in(w.bytes());
  c.load(resumed, in);
  CHECK(same_state(st, resumed));
  for (std::size_t t = before; t < before + after; ++t) {
    auto a = gradient(layer.size(), comm.rank(), t), b = a;
    REQUIRE(c.reduce(st, a, comm).status == step_status::ok);
    REQUIRE(c.reduce(resumed, b, comm).status == step_status::ok);
    CHECK(same_bits(a, b));
    CHECK(same_state(st, resumed));
  }
}

}  // namespace bellows::testing
