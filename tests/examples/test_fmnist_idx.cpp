// SPDX-License-Identifier: Apache-2.0
#include "fmnist/idx.hpp"

#include <doctest/doctest.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

/// A folder of its own under the system's temporary folder, removed at the end of the test.
struct temp_dir {
  fs::path path = fs::temp_directory_path() / ("bellows_fmnist_idx_" + std::to_string(::getpid()));
  temp_dir() { fs::create_directories(path); }
  ~temp_dir() { fs::remove_all(path); }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
};

/// The bytes of an IDX file of unsigned bytes: header for `dims`, then `payload`.
std::vector<std::uint8_t> idx_bytes(const std::vector<std::uint32_t>& dims, const std::vector<std::uint8_t>& payload,
                                    std::uint8_t type = 0x08) {
  std::vector<std::uint8_t> out{0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (const std::uint32_t d : dims)
    for (const int shift : {24, 16, 8, 0}) out.push_back(static_cast<std::uint8_t>(d >> shift));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

void write_gzip(const fs::path& file, const std::vector<std::uint8_t>& bytes) {
  gzFile out = gzopen(file.c_str(), "wb");
  REQUIRE(out != nullptr);
  REQUIRE(gzwrite(out, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(out) == Z_OK);
}

void write_plain(const fs::path& file, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(file, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

/// Three 28x28 images (pixel = image index * 10 + row) and their labels.
std::vector<std::uint8_t> three_images() {
  std::vector<std::uint8_t> pixels;
  for (std::uint8_t i = 0; i < 3; ++i)
    for (std::uint8_t r = 0; r < 28; ++r) pixels.insert(pixels.end(), 28, static_cast<std::uint8_t>(i * 10 + r));
  return pixels;
}

}  // namespace

TEST_CASE("fmnist idx: the real Fashion-MNIST files of the dataset-fashion-mnist package") {
  const fs::path dir = fmnist::package_dir;
  if (!fs::exists(dir / "train-images-idx3-ubyte.gz")) {
    MESSAGE("skipped: " << dir << " holds no Fashion-MNIST (apt-get install dataset-fashion-mnist)");
    return;
  }
  const fmnist::dataset data = fmnist::load(dir);
  CHECK(data.train.count == 60000);
  CHECK(data.test.count == 10000);
  CHECK(data.train.images.size() == 60000 * 784);
  CHECK(data.test.images.size() == 10000 * 784);
  // Fashion-MNIST is balanced: 6000 training and 1000 test images per class.
  std::array<int, 10> train_per_class{}, test_per_class{};
  for (const std::uint8_t l : data.train.labels) ++train_per_class[l];
  for (const std::uint8_t l : data.test.labels) ++test_per_class[l];
  for (int c = 0; c < 10; ++c) {
    CHECK(train_per_class[static_cast<std::size_t>(c)] == 6000);
    CHECK(test_per_class[static_cast<std::size_t>(c)] == 1000);
  }
  // The first test labels of the published files: ankle boot, pullover, trouser, trouser, ...
  CHECK(std::vector<std::uint8_t>(data.test.labels.begin(), data.test.labels.begin() + 8) ==
        std::vector<std::uint8_t>{9, 2, 1, 1, 6, 1, 4, 6});
  CHECK(data.train.labels[0] == 9);
}

TEST_CASE("fmnist idx: a valid file, gzip-compressed or plain, reads back exactly") {
  temp_dir tmp;
  const std::vector<std::uint8_t> pixels = three_images();
  write_gzip(tmp.path / "images.gz", idx_bytes({3, 28, 28}, pixels));
  write_plain(tmp.path / "labels", idx_bytes({3}, {7, 0, 9}));
  const fmnist::split s = fmnist::read_split(tmp.path / "images.gz", tmp.path / "labels");
  CHECK(s.count == 3);
  CHECK(s.images == pixels);
  CHECK(s.labels == std::vector<std::uint8_t>{7, 0, 9});
  const fmnist::idx_array a = fmnist::read_idx(tmp.path / "images.gz", 3);
  CHECK(a.dims == std::vector<std::size_t>{3, 28, 28});
}

TEST_CASE("fmnist idx: bad files raise bellows::error naming the file and the problem") {
  temp_dir tmp;
  const std::vector<std::uint8_t> pixels = three_images();
  const auto refused = [&](const std::string& name, const std::vector<std::uint8_t>& bytes, std::size_t dims,
                           const std::string& problem) {
    CAPTURE(name);
    const fs::path file = tmp.path / name;
    write_gzip(file, bytes);
    try {
      (void)fmnist::read_idx(file, dims);
      FAIL("no exception");
    } catch (const bellows::error& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(what.find(file.string()) != std::string::npos);
      CHECK(what.find(problem) != std::string::npos);
    }
  };
  std::vector<std::uint8_t> short_data = idx_bytes({3, 28, 28}, pixels);
  short_data.resize(short_data.size() - 100);
  refused("truncated_data.gz", short_data, 3,
          "truncated: the header promises 2352 bytes of data (3x28x28), the file holds 2252");
  refused("truncated_header.gz", {0, 0, 8, 3, 0, 0}, 3, "truncated: 6 bytes, the header of 3 dimensions needs 16");
  refused("tiny.gz", {0, 0}, 1, "truncated: 2 bytes");
  std::vector<std::uint8_t> magic = idx_bytes({3}, {1, 2, 3});
  magic[0] = 0x1f;
  magic[1] = 0x8b;
  refused("wrong_magic.gz", magic, 1, "wrong magic 0x1f8b0801");
  refused("wrong_type.gz", idx_bytes({3}, std::vector<std::uint8_t>(12), 0x0d), 1, "element type 0x0d, expected 0x08");
  refused("wrong_dims.gz", idx_bytes({3, 28, 28}, pixels), 1, "3 dimensions, expected 1");
  std::vector<std::uint8_t> trailing = idx_bytes({3}, {1, 2, 3});
  trailing.push_back(4);
  refused("trailing.gz", trailing, 1, "1 bytes after the 3 bytes of data the header promises (3)");

  // A gzip stream cut short.
  write_gzip(tmp.path / "whole.gz", idx_bytes({3, 28, 28}, pixels));
  std::ifstream in(tmp.path / "whole.gz", std::ios::binary);
  std::vector<char> gz((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  gz.resize(gz.size() / 2);
  const fs::path cut = tmp.path / "cut.gz";
  std::ofstream(cut, std::ios::binary).write(gz.data(), static_cast<std::streamsize>(gz.size()));
  CHECK_THROWS_WITH_AS((void)fmnist::read_idx(cut, 3), doctest::Contains("corrupt or truncated gzip stream"),
                       bellows::error);

  CHECK_THROWS_WITH_AS((void)fmnist::read_idx(tmp.path / "absent.gz", 1), doctest::Contains("cannot open"),
                       bellows::error);
}

TEST_CASE("fmnist idx: images and labels that do not belong together are refused") {
  temp_dir tmp;
  write_gzip(tmp.path / "images.gz", idx_bytes({3, 28, 28}, three_images()));
  write_gzip(tmp.path / "two_labels.gz", idx_bytes({2}, {1, 2}));
  write_gzip(tmp.path / "bad_label.gz", idx_bytes({3}, {1, 12, 2}));
  write_gzip(tmp.path / "small_images.gz", idx_bytes({1, 2, 2}, {1, 2, 3, 4}));
  write_gzip(tmp.path / "one_label.gz", idx_bytes({1}, {1}));
  CHECK_THROWS_WITH_AS((void)fmnist::read_split(tmp.path / "images.gz", tmp.path / "two_labels.gz"),
                       doctest::Contains("count mismatch"), bellows::error);
  CHECK_THROWS_WITH_AS((void)fmnist::read_split(tmp.path / "images.gz", tmp.path / "two_labels.gz"),
                       doctest::Contains("holds 3 images"), bellows::error);
  CHECK_THROWS_WITH_AS((void)fmnist::read_split(tmp.path / "images.gz", tmp.path / "bad_label.gz"),
                       doctest::Contains("label 12 of item 1 is not a class in 0..9"), bellows::error);
  CHECK_THROWS_WITH_AS((void)fmnist::read_split(tmp.path / "small_images.gz", tmp.path / "one_label.gz"),
                       doctest::Contains("images of 2x2 pixels, expected 28x28"), bellows::error);
}

TEST_CASE("fmnist idx: the data folder is the argument, else $BELLOWS_FMNIST_DIR, else the package's") {
  const char* saved = std::getenv(fmnist::dir_variable);
  const std::string restore = saved != nullptr ? saved : "";
  ::unsetenv(fmnist::dir_variable);
  CHECK(fmnist::data_dir() == fs::path(fmnist::package_dir));
  ::setenv(fmnist::dir_variable, "/somewhere/else", 1);
  CHECK(fmnist::data_dir() == fs::path("/somewhere/else"));
  CHECK(fmnist::data_dir("/chosen") == fs::path("/chosen"));
  if (saved != nullptr)
    ::setenv(fmnist::dir_variable, restore.c_str(), 1);
  else
    ::unsetenv(fmnist::dir_variable);
}
