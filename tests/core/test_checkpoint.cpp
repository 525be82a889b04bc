// SPDX-License-Identifier: Apache-2.0
#include <bellows/core/checkpoint.hpp>

#include <doctest/doctest.h>

#include <filesystem>
#include <vector>

TEST_CASE("checkpoint: values, arrays and strings round-trip") {
  bellows::checkpoint_writer w;
  w.put<std::uint32_t>(7);
  const std::vector<float> e{1.5f, -2.0f, 0.0f};
  w.put_array(std::span<const float>(e));
  w.put_string("fc1.weight");
  w.put<double>(0.25);

  bellows::checkpoint_reader r(w.bytes());
  CHECK(r.get<std::uint32_t>("a") == 7);
  std::vector<float> back(3);
  r.get_array(std::span<float>(back), "e");
  CHECK(back == e);
  CHECK(r.get_string("name") == "fc1.weight");
  CHECK(r.get<double>("d") == 0.25);
  r.finish();
}

TEST_CASE("checkpoint: truncation, wrong counts, long strings and trailing bytes are refused") {
  bellows::checkpoint_writer w;
  const std::vector<float> e(10, 1.0f);
  w.put_array(std::span<const float>(e));
  const auto bytes = w.bytes();
  {
    bellows::checkpoint_reader r(bytes.first(bytes.size() - 1));
    std::vector<float> out(10, 5.0f);
    CHECK_THROWS_WITH_AS(r.get_array(std::span<float>(out), "memory"), doctest::Contains("truncated while reading memory"),
                         bellows::wire_error);
    CHECK(out == std::vector<float>(10, 5.0f));
  }
  {
    bellows::checkpoint_reader r(bytes);
    std::vector<float> out(9);
    CHECK_THROWS_WITH_AS(r.get_array(std::span<float>(out), "memory"), doctest::Contains("10 elements, expected 9"),
                         bellows::wire_error);
  }
  {
    bellows::checkpoint_reader r(bytes);
    CHECK_THROWS_WITH_AS((void)r.get_string("name", 4), doctest::Contains("exceeds"), bellows::wire_error);
  }
  {
    bellows::checkpoint_reader r(bytes);
    (void)r.get<std::uint64_t>("count");
    CHECK_THROWS_WITH_AS(r.finish(), doctest::Contains("unexpected bytes"), bellows::wire_error);
  }
}

TEST_CASE("checkpoint files: atomic replacement, and a clear error for a missing file") {
  const auto dir = std::filesystem::temp_directory_path() / "bellows_checkpoint_test";
  std::filesystem::create_directories(dir);
  const auto file = dir / "state.bin";
  const std::vector<std::byte> first(100, std::byte{1}), second(50, std::byte{2});
  bellows::write_file_atomically(file, first);
  CHECK(bellows::read_file(file) == first);
  bellows::write_file_atomically(file, second);
  CHECK(bellows::read_file(file) == second);
  CHECK_FALSE(std::filesystem::exists(dir / "state.bin.tmp"));
  CHECK_THROWS_WITH_AS((void)bellows::read_file(dir / "missing.bin"), doctest::Contains("missing.bin"), bellows::error);
  CHECK_THROWS_AS(bellows::write_file_atomically(dir / "no" / "such" / "dir", first), bellows::error);
  std::filesystem::remove_all(dir);
}
