// SPDX-License-Identifier: Apache-2.0
#include <bellows/core/wire.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace wire = bellows::wire;

namespace {

// Codecs of the test's own payloads (a compressor declares its own in its method descriptor).
constexpr wire::codec sparse_codec{1, "sparse"}, dense_codec{0, "dense"}, other_codec{3, "other"};

// 8-byte aligned storage, as gather_buffer and std::vector<std::uint64_t> give.
struct storage {
  std::vector<std::uint64_t> words;
  explicit storage(std::size_t bytes) : words((bytes + 7) / 8) {}
  std::span<std::byte> bytes() { return std::as_writable_bytes(std::span(words)); }
};

// A payload of 3 uint32 indices then 3 floats, the shape of a sparse codec's.
std::span<std::byte> write_sparse(storage& s) {
  wire::header h{};
  h.codec = sparse_codec.id;
  h.n = 100;
  h.count = 3;
  wire::writer w(s.bytes(), h);
  auto idx = w.array<std::uint32_t>(3);
  idx[0] = 4, idx[1] = 50, idx[2] = 99;
  auto val = w.array<float>(3);
  val[0] = 1.5f, val[1] = -2.0f, val[2] = 0.25f;
  return w.finish();
}

}  // namespace

TEST_CASE("wire: a payload round-trips and is padded to 8 bytes") {
  storage s(256);
  const auto payload = write_sparse(s);
  CHECK(payload.size() == wire::header_bytes + 24);  // 12 + 12 bytes, already a multiple of 8
  wire::reader r(payload, sparse_codec);
  CHECK(r.head().n == 100);
  CHECK(r.head().count == 3);
  CHECK(r.head().body_bytes == 24);
  const auto idx = r.array<std::uint32_t>(3);
  const auto val = r.array<float>(3);
  r.finish();
  CHECK(idx[1] == 50);
  CHECK(val[2] == 0.25f);

  // An odd-sized body is padded with zeros, and the reader accepts exactly that padding.
  storage t(256);
  wire::writer w(t.bytes(), wire::header{});
  w.array<std::uint8_t>(3)[0] = std::uint8_t{7};
  const auto odd = w.finish();
  CHECK(odd.size() == wire::header_bytes + 8);
  wire::reader ro(odd, dense_codec);
  CHECK(ro.array<std::uint8_t>(3)[0] == 7);
  ro.finish();
  CHECK(wire::padded(wire::array_end<double>(3, 2)) == 24);
}

TEST_CASE("wire: every malformed header is refused with a message naming the field") {
  storage s(256);
  const auto good = write_sparse(s);
  auto corrupt = [&](std::size_t offset, std::byte value) {
    std::vector<std::uint64_t> copy(s.words);
    std::span<std::byte> b = std::as_writable_bytes(std::span(copy)).first(good.size());
    b[offset] = value;
    return copy;
  };
  auto expect_error = [&](std::vector<std::uint64_t> words, std::size_t size, const char* needle,
                          wire::codec codec = sparse_codec) {
    const auto b = std::as_bytes(std::span(words)).first(size);
    CHECK_THROWS_WITH_AS(wire::reader(b, codec), doctest::Contains(needle), bellows::wire_error);
  };
  expect_error(corrupt(0, std::byte{0}), good.size(), "magic");
  expect_error(corrupt(4, std::byte{2}), good.size(), "version");
  expect_error(corrupt(7, std::byte{0x80}), good.size(), "flag");
  expect_error(corrupt(28, std::byte{1}), good.size(), "reserved");
  expect_error(s.words, good.size(), "codec", other_codec);
  expect_error(s.words, good.size() - 8, "body bytes");
  expect_error(s.words, 10, "shorter than");
  // A header that claims an unpadded body.
  auto unpadded = s.words;
  wire::header h;
  std::memcpy(static_cast<void*>(&h), unpadded.data(), sizeof h);
  h.body_bytes = 20;
  std::memcpy(unpadded.data(), &h, sizeof h);
  expect_error(unpadded, wire::header_bytes + 20, "padded");
}

