// SPDX-License-Identifier: Apache-2.0
#include <bellows/core/checkpoint.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <limits>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

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
    CHECK_THROWS_WITH_AS(r.get_array(std::span<float>(out), "memory"),
                         doctest::Contains("truncated while reading memory"), bellows::wire_error);
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

TEST_CASE("checkpoint: float state that must be finite refuses NaN and Inf before it is written") {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    CAPTURE(bad);
    bellows::checkpoint_writer w;
    const std::vector<float> e{1.0f, bad, 3.0f};
    w.put_array(std::span<const float>(e));
    bellows::checkpoint_reader r(w.bytes());
    std::vector<float> out(3, 7.0f);
    CHECK_THROWS_WITH_AS(r.get_finite_array(std::span<float>(out), "error memory"),
                         doctest::Contains("error memory holds the non-finite value"), bellows::wire_error);
    CHECK(out == std::vector<float>(3, 7.0f));
  }
  bellows::checkpoint_writer w;
  const std::vector<float> e{1.0f, -2.0f, std::numeric_limits<float>::max()};
  w.put_array(std::span<const float>(e));
  bellows::checkpoint_reader r(w.bytes());
  std::vector<float> out(3);
  r.get_finite_array(std::span<float>(out), "error memory");
  CHECK(out == e);
  r.finish();
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
  for (const auto& entry : std::filesystem::directory_iterator(dir)) CHECK(entry.path() == file);
  CHECK_THROWS_WITH_AS((void)bellows::read_file(dir / "missing.bin"), doctest::Contains("missing.bin"), bellows::error);
  CHECK_THROWS_AS(bellows::write_file_atomically(dir / "no" / "such" / "dir", first), bellows::error);
  std::filesystem::remove_all(dir);
}

