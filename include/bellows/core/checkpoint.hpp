// SPDX-License-Identifier: Apache-2.0
// Checkpoint bytes: a writer and a validating reader for the state that a resumed run needs
// (error memories, PowerSGD queries, detector accumulators, counters), and an atomic file write.
//
// Values are written in the machine's (little-endian) byte order, each array prefixed by its
// element count, so a reader can check every count against the state it restores into.
#pragma once

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <concepts>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
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
    if (count != out.size()) fail<wire_error>("checkpoint: ", what, " has ", count, " elements, expected ", out.size());
    need(out.size_bytes(), what);
    if (!out.empty()) std::memcpy(static_cast<void*>(out.data()), in_.data() + pos_, out.size_bytes());
    pos_ += out.size_bytes();
  }

  /// get_array for float state that must be finite (error memories, queries): a NaN or Inf in
  /// the bytes raises bellows::wire_error naming `what` and the position, and `out` is then
  /// left as it was.
  void get_finite_array(std::span<float> out, std::string_view what) {
    const auto count = get<std::uint64_t>(what);
    if (count != out.size()) fail<wire_error>("checkpoint: ", what, " has ", count, " elements, expected ", out.size());
    need(out.size_bytes(), what);
    for (std::size_t i = 0; i < out.size(); ++i) {
      float v;
      std::memcpy(&v, in_.data() + pos_ + i * sizeof(float), sizeof(float));
      if (!std::isfinite(v))
        fail<wire_error>("checkpoint: ", what, " holds the non-finite value ", v, " at element ", i);
    }
    if (!out.empty()) std::memcpy(static_cast<void*>(out.data()), in_.data() + pos_, out.size_bytes());
    pos_ += out.size_bytes();
  }

  /// Reads a string of at most `max_length` characters.
  [[nodiscard]] std::string get_string(std::string_view what, std::size_t max_length = 4096) {
    const auto count = get<std::uint64_t>(what);
    if (count > max_length) fail<wire_error>("checkpoint: ", what, " of ", count, " characters exceeds ", max_length);
    need(count, what);
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), count);
    pos_ += count;
    return s;
  }

  /// Checks that nothing follows.
  void finish() const {
    if (pos_ != in_.size()) fail<wire_error>("checkpoint: ", in_.size() - pos_, " unexpected bytes at the end");
  }

private:
  void need(std::size_t bytes, std::string_view what) const {
    if (bytes > in_.size() - pos_)
      fail<wire_error>("checkpoint: truncated while reading ", what, " (", bytes, " bytes needed, ", in_.size() - pos_,
                       " left)");
  }

  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
};

/// Where a checkpoint belongs: a rank and the number of ranks (the world size). A checkpoint
/// records it and loads only at the same place, since an error memory is one rank's. Any
/// Collective converts to its own place, so `sync.save(dir, coll)` and `sync.save(dir, {r, w})`
/// say the same.
class rank_place {
public:
  constexpr rank_place(std::size_t rank, std::size_t world) : rank_(rank), world_(world) {
    if (world == 0 || rank >= world) fail("rank_place: rank ", rank, " of ", world, " ranks");
  }
  template <class Coll>
    requires requires(const Coll& c) {
      { c.rank() } -> std::convertible_to<std::size_t>;
      { c.size() } -> std::convertible_to<std::size_t>;
    }
  constexpr rank_place(const Coll& coll)  // NOLINT(google-explicit-constructor): a collective is its place
      : rank_place(coll.rank(), coll.size()) {}

  [[nodiscard]] constexpr std::size_t rank() const noexcept { return rank_; }
  [[nodiscard]] constexpr std::size_t size() const noexcept { return world_; }
  friend constexpr bool operator==(const rank_place&, const rank_place&) = default;

private:
  std::size_t rank_, world_;
};

namespace detail {

/// The moments of write_file_atomically, in order.
enum class atomic_write_stage : std::uint8_t {
  created,            ///< the temporary file exists, empty
  half_written,       ///< the first half of the bytes are in it
  written,            ///< all of them
  flushed,            ///< fsync'ed and closed
  renamed,            ///< it has replaced the destination
  directory_flushed,  ///< the directory too is flushed: the write is complete
};

/// For tests of crash safety: when set, write_file_atomically calls it at each stage it
/// reaches, so that a test can kill the writing process at a chosen moment. Null otherwise.
inline void (*atomic_write_probe)(atomic_write_stage) = nullptr;

}  // namespace detail

