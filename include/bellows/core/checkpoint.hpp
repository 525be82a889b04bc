// SPDX-License-Identifier: Apache-2.0
// Checkpoint bytes: a writer and a validating reader for the state that a resumed run needs
// (error memories, PowerSGD queries, detector accumulators, counters), and an atomic file write.
//
// Values are written in the machine's (little-endian) byte order, each array prefixed by its
// element count, so a reader can check every count against the state it restores into.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "bellows/core/config.hpp"
#include "bellows/core/error.hpp"

namespace bellows {

/// Appends values to a byte vector.
class checkpoint_writer {
public:
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void put(const T& value) {
    const auto* p = reinterpret_cast<const std::byte*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }

  /// The element count (uint64), then the elements.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void put_array(std::span<const T> values) {
    put<std::uint64_t>(values.size());
    const auto* p = reinterpret_cast<const std::byte*>(values.data());
    bytes_.insert(bytes_.end(), p, p + values.size_bytes());
  }

  void put_string(std::string_view s) { put_array(std::span<const char>(s.data(), s.size())); }

  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return bytes_; }

private:
  std::vector<std::byte> bytes_;
};

/// Reads what a checkpoint_writer wrote, checking every size; any mismatch raises
/// bellows::wire_error naming `what` and the value, before the destination is touched.
class checkpoint_reader {
public:
  explicit checkpoint_reader(std::span<const std::byte> in) : in_(in) {}

  template <class T>
    requires std::is_trivially_copyable_v<T>
  [[nodiscard]] T get(std::string_view what) {
    need(sizeof(T), what);
    T value;
    std::memcpy(static_cast<void*>(&value), in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  /// Reads an array that must have exactly out.size() elements.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void get_array(std::span<T> out, std::string_view what) {
    const auto count = get<std::uint64_t>(what);
    if (count != out.size())
      detail::fail<wire_error>("checkpoint: ", what, " has ", count, " elements, expected ", out.size());
    need(out.size_bytes(), what);
    std::memcpy(static_cast<void*>(out.data()), in_.data() + pos_, out.size_bytes());
    pos_ += out.size_bytes();
  }

  /// Reads a string of at most `max_length` characters.
  [[nodiscard]] std::string get_string(std::string_view what, std::size_t max_length = 4096) {
    const auto count = get<std::uint64_t>(what);
    if (count > max_length)
      detail::fail<wire_error>("checkpoint: ", what, " of ", count, " characters exceeds ", max_length);
    need(count, what);
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), count);
    pos_ += count;
    return s;
  }

  /// Checks that nothing follows.
  void finish() const {
    if (pos_ != in_.size())
      detail::fail<wire_error>("checkpoint: ", in_.size() - pos_, " unexpected bytes at the end");
  }

private:
  void need(std::size_t bytes, std::string_view what) const {
    if (bytes > in_.size() - pos_)
      detail::fail<wire_error>("checkpoint: truncated while reading ", what, " (", bytes,
                               " bytes needed, ", in_.size() - pos_, " left)");
  }

  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
};

/// Writes `bytes` to `path` so that a crash at any moment leaves either the old file or the new
/// one, never a mix: a temporary file beside it, fsync, rename, fsync of the directory.
inline void write_file_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) detail::fail("write_file_atomically: cannot create ", tmp, ": ", std::strerror(errno));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      detail::fail("write_file_atomically: writing ", tmp, " failed: ", std::strerror(err));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0)
    detail::fail("write_file_atomically: flushing ", tmp, " failed: ", std::strerror(errno));
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) detail::fail("write_file_atomically: renaming ", tmp, " to ", path, " failed: ", ec.message());
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

/// The whole content of a file; bellows::error naming the path if it cannot be read.
[[nodiscard]] inline std::vector<std::byte> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) detail::fail("read_file: cannot open ", path);
  const auto size = static_cast<std::size_t>(in.tellg());
  std::vector<std::byte> bytes(size);
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size)))
    detail::fail("read_file: reading ", path, " failed");
  return bytes;
}

}  // namespace bellows
