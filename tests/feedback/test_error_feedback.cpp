// SPDX-License-Identifier: Apache-2.0
#include <bellows/compressors/topk.hpp>
#include <bellows/feedback/error_feedback.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "../support/random.hpp"

TEST_CASE("error_feedback residual: compensate adds the memory, update keeps what was left out") {
  bellows::error_feedback ef(bellows::feedback::residual);
  ef.add_layer({0, "a", bellows::shape{5}});
  std::vector<float> g{1, 2, 3, 4, 5};
  ef.compensate(0, g);
  CHECK(g == std::vector<float>{1, 2, 3, 4, 5});  // memory starts at zero
  const std::vector<float> contribution{1, 0, 3, 0, 0};
  ef.update(0, g, contribution);
  CHECK(std::vector<float>(ef.memory(0).values().begin(), ef.memory(0).values().end()) ==
        std::vector<float>{0, 2, 0, 4, 5});
  std::vector<float> g2{1, 1, 1, 1, 1};
  ef.compensate(0, g2);
  CHECK(g2 == std::vector<float>{1, 3, 1, 5, 6});
}

TEST_CASE("error_feedback scaled: a learning-rate change rescales the memory by lr_old / lr_new") {
  bellows::error_feedback ef(bellows::feedback::scaled);
  ef.add_layer({0, "a", bellows::shape{2}});
  ef.set_learning_rate(0.1f);
  const std::vector<float> m{2, 4}, zero{0, 0};
  ef.update(0, m, zero);
  ef.set_learning_rate(0.05f);
  CHECK(ef.memory(0).values()[0] == doctest::Approx(4.0f));
  CHECK(ef.memory(0).values()[1] == doctest::Approx(8.0f));

  bellows::error_feedback residual(bellows::feedback::residual);
  residual.add_layer({0, "a", bellows::shape{2}});
  residual.set_learning_rate(0.1f);
  residual.update(0, m, zero);
  residual.set_learning_rate(0.05f);
  CHECK(residual.memory(0).values()[0] == 2.0f);
}

TEST_CASE("error_feedback none: holds nothing and changes nothing") {
  bellows::error_feedback ef(bellows::feedback::none);
  ef.add_layer({0, "a", bellows::shape{3}});
  std::vector<float> g{1, 2, 3};
  ef.update(0, g, std::vector<float>{0, 0, 0});
  ef.compensate(0, g);
  CHECK(g == std::vector<float>{1, 2, 3});
  CHECK(ef.memory(0).values().empty());
}

TEST_CASE("error_feedback: layers out of order and buffers of the wrong size are refused") {
  bellows::error_feedback ef(bellows::feedback::residual);
  CHECK_THROWS_WITH_AS(ef.add_layer({1, "late", bellows::shape{3}}), doctest::Contains("late"), bellows::error);
  ef.add_layer({0, "fc", bellows::shape{3}});
  std::vector<float> g(4);
  CHECK_THROWS_WITH_AS(ef.compensate(0, g), doctest::Contains("fc"), bellows::error);
  CHECK_THROWS_AS(ef.compensate(1, g), bellows::error);
  CHECK_THROWS_AS(ef.set_learning_rate(0.0f), bellows::error);
}

TEST_CASE("error_feedback composed with a top-k codec gives the fused top-k memory, bit for bit") {
  // compensate, encode, decode this rank's own payload, update: the path of a trainer with its
  // own transport. Top-k's reduce fuses the same steps into its selection pass.
  bellows::cpu::executor exec(1);
  bellows::archetypes::collective solo;
  const std::size_t n = 3000;
  const bellows::layer_info layer{0, "fc", bellows::shape{n}};
  bellows::topk<> fused({.ratio = 0.02}, exec);
  const bellows::topk<> codec({.ratio = 0.02, .feedback = bellows::feedback::none}, exec);
  bellows::error_feedback ef(bellows::feedback::residual, exec);
  ef.add_layer(layer);
  auto fused_state = fused.make_state(layer);
  auto codec_state = codec.make_state(layer);
  std::vector<std::uint64_t> storage((codec.max_payload_bytes(codec_state) + 7) / 8);
  for (std::uint64_t t = 0; t < 20; ++t) {
    const auto g = bellows::testing::normal_floats(n, 70 + t);
    std::vector<float> m = g, contribution(n, 0.0f);
    ef.compensate(0, m);
    const auto payload = codec.encode(codec_state, m, std::as_writable_bytes(std::span(storage)));
    REQUIRE(codec.decode_add(codec_state, payload, contribution) == bellows::step_status::ok);
    ef.update(0, m, contribution);
    ++codec_state.step;
    auto x = g;
    REQUIRE(fused.reduce(fused_state, x, solo).status == bellows::step_status::ok);
    CHECK(std::memcmp(x.data(), contribution.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(fused_state.memory.values().data(), ef.memory(0).values().data(), n * sizeof(float)) == 0);
  }
}