TEST_CASE("wire: arrays that overrun the body, trailing bytes and dirty padding are refused") {
  storage s(256);
  const auto good = write_sparse(s);
  {
    wire::reader r(good, sparse_codec);
    (void)r.array<std::uint32_t>(3);
    CHECK_THROWS_WITH_AS((void)r.array<float>(4), doctest::Contains("overruns"), bellows::wire_error);
  }
  {
    wire::reader r(good, sparse_codec);
    CHECK_THROWS_AS((void)r.array<std::uint64_t>(std::uint64_t{1} << 62), bellows::wire_error);
  }
  {
    wire::reader r(good, sparse_codec);
    (void)r.array<std::uint32_t>(3);
    CHECK_THROWS_WITH_AS(r.finish(), doctest::Contains("follow"), bellows::wire_error);
  }
  {
    storage t(256);
    wire::writer w(t.bytes(), wire::header{});
    (void)w.array<std::uint8_t>(3);
    const auto odd = w.finish();
    t.bytes()[wire::header_bytes + 5] = std::byte{1};
    wire::reader r(odd, dense_codec);
    (void)r.array<std::uint8_t>(3);
    CHECK_THROWS_WITH_AS(r.finish(), doctest::Contains("padding"), bellows::wire_error);
  }
  {
    storage t(256);
    const auto p = write_sparse(t);
    std::vector<std::byte> shifted(p.size() + 1);
    std::memcpy(shifted.data() + 1, p.data(), p.size());
    CHECK_THROWS_WITH_AS(wire::reader(std::span(shifted).subspan(1), sparse_codec), doctest::Contains("multiple of 8"),
                         bellows::wire_error);
  }
}

TEST_CASE("wire: the writer refuses storage that cannot hold the payload") {
  storage small(wire::header_bytes + 8);
  wire::writer w(small.bytes(), wire::header{});
  CHECK_THROWS_AS((void)w.array<float>(3), bellows::error);
  std::vector<std::uint64_t> tiny(2);
  CHECK_THROWS_AS(wire::writer(std::as_writable_bytes(std::span(tiny)), wire::header{}), bellows::error);
}

TEST_CASE("wire: size arithmetic is checked; counts whose byte size wraps are refused, not trusted") {
  constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
  CHECK(wire::array_end<float>(5, 3) == 8 + 12);
  CHECK(wire::array_end<std::uint64_t>(4, 2) == 8 + 16);
  CHECK(wire::padded(17) == 24);
  CHECK(wire::payload_bytes(17) == wire::header_bytes + 24);
  // 2^62 floats are 2^64 bytes: the product wraps to 0.
  CHECK_THROWS_WITH_AS((void)wire::array_end<float>(0, std::size_t{1} << 62), doctest::Contains("overflows"),
                       bellows::error);
  CHECK_THROWS_WITH_AS((void)wire::array_end<std::uint64_t>(0, max / 8 + 1), doctest::Contains("overflows"),
                       bellows::error);
  CHECK_THROWS_AS((void)wire::array_end<std::uint64_t>(max - 3, 0), bellows::error);  // aligning the start
  CHECK_THROWS_AS((void)wire::array_end<float>(max - 7, 2), bellows::error);          // start + bytes
  CHECK_THROWS_AS((void)wire::padded(max - 3), bellows::error);
  CHECK_THROWS_AS((void)wire::payload_bytes(max - wire::header_bytes), bellows::error);
  CHECK(wire::array_end<float>(0, max / 4) == max / 4 * 4);  // the largest that fits
  // The writer: an array of 2^62 floats wrapped to 0 bytes once and passed the storage check.
  storage s(256);
  wire::writer w(s.bytes(), wire::header{});
  CHECK_THROWS_WITH_AS((void)w.array<float>(std::size_t{1} << 62), doctest::Contains("overruns"), bellows::error);
  CHECK_THROWS_AS((void)w.array<std::uint64_t>(max / 8 + 2), bellows::error);
  CHECK(w.array<float>(3).size() == 3);  // refused arrays took nothing
  CHECK(w.finish().size() == wire::header_bytes + 16);
  // The reader: a count of 2^61 uint64 (2^64 bytes) is refused by division, never multiplied.
  const auto good = write_sparse(s);
  wire::reader r(good, sparse_codec);
  CHECK_THROWS_WITH_AS((void)r.array<std::uint64_t>(std::uint64_t{1} << 61), doctest::Contains("overruns"),
                       bellows::wire_error);
  CHECK_THROWS_AS((void)r.array<float>(max), bellows::wire_error);
}