namespace {

namespace fs = std::filesystem;
using bellows::detail::atomic_write_stage;

constexpr std::uint32_t generation_magic = 0x4E454754u;  // "TGEN"

/// A checkpoint of n floats that names its generation in its first and last fields and in every
/// value, so that a mix of two generations, or a prefix of one, cannot read as complete.
std::vector<std::byte> generation_bytes(std::uint64_t generation, std::size_t n) {
  bellows::checkpoint_writer w;
  w.put(generation_magic);
  w.put(generation);
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = static_cast<float>(generation * 100000 + i % 65536);
  w.put_array(std::span<const float>(values));
  w.put(generation);
  return {w.bytes().begin(), w.bytes().end()};
}

/// The generation of a complete checkpoint of n floats, read with the checkpoint reader;
/// wire_error for anything else.
std::uint64_t generation_of(std::span<const std::byte> bytes, std::size_t n) {
  bellows::checkpoint_reader r(bytes);
  if (r.get<std::uint32_t>("magic") != generation_magic) throw bellows::wire_error("bad magic");
  const auto generation = r.get<std::uint64_t>("generation");
  std::vector<float> values(n);
  r.get_array(std::span<float>(values), "values");
  for (std::size_t i = 0; i < n; ++i)
    if (values[i] != static_cast<float>(generation * 100000 + i % 65536))
      throw bellows::wire_error("a value of another generation");
  if (r.get<std::uint64_t>("trailer") != generation) throw bellows::wire_error("trailer of another generation");
  r.finish();
  return generation;
}

std::uint64_t generation_in(const fs::path& file, std::size_t n) { return generation_of(bellows::read_file(file), n); }

atomic_write_stage kill_at = atomic_write_stage::created;

/// Runs write_file_atomically(file, bytes) in a forked child that SIGKILLs itself at `kill_at`
/// (when `probe`), or that the parent SIGKILLs after `delay`; returns the child's wait status.
int write_in_child(const fs::path& file, std::span<const std::byte> bytes, bool probe,
                   std::chrono::microseconds delay = {}) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (probe)
      bellows::detail::atomic_write_probe = [](atomic_write_stage stage) {
        if (stage == kill_at) ::raise(SIGKILL);
      };
    try {
      bellows::write_file_atomically(file, bytes);
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  if (!probe) {
    std::this_thread::sleep_for(delay);
    ::kill(pid, SIGKILL);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

bool killed(int status) { return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL; }

/// The temporary files beside `file` (`<file>.tmp.<pid>.<serial>`), sorted.
std::vector<fs::path> temporaries(const fs::path& file) {
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(file.parent_path()))
    if (entry.path().filename().string().starts_with(file.filename().string() + ".tmp.")) found.push_back(entry.path());
  std::sort(found.begin(), found.end());
  return found;
}

void remove_all(const std::vector<fs::path>& paths) {
  for (const fs::path& p : paths) fs::remove(p);
}

struct scratch_dir {
  fs::path path;
  explicit scratch_dir(const char* name) : path(fs::temp_directory_path() / name) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_dir() { fs::remove_all(path); }
};

}  // namespace

TEST_CASE("checkpoint files: a writer killed at every stage leaves the old or the new file, complete") {
  const scratch_dir dir("bellows_checkpoint_stages");
  const fs::path file = dir.path / "state.ckpt";
  constexpr std::size_t n = std::size_t{1} << 20;  // a 4 MiB checkpoint
  const auto old_bytes = generation_bytes(1, n), new_bytes = generation_bytes(2, n);
  for (const atomic_write_stage stage :
       {atomic_write_stage::created, atomic_write_stage::half_written, atomic_write_stage::written,
        atomic_write_stage::flushed, atomic_write_stage::renamed, atomic_write_stage::directory_flushed}) {
    CAPTURE(static_cast<int>(stage));
    bellows::write_file_atomically(file, old_bytes);
    REQUIRE(temporaries(file).empty());
    kill_at = stage;
    CHECK(killed(write_in_child(file, new_bytes, true)));
    const bool replaced = stage >= atomic_write_stage::renamed;
    // The file holds one generation, complete: the old one until the rename, the new one after.
    CHECK(generation_in(file, n) == (replaced ? 2u : 1u));
    // Before the rename the writer's temporary file is left, incomplete until fully written; a
    // reader of the checkpoint never opens it.
    const std::vector<fs::path> left = temporaries(file);
    CHECK(left.size() == (replaced ? 0u : 1u));
    if (!left.empty() && stage < atomic_write_stage::written)
      CHECK_THROWS_AS((void)generation_in(left[0], n), bellows::wire_error);
    // The next write goes through beside it, and leaves no file of its own.
    bellows::write_file_atomically(file, generation_bytes(3, n));
    CHECK(generation_in(file, n) == 3);
    CHECK(temporaries(file) == left);
    remove_all(left);
  }
  // Without a kill, every stage is reached in order.
  static std::vector<atomic_write_stage> seen;
  bellows::detail::atomic_write_probe = [](atomic_write_stage s) { seen.push_back(s); };
  bellows::write_file_atomically(file, old_bytes);
  bellows::detail::atomic_write_probe = nullptr;
  CHECK(seen == std::vector{atomic_write_stage::created, atomic_write_stage::half_written, atomic_write_stage::written,
                            atomic_write_stage::flushed, atomic_write_stage::renamed,
                            atomic_write_stage::directory_flushed});
}

TEST_CASE("checkpoint files: a writer SIGKILLed after varied delays leaves the old or the new file, complete") {
  const scratch_dir dir("bellows_checkpoint_kills");
  const fs::path file = dir.path / "state.ckpt";
  constexpr std::size_t n = std::size_t{1} << 22;  // a 16 MiB checkpoint
  const auto old_bytes = generation_bytes(1, n), new_bytes = generation_bytes(2, n);
  // How long one write takes here, so that the kills spread over all of it (and a little after).
  const auto t0 = std::chrono::steady_clock::now();
  bellows::write_file_atomically(dir.path / "timing.ckpt", new_bytes);
  const auto took = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);
  int kills = 0, old_kept = 0, new_in_place = 0;
  constexpr int trials = 16;
  for (int t = 0; t < trials; ++t) {
    CAPTURE(t);
    bellows::write_file_atomically(file, old_bytes);
    const auto delay = took * t / (trials - 4);
    const int status = write_in_child(file, new_bytes, false, delay);
    const std::uint64_t generation = generation_in(file, n);  // throws unless complete
    CHECK((generation == 1 || generation == 2));
    if (killed(status))
      ++kills;
    else
      CHECK(generation == 2);  // a child that finished wrote the new file
    ++(generation == 1 ? old_kept : new_in_place);
    // The killed writer's temporary file may remain; the next write goes through beside it.
    const std::vector<fs::path> left = temporaries(file);
    CHECK(left.size() <= 1);
    bellows::write_file_atomically(file, generation_bytes(3, n));
    CHECK(generation_in(file, n) == 3);
    CHECK(temporaries(file) == left);
    remove_all(left);
  }
  MESSAGE("one write ", took.count(), " us; ", kills, " of ", trials, " writers killed; old file kept ", old_kept,
          " times, new file in place ", new_in_place, " times");
  CHECK(kills > 0);
}

