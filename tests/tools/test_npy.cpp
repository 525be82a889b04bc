// SPDX-License-Identifier: Apache-2.0
#include "bellows-bench/npy.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "../support/random.hpp"

namespace npy = bellows::tool::npy;

namespace {

const std::filesystem::path corpus = BELLOWS_NPY_CORPUS;

/// The message of the format_error that parsing `bytes` raises ("" if it raises none).
std::string refusal(std::span<const std::byte> bytes) {
  try {
    (void)npy::parse(bytes, "t.npy");
  } catch (const npy::format_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("npy: files written by NumPy 1.24 (versions 1.0, 2.0, 3.0) read back exactly") {
  const npy::array f4 = npy::read(corpus / "valid_f4_2x3.npy");
  CHECK(f4.shape == bellows::shape{2, 3});
  CHECK(f4.stored == npy::dtype::float32);
  CHECK(f4.values == std::vector<float>{-1.0f, -0.5f, 0.0f, 0.5f, 1.0f, 1.5f});

  const npy::array f2 = npy::read(corpus / "valid_f2_5.npy");
  CHECK(f2.shape == bellows::shape{5});
  CHECK(f2.stored == npy::dtype::float16);
  CHECK(f2.values == std::vector<float>{0.0f, 1.0f, -2.5f, 65504.0f, 0x1p-24f});

  const npy::array scalar = npy::read(corpus / "valid_v2_scalar.npy");
  CHECK(scalar.shape.rank() == 0);
  CHECK(scalar.values == std::vector<float>{3.25f});

  const npy::array v3 = npy::read(corpus / "valid_v3_3x1x2.npy");
  CHECK(v3.shape == bellows::shape{3, 1, 2});
  CHECK(v3.values == std::vector<float>{0, 1, 2, 3, 4, 5});
}

TEST_CASE("npy: every malformed file of the corpus is refused with a message naming the problem") {
  const std::pair<const char*, const char*> cases[] = {
      {"bad_magic.npy", "not an .npy file: it starts with bytes [89 50 4e 47 0d 0a]"},
      {"bad_version.npy", "unsupported .npy format version 4.0"},
      {"fortran_order.npy", "Fortran order"},
      {"dtype_float64.npy", "unsupported dtype '<f8' (float64)"},
      {"dtype_big_endian.npy", "unsupported dtype '>f4' (big-endian)"},
      {"dtype_int32.npy", "unsupported dtype '<i4' (integers)"},
      {"dtype_structured.npy", "'descr' is not a string"},
      {"truncated_data.npy", "truncated: shape (2, 3) of float32 needs 24 data bytes, the file has 20"},
      {"trailing_bytes.npy", "4 bytes follow the 24 data bytes"},
      {"shape_overflow.npy", "has more elements than a size_t can count"},
      {"shape_bytes_overflow.npy", "needs more bytes than a size_t can count"},
      {"shape_dimension_overflow.npy", "exceeds 2^64 - 1"},
      {"shape_negative.npy", "negative dimension"},
      {"shape_not_tuple.npy", "is not a tuple"},
      {"shape_zero.npy", "shape (0, 3) has no elements"},
      {"shape_nine_dims.npy", "shape has 9 dimensions; bellows handles at most 8"},
      {"header_length_past_end.npy", "the header length field says 60000 bytes"},
      {"header_missing_key.npy", "header lacks the key 'fortran_order'"},
      {"header_extra_key.npy", "unexpected key 'x'"},
      {"header_duplicate_key.npy", "the key 'descr' appears twice"},
      {"header_unterminated_string.npy", "unterminated string"},
      {"header_not_a_dict.npy", "expected the header dict to open with '{'"},
      {"truncated_prelude.npy", "truncated: 9 bytes end inside the 12-byte prelude"},
      {"empty.npy", "not an .npy file: it starts with bytes []"},
  };
  for (const auto& [file, phrase] : cases) {
    CAPTURE(file);
    std::string message;
    try {
      (void)npy::read(corpus / file);
    } catch (const npy::format_error& e) {
      message = e.what();
    }
    CHECK(message.find((corpus / file).string() + ": ") == 0);
    CHECK(message.find(phrase) != std::string::npos);
    if (message.find(phrase) == std::string::npos) MESSAGE(message);
  }
}

TEST_CASE("npy: no file of the corpus (fuzzer finds included) raises anything but format_error") {
  std::size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(corpus)) {
    CAPTURE(entry.path().string());
    ++files;
    const std::vector<std::byte> bytes = bellows::read_file(entry.path());
    if (entry.path().filename().string().rfind("valid_", 0) == 0)
      CHECK_NOTHROW((void)npy::parse(bytes, entry.path().string()));
    else
      CHECK_THROWS_AS((void)npy::parse(bytes, entry.path().string()), npy::format_error);
  }
  CHECK(files >= 28);
}

TEST_CASE("npy: a missing file and a directory are refused by name") {
  CHECK_THROWS_WITH_AS((void)npy::read(corpus / "no_such.npy"), doctest::Contains("no_such.npy: no such file"),
                       npy::format_error);
  CHECK_THROWS_WITH_AS((void)npy::read(corpus), doctest::Contains("not a regular file"), npy::format_error);
}

TEST_CASE("npy: encode then parse is the identity for scalars, vectors and 3-D arrays") {
  for (const bellows::shape& s : {bellows::shape{}, bellows::shape{7}, bellows::shape{3, 4, 5}}) {
    CAPTURE(s.to_string());
    const std::vector<float> x = bellows::testing::normal_floats(s.size(), 11);
    const std::vector<std::byte> bytes = npy::encode(s, x);
    const npy::header h = npy::parse_header(bytes, "t.npy");
    CHECK(h.data_offset % 64 == 0);
    CHECK(h.major == 1);
    const npy::array back = npy::parse(bytes, "t.npy");
    CHECK(back.shape == s);
    CHECK(back.values == x);
  }
  const std::filesystem::path tmp = std::filesystem::temp_directory_path() / "bellows_test_npy_write.npy";
  const std::vector<float> x = bellows::testing::normal_floats(12, 5);
  npy::write(tmp, bellows::shape{4, 3}, x);
  CHECK(npy::read(tmp).values == x);
  std::filesystem::remove(tmp);
}

TEST_CASE("npy: every truncation and every one-byte change of a valid header is handled") {
  const std::vector<float> x = bellows::testing::normal_floats(6, 2);
  const std::vector<std::byte> good = npy::encode(bellows::shape{2, 3}, x);
  const std::size_t header_end = npy::parse_header(good, "t.npy").data_offset;
  for (std::size_t len = 0; len < good.size(); ++len) {
    CAPTURE(len);
    CHECK(!refusal(std::span(good).first(len)).empty());
  }
  // Each header byte replaced by each of a few values: refused, or read with the same length.
  for (std::size_t at = 0; at < header_end; ++at) {
    for (const unsigned char v : {0x00, 0x20, 0x27, 0x28, 0x2c, 0x39, 0x7b, 0xff}) {
      std::vector<std::byte> bad = good;
      bad[at] = std::byte{v};
      try {
        const npy::array a = npy::parse(bad, "t.npy");
        CHECK(a.values.size() * npy::item_bytes(a.stored) == good.size() - header_end);
      } catch (const npy::format_error&) {
      }
    }
  }
}

TEST_CASE("npy: half_to_float agrees with ldexp on all 65536 float16 patterns") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const double sign = (h & 0x8000u) ? -1.0 : 1.0;
    const int e = static_cast<int>((h >> 10) & 0x1Fu);
    const int m = static_cast<int>(h & 0x3FFu);
    const float got = npy::half_to_float(static_cast<std::uint16_t>(h));
    if (e == 31 && m != 0) {
      CHECK(std::isnan(got));
      continue;
    }
    const double expected = e == 31  ? sign * HUGE_VAL
                            : e == 0 ? sign * std::ldexp(m, -24)
                                     : sign * std::ldexp(1024 + m, e - 25);
    if (static_cast<double>(got) != expected || std::signbit(got) != (sign < 0)) {
      CAPTURE(h);
      CHECK(static_cast<double>(got) == expected);
    }
  }
}
