// SPDX-License-Identifier: Apache-2.0
// Fashion-MNIST from the IDX files that Debian's dataset-fashion-mnist package installs
// (gzip-compressed; uncompressed files are read too). Every file is validated completely (magic,
// element type, dimension count, sizes against the bytes actually present) before use; a bad
// one raises bellows::error naming the file and the problem.
//
// IDX layout: two zero bytes, an element-type byte (0x08: unsigned byte), a dimension-count
// byte, one big-endian uint32 per dimension, then the elements, row-major.
#pragma once

#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <bellows/core/error.hpp>

namespace fmnist {

/// Where Debian's dataset-fashion-mnist package puts the four files (`dpkg -L dataset-fashion-mnist`).
inline constexpr const char* package_dir = "/usr/share/datasets/fashion-mnist";
/// Environment variable naming another folder that holds the four files.
inline constexpr const char* dir_variable = "BELLOWS_FMNIST_DIR";

inline constexpr std::size_t image_rows = 28;
inline constexpr std::size_t image_cols = 28;
inline constexpr std::size_t image_size = image_rows * image_cols;
inline constexpr std::size_t classes = 10;

/// The folder to read: `chosen` when not empty, else $BELLOWS_FMNIST_DIR when set, else the
/// package's folder.
[[nodiscard]] inline std::filesystem::path data_dir(const std::filesystem::path& chosen = {}) {
  if (!chosen.empty()) return chosen;
  if (const char* env = std::getenv(dir_variable); env != nullptr && *env != '\0') return env;
  return package_dir;
}

/// The contents of an IDX file of unsigned bytes.
struct idx_array {
  std::vector<std::size_t> dims;
  std::vector<std::uint8_t> data;  ///< row-major, the product of dims elements
};

namespace detail {

/// Raises bellows::error for a problem with `file`.
template <class... Parts>
[[noreturn]] void fail_in(const std::filesystem::path& file, const Parts&... parts) {
  bellows::fail("fmnist: ", file, ": ", parts...);
}

/// "0x" and the bytes in hex.
[[nodiscard]] inline std::string hex(const std::uint8_t* bytes, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s = "0x";
  for (std::size_t i = 0; i < n; ++i) {
    s += digits[bytes[i] >> 4];
    s += digits[bytes[i] & 15];
  }
  return s;
}

/// The whole decompressed contents of a gzip file (or of a plain file, which zlib passes through).
[[nodiscard]] inline std::vector<std::uint8_t> read_gzip(const std::filesystem::path& file) {
  const std::unique_ptr<gzFile_s, int (*)(gzFile)> in(gzopen(file.c_str(), "rb"), gzclose);
  if (!in)
    bellows::fail("fmnist: cannot open ", file,
                  " (install Debian's dataset-fashion-mnist "
                  "package, or name a folder of the IDX files with --data or $",
                  dir_variable, ")");
  std::vector<std::uint8_t> bytes;
  constexpr std::size_t chunk = std::size_t{1} << 20;
  for (;;) {
    const std::size_t at = bytes.size();
    bytes.resize(at + chunk);
    const int got = gzread(in.get(), bytes.data() + at, static_cast<unsigned>(chunk));
    int code = Z_OK;
    const char* message = gzerror(in.get(), &code);
    if (got < 0 || (code != Z_OK && code != Z_STREAM_END))
      fail_in(file, "corrupt or truncated gzip stream (", message, ")");
    bytes.resize(at + static_cast<std::size_t>(got));
    if (static_cast<std::size_t>(got) < chunk) return bytes;
  }
}

}  // namespace detail

/// Parses the decompressed bytes of an IDX file of unsigned bytes that must have `dims`
/// dimensions; `file` names the source in error messages.
[[nodiscard]] inline idx_array parse_idx(std::span<const std::uint8_t> bytes, std::size_t dims,
                                         const std::filesystem::path& file) {
  using detail::fail_in;
  if (bytes.size() < 4) fail_in(file, "truncated: ", bytes.size(), " bytes, an IDX header has at least 4");
  if (bytes[0] != 0 || bytes[1] != 0)
    fail_in(file, "wrong magic ", detail::hex(bytes.data(), 4), " (an IDX file starts with two zero bytes)");
  if (bytes[2] != 0x08)
    fail_in(file, "element type ", detail::hex(bytes.data() + 2, 1), ", expected 0x08 (unsigned byte)");
  if (bytes[3] != dims) fail_in(file, static_cast<int>(bytes[3]), " dimensions, expected ", dims);
  const std::size_t header = 4 + 4 * dims;
  if (bytes.size() < header)
    fail_in(file, "truncated: ", bytes.size(), " bytes, the header of ", dims, " dimensions needs ", header);
  idx_array out;
  std::size_t count = 1;
  std::string shape;
  for (std::size_t d = 0; d < dims; ++d) {
    const std::uint8_t* p = bytes.data() + 4 + 4 * d;
    const std::size_t n = std::size_t{p[0]} << 24 | std::size_t{p[1]} << 16 | std::size_t{p[2]} << 8 | p[3];
    if (n != 0 && count > std::numeric_limits<std::size_t>::max() / n) fail_in(file, "dimensions overflow");
    count *= n;
    out.dims.push_back(n);
    if (d > 0) shape += 'x';
    shape += std::to_string(n);
  }
  const std::size_t present = bytes.size() - header;
  if (present < count)
    fail_in(file, "truncated: the header promises ", count, " bytes of data (", shape, "), the file holds ", present);
  if (present > count)
    fail_in(file, present - count, " bytes after the ", count, " bytes of data the header promises (", shape, ")");
  out.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return out;
}

/// Reads an IDX file (gzip or plain) of unsigned bytes that must have `dims` dimensions.
[[nodiscard]] inline idx_array read_idx(const std::filesystem::path& file, std::size_t dims) {
  return parse_idx(detail::read_gzip(file), dims, file);
}

/// Images and labels of one split: `images` holds count x 784 pixels, row-major.
struct split {
  std::size_t count = 0;
  std::vector<std::uint8_t> images;
  std::vector<std::uint8_t> labels;
};

/// Reads an images file (count x 28 x 28) and a labels file (count, values 0..9) that belong together.
[[nodiscard]] inline split read_split(const std::filesystem::path& images_file,
                                      const std::filesystem::path& labels_file) {
  idx_array images = read_idx(images_file, 3);
  idx_array labels = read_idx(labels_file, 1);
  if (images.dims[1] != image_rows || images.dims[2] != image_cols)
    detail::fail_in(images_file, "images of ", images.dims[1], "x", images.dims[2], " pixels, expected ", image_rows,
                    "x", image_cols);
  if (images.dims[0] != labels.dims[0])
    bellows::fail("fmnist: count mismatch: ", images_file, " holds ", images.dims[0], " images, ", labels_file,
                  " holds ", labels.dims[0], " labels");
  for (std::size_t i = 0; i < labels.data.size(); ++i)
    if (labels.data[i] >= classes)
      detail::fail_in(labels_file, "label ", static_cast<int>(labels.data[i]), " of item ", i, " is not a class in 0..",
                      classes - 1);
  return {images.dims[0], std::move(images.data), std::move(labels.data)};
}

struct dataset {
  split train;
  split test;
};

/// Reads the four files of Fashion-MNIST from `dir` (see data_dir).
[[nodiscard]] inline dataset load(const std::filesystem::path& dir) {
  return {read_split(dir / "train-images-idx3-ubyte.gz", dir / "train-labels-idx1-ubyte.gz"),
          read_split(dir / "t10k-images-idx3-ubyte.gz", dir / "t10k-labels-idx1-ubyte.gz")};
}

}  // namespace fmnist