TEST_CASE("checkpoint files: failures leave the old file and no temporary file; only regular files are read") {
  const scratch_dir dir("bellows_checkpoint_failures");
  const fs::path file = dir.path / "state.ckpt";
  const std::vector<std::byte> old_bytes(64, std::byte{7});
  bellows::write_file_atomically(file, old_bytes);
  // The temporary file the next write would name, from its process id and serial.
  auto next_temporary = [&](std::uint64_t ahead) {
    return bellows::temporary_path(file, static_cast<long>(::getpid()), bellows::detail::temporary_serial + ahead);
  };
  // A file in that place (a writer's of the same process id, killed before its rename) is left
  // alone: the write takes the next name.
  const std::vector<std::byte> stale_bytes(1000, std::byte{9});
  const scratch_dir elsewhere("bellows_checkpoint_failures_stale");
  bellows::write_file_atomically(elsewhere.path / "stale", stale_bytes);  // (takes a serial)
  const fs::path stale = next_temporary(1);
  fs::rename(elsewhere.path / "stale", stale);
  const std::vector<std::byte> new_bytes(32, std::byte{8});
  bellows::write_file_atomically(file, new_bytes);
  CHECK(bellows::read_file(file) == new_bytes);
  CHECK(bellows::read_file(stale) == stale_bytes);
  CHECK(temporaries(file) == std::vector{stale});
  fs::remove(stale);
  // A link in the temporary file's place is not followed either; with links in the next 16
  // places the write gives up, naming the last.
  const fs::path victim = dir.path / "victim";
  bellows::write_file_atomically(victim, old_bytes);
  fs::create_symlink(victim, next_temporary(1));
  bellows::write_file_atomically(file, old_bytes);
  CHECK(bellows::read_file(victim) == old_bytes);
  CHECK(bellows::read_file(file) == old_bytes);
  remove_all(temporaries(file));
  for (std::uint64_t ahead = 1; ahead <= 16; ++ahead) fs::create_symlink(victim, next_temporary(ahead));
  CHECK_THROWS_WITH_AS(bellows::write_file_atomically(file, new_bytes), doctest::Contains("cannot create"),
                       bellows::error);
  CHECK(bellows::read_file(victim) == old_bytes);
  CHECK(bellows::read_file(file) == old_bytes);
  remove_all(temporaries(file));
  // A destination that cannot be replaced (a directory): the rename fails, nothing is left.
  const fs::path sub = dir.path / "sub";
  fs::create_directories(sub / "inner");
  CHECK_THROWS_WITH_AS(bellows::write_file_atomically(sub, new_bytes), doctest::Contains("renaming"), bellows::error);
  CHECK(fs::is_directory(sub / "inner"));
  CHECK(temporaries(sub).empty());
  // Reading a directory names it instead of allocating its "size".
  CHECK_THROWS_WITH_AS((void)bellows::read_file(dir.path), doctest::Contains("not a regular file"), bellows::error);
  CHECK_THROWS_WITH_AS((void)bellows::read_file(dir.path / "missing"), doctest::Contains("No such file"),
                       bellows::error);
}

TEST_CASE("checkpoint files: writers of one path at once, threads and processes, leave one writer's file, complete") {
  const scratch_dir dir("bellows_checkpoint_concurrent");
  const fs::path file = dir.path / "state.ckpt";
  constexpr std::size_t n = 1 << 14;  // 64 KiB
  constexpr std::uint64_t writers = 6, rounds = 20;
  std::vector<std::vector<std::byte>> bytes;
  for (std::uint64_t g = 1; g <= 2 * writers; ++g) bytes.push_back(generation_bytes(g, n));
  bellows::write_file_atomically(file, bytes[0]);
  // Threads of this process, and a reader that checks every file it sees while they write.
  std::atomic<bool> writing{true};
  std::atomic<int> reads{0}, incomplete{0}, failed{0};
  std::thread reader([&] {
    while (writing) {
      try {
        const std::uint64_t g = generation_in(file, n);
        if (g < 1 || g > writers) ++incomplete;
      } catch (const bellows::error&) {
        ++incomplete;
      }
      ++reads;
    }
  });
  std::vector<std::thread> threads;
  for (std::uint64_t w = 0; w < writers; ++w)
    threads.emplace_back([&, w] {
      for (std::uint64_t r = 0; r < rounds; ++r) {
        try {
          bellows::write_file_atomically(file, bytes[w]);
        } catch (const bellows::error&) {
          ++failed;
        }
      }
    });
  for (std::thread& t : threads) t.join();
  writing = false;
  reader.join();
  CHECK(failed == 0);
  CHECK(incomplete == 0);
  CHECK(reads > 0);
  const std::uint64_t by_thread = generation_in(file, n);
  CHECK((by_thread >= 1 && by_thread <= writers));
  CHECK(temporaries(file).empty());
  // Processes: each forked writer has its own process id, so its own temporary files.
  std::vector<pid_t> children;
  for (std::uint64_t w = 0; w < writers; ++w) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      try {
        for (std::uint64_t r = 0; r < rounds; ++r) bellows::write_file_atomically(file, bytes[writers + w]);
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(0);
    }
    children.push_back(pid);
  }
  for (const pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
  const std::uint64_t by_process = generation_in(file, n);
  CHECK((by_process > writers && by_process <= 2 * writers));
  CHECK(temporaries(file).empty());
}