/// The temporary file beside `path` that a write_file_atomically call of process `pid` writes
/// as its `serial`-th temporary file: `<path>.tmp.<pid>.<serial>`. Each call has its own, so
/// writers of one path, in one process or several, never write into the same file.
[[nodiscard]] inline std::filesystem::path temporary_path(const std::filesystem::path& path, long pid,
                                                          std::uint64_t serial) {
  return detail::concat(path.string(), ".tmp.", pid, ".", serial);
}

namespace detail {
/// How many temporary files this process has named (the serial of temporary_path).
inline std::atomic<std::uint64_t> temporary_serial{0};
}  // namespace detail

/// Writes `bytes` to `path` so that a crash at any moment leaves either the old file or the new
/// one, complete, never a mix or a prefix: the bytes go to a temporary file of this call's own
/// beside `path` (temporary_path), which is flushed to disk (fsync), renamed over `path` (atomic
/// on POSIX file systems), and the directory is flushed so that the rename survives a power loss
/// too. Concurrent writers of one path (threads or processes) never share a temporary file: the
/// last rename wins, and the file is always one writer's bytes, complete. A process killed
/// before its rename leaves `path` as it was and possibly its temporary file, named with its
/// process id, which nothing reads. On failure, raises bellows::error naming the file and the
/// system's reason, removes the temporary file, and leaves `path` as it was (unless the failure
/// came after the rename, when only the directory's flush failed).
inline void write_file_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  // O_EXCL: a name that exists (a stale file of a killed writer whose process id came back, or
  // a link placed there) is never opened; the next serial is tried instead.
  std::filesystem::path tmp;
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    tmp = temporary_path(path, static_cast<long>(::getpid()), ++detail::temporary_serial);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && (errno != EEXIST || attempt == 15))
      fail("write_file_atomically: cannot create ", tmp, ": ", std::strerror(errno));
  }
  auto fail_after = [&](const char* doing, int err, int open_fd) {
    if (open_fd >= 0) ::close(open_fd);
    ::unlink(tmp.c_str());
    fail("write_file_atomically: ", doing, " ", tmp, " failed: ", std::strerror(err));
  };
  auto reached = [](detail::atomic_write_stage stage) {
    if (detail::atomic_write_probe != nullptr) detail::atomic_write_probe(stage);
  };
  reached(detail::atomic_write_stage::created);
  std::size_t done = 0;
  for (const auto stage : {detail::atomic_write_stage::half_written, detail::atomic_write_stage::written}) {
    const std::size_t until = stage == detail::atomic_write_stage::written ? bytes.size() : bytes.size() / 2;
    while (done < until) {
      const ssize_t n = ::write(fd, bytes.data() + done, until - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail_after("writing", errno, fd);
      }
      done += static_cast<std::size_t>(n);
    }
    reached(stage);
  }
  if (::fsync(fd) != 0) fail_after("flushing", errno, fd);
  if (::close(fd) != 0) fail_after("closing", errno, -1);
  reached(detail::atomic_write_stage::flushed);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail("write_file_atomically: renaming ", tmp, " to ", path, " failed: ", std::strerror(err));
  }
  reached(detail::atomic_write_stage::renamed);
  // Flush the directory entry. A directory that cannot be opened for reading, or a file system
  // that cannot flush one (EINVAL), leaves the rename as durable as the system makes it.
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    const int rc = ::fsync(dfd);
    const int err = errno;
    ::close(dfd);
    if (rc != 0 && err != EINVAL)
      fail("write_file_atomically: ", path, " was replaced, but flushing its directory failed: ", std::strerror(err));
  }
  reached(detail::atomic_write_stage::directory_flushed);
}

/// The whole content of a regular file; bellows::error naming the path and the reason if it is
/// missing, not a regular file (a directory, a device) or cannot be read in full.
[[nodiscard]] inline std::vector<std::byte> read_file(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("read_file: cannot open ", path, ": ", std::strerror(errno));
  struct fd_closer {
    int fd;
    ~fd_closer() { ::close(fd); }
  } closer{fd};
  struct stat info {};
  if (::fstat(fd, &info) != 0) fail("read_file: cannot inspect ", path, ": ", std::strerror(errno));
  if (!S_ISREG(info.st_mode)) fail("read_file: ", path, " is not a regular file");
  std::vector<std::byte> bytes(static_cast<std::size_t>(info.st_size));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("read_file: reading ", path, " failed: ", std::strerror(errno));
    }
    if (n == 0)
      fail("read_file: ", path, " ended after ", done, " of its ", bytes.size(),
           " bytes (it changed while being read)");
    done += static_cast<std::size_t>(n);
  }
  return bytes;
}

}  // namespace bellows
