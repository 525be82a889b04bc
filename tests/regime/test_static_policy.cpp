// SPDX-License-Identifier: Apache-2.0
#include <bellows/regime/static_policy.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <span>
#include <vector>

using bellows::participation;
using bellows::regime;

namespace {
/// One rank that fails the test if the policy exchanges anything.
struct silent_collective : bellows::archetypes::collective {
  void allreduce_sum(std::span<float>) { FAIL("static_policy exchanged data"); }
};
}  // namespace

TEST_CASE("static_policy: the same regime every epoch for participating layers, critical for excluded ones") {
  for (const regime always : {regime::critical, regime::normal}) {
    bellows::static_policy p(always);
    p.add_layer({0, "fc1.weight", bellows::shape{4, 3}});
    p.add_layer({1, "fc1.bias", bellows::shape{4}}, participation::excluded);
    silent_collective coll;
    const std::vector<float> g(12, 1.0f);
    for (std::size_t e = 0; e < 5; ++e) {
      CHECK(p.observe(0, g) == bellows::step_status::ok);
      const auto r = p.end_epoch(e, e < 3 ? 0.1f : 0.01f, coll);
      CHECK(std::vector<regime>(r.begin(), r.end()) == std::vector<regime>{always, regime::critical});
    }
  }
}

TEST_CASE("static_policy: layers out of order and unknown ids are refused") {
  bellows::static_policy p(regime::normal);
  CHECK_THROWS_WITH_AS(p.add_layer({1, "late", bellows::shape{3}}), doctest::Contains("'late' has id 1"),
                       bellows::error);
  p.add_layer({0, "fc", bellows::shape{3}});
  CHECK_THROWS_WITH_AS(p.observe(1, std::vector<float>(3)), doctest::Contains("unknown layer id 1 of 1"),
                       bellows::error);
}
