// SPDX-License-Identifier: Apache-2.0
// Reading and writing NumPy's .npy files: the arrays a user dumps from a trainer with numpy.save.
//
// The format (NumPy's format.py documents it): the six bytes "\x93NUMPY", a major and a minor
// version byte, the length of the header (2 bytes little-endian in version 1.0, 4 bytes in 2.0
// and 3.0), then the header: a Python dict literal with exactly the keys 'descr' (the dtype),
// 'fortran_order' and 'shape', padded with spaces and ended by a newline. The data follows, in C
// or Fortran order. This reader takes float32 ('<f4') and float16 ('<f2') in C order, any shape
// of at most bellows::shape::max_dims dimensions, and refuses everything else with a
// format_error that names the file, the field and the value. Nothing is trusted: every length is
// checked against the bytes present before it is used, and every product against overflow.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bellows/core/checkpoint.hpp"
#include "bellows/core/error.hpp"
#include "bellows/core/shape.hpp"

namespace bellows::tool::npy {

/// An .npy file that cannot be used; the message names the file and the problem.
class format_error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

enum class dtype : unsigned char { float16, float32 };

[[nodiscard]] constexpr const char* to_string(dtype t) noexcept { return t == dtype::float16 ? "float16" : "float32"; }
[[nodiscard]] constexpr std::size_t item_bytes(dtype t) noexcept { return t == dtype::float16 ? 2 : 4; }

inline constexpr char magic[] = "\x93NUMPY";
inline constexpr std::size_t magic_bytes = 6;

/// What the header of a valid file says.
struct header {
  unsigned major = 1;
  unsigned minor = 0;
  dtype type = dtype::float32;
  bellows::shape shape;
  std::size_t data_offset = 0;  ///< bytes before the data: prelude and header
};

/// An array read from a file, converted to float32.
struct array {
  bellows::shape shape;
  dtype stored = dtype::float32;
  std::vector<float> values;
};

/// A float16 (IEEE 754 binary16) bit pattern as a float: zeros, subnormals, normals, infinities
/// and NaN (quiet, sign kept) all convert exactly.
[[nodiscard]] inline float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1Fu;
  std::uint32_t mantissa = h & 0x3FFu;
  std::uint32_t bits = 0;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13) | (mantissa != 0 ? 0x400000u : 0u);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  } else if (mantissa != 0) {
    // Subnormal: shift the leading one up to the implicit bit, lowering the exponent each time.
    std::uint32_t e = 127 - 15 + 1;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mantissa & 0x3FFu) << 13);
  } else {
    bits = sign;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

namespace detail {

/// Dimensions as NumPy writes a shape: "()", "(5,)", "(3, 4)".
[[nodiscard]] inline std::string tuple_text(std::span<const std::uint64_t> dims) {
  std::string s = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (dims.size() == 1 ? ",)" : ")");
}
[[nodiscard]] inline std::string tuple_text(const bellows::shape& shape) {
  std::vector<std::uint64_t> dims(shape.rank());
  for (std::size_t i = 0; i < shape.rank(); ++i) dims[i] = shape[i];
  return tuple_text(dims);
}

/// A recursive-descent reader of the header's dict literal. Errors carry the offset in the
/// header text, so a user can find the spot.
class header_parser {
public:
  header_parser(std::string_view text, std::string_view file) : text_(text), file_(file) {}

  /// Parses the whole dict into `h` (type, fortran order, shape).
  void parse(header& h) {
    bool seen_descr = false, seen_order = false, seen_shape = false;
    bool fortran = false;
    skip_space();
    expect('{', "the header dict to open with '{'");
    skip_space();
    while (!at('}')) {
      const std::string key = quoted("a quoted key");
      skip_space();
      expect(':', "':' after the key");
      skip_space();
      if (key == "descr") {
        once(seen_descr, key);
        if (!at('\'') && !at('"'))
          fail("'descr' is not a string (structured and object dtypes are not supported); "
               "save a plain float32 or float16 array");
        h.type = parse_descr(quoted("the dtype string"));
      } else if (key == "fortran_order") {
        once(seen_order, key);
        fortran = boolean();
      } else if (key == "shape") {
        once(seen_shape, key);
        h.shape = shape_tuple();
      } else {
        fail(concat("unexpected key '", key,
                    "' (an .npy header holds exactly 'descr', "
                    "'fortran_order' and 'shape')"));
      }
      skip_space();
      if (at(',')) {
        ++pos_;
        skip_space();
      } else if (!at('}')) {
        fail("expected ',' or '}' after a value");
      }
    }
    ++pos_;
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the header dict");
    for (const auto& [seen, name] :
         {std::pair{seen_descr, "descr"}, std::pair{seen_order, "fortran_order"}, std::pair{seen_shape, "shape"}})
      if (!seen) throw format_error(concat(file_, ": header lacks the key '", name, "'"));
    if (fortran)
      throw format_error(concat(file_, ": array is in Fortran order (fortran_order: True); save a "
                                       "C-ordered copy, e.g. numpy.save(path, numpy.ascontiguousarray(a))"));
  }

private:
  template <class... Parts>
  [[nodiscard]] static std::string concat(Parts&&... parts) {
    return bellows::detail::concat(std::forward<Parts>(parts)...);
  }

  [[noreturn]] void fail(std::string_view what) const {
    throw format_error(concat(file_, ": header, at offset ", pos_, ": ", what));
  }

  [[nodiscard]] bool at(char c) const noexcept { return pos_ < text_.size() && text_[pos_] == c; }

  void expect(char c, std::string_view what) {
    if (!at(c)) fail(concat("expected ", what));
    ++pos_;
  }

  void skip_space() noexcept {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }

  void once(bool& seen, const std::string& key) {
    if (seen) fail(concat("the key '", key, "' appears twice"));
    seen = true;
  }

  /// A string in single or double quotes, without escapes (no dtype or key needs one).
  std::string quoted(std::string_view what) {
    if (!at('\'') && !at('"')) fail(concat("expected ", what));
    const char q = text_[pos_++];
    const std::size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != q) {
      if (text_[pos_] == '\\') fail("escape sequences in strings are not supported");
      ++pos_;
    }
    if (pos_ == text_.size()) fail("unterminated string");
    return std::string(text_.substr(start, pos_++ - start));
  }

  bool boolean() {
    for (const auto& [word, value] :
         {std::pair{std::string_view("True"), true}, std::pair{std::string_view("False"), false}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    }
    fail("'fortran_order' must be True or False");
  }

  [[nodiscard]] dtype parse_descr(const std::string& d) const {
    if (d == "<f4") return dtype::float32;
    if (d == "<f2") return dtype::float16;
    const char* why = "";
    if (!d.empty() && d[0] == '>')
      why = " (big-endian)";
    else if (d == "<f8")
      why = " (float64)";
    else if (d.size() > 1 && (d[1] == 'i' || d[1] == 'u'))
      why = " (integers)";
    else if (d.size() > 1 && d[1] == 'c')
      why = " (complex)";
    throw format_error(concat(file_, ": unsupported dtype '", d, "'", why,
                              "; bellows-bench reads '<f4' "
                              "(float32) and '<f2' (float16): convert with a.astype(numpy.float32)"));
  }

  /// A Python tuple of non-negative integers: "()", "(5,)", "(3, 4)", "(3, 4,)".
  bellows::shape shape_tuple() {
    expect('(', "the shape to be a tuple, '('");
    std::vector<std::uint64_t> dims;
    bool trailing_comma = false;
    skip_space();
    while (!at(')')) {
      dims.push_back(dimension());
      skip_space();
      trailing_comma = at(',');
      if (trailing_comma) {
        ++pos_;
        skip_space();
      } else if (!at(')')) {
        fail("expected ',' or ')' in the shape");
      }
    }
    ++pos_;
    if (dims.size() == 1 && !trailing_comma) fail("the shape (n) is not a tuple; a 1-D shape is written (n,)");
    if (dims.size() > bellows::shape::max_dims)
      throw format_error(concat(file_, ": shape has ", dims.size(), " dimensions; bellows handles at most ",
                                bellows::shape::max_dims));
    bellows::shape s;
    std::uint64_t n = 1;
    for (const std::uint64_t d : dims) {
      if (d == 0) throw format_error(concat(file_, ": shape ", tuple_text(dims), " has no elements"));
      if (n > std::numeric_limits<std::size_t>::max() / d)
        throw format_error(concat(file_, ": shape ", tuple_text(dims), " has more elements than a size_t can count"));
      n *= d;
      s.push_back(static_cast<std::size_t>(d));
    }
    return s;
  }

  std::uint64_t dimension() {
    if (at('-')) fail("negative dimension in the shape");
    if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9') fail("expected a dimension (an integer)");
    std::uint64_t v = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const auto digit = static_cast<std::uint64_t>(text_[pos_] - '0');
      if (v > (std::numeric_limits<std::uint64_t>::max() - digit) / 10)
        fail("a dimension of the shape exceeds 2^64 - 1");
      v = v * 10 + digit;
      ++pos_;
    }
    return v;
  }

  std::string_view text_;
  std::string_view file_;
  std::size_t pos_ = 0;
};

[[nodiscard]] inline std::uint64_t little_endian(std::span<const std::byte> b) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = b.size(); i-- > 0;) v = v << 8 | std::to_integer<std::uint64_t>(b[i]);
  return v;
}

}  // namespace detail

/// Validates the prelude and header of the file's bytes and checks that exactly the data the
/// shape needs follows. `file` names the file in messages.
[[nodiscard]] inline header parse_header(std::span<const std::byte> bytes, std::string_view file) {
  using bellows::detail::concat;
  if (bytes.size() < magic_bytes + 2 || std::memcmp(bytes.data(), magic, magic_bytes) != 0) {
    std::string seen;
    for (std::size_t i = 0; i < std::min<std::size_t>(bytes.size(), magic_bytes); ++i) {
      static constexpr char hex[] = "0123456789abcdef";
      const auto b = std::to_integer<unsigned>(bytes[i]);
      seen += concat(i ? " " : "", hex[b >> 4], hex[b & 15]);
    }
    throw format_error(concat(file, ": not an .npy file: it starts with bytes [", seen,
                              "], an .npy file with 93 4e 55 4d 50 59 (\"\\x93NUMPY\")"));
  }
  header h;
  h.major = std::to_integer<unsigned>(bytes[6]);
  h.minor = std::to_integer<unsigned>(bytes[7]);
  if (h.minor != 0 || h.major < 1 || h.major > 3)
    throw format_error(concat(file, ": unsupported .npy format version ", h.major, ".", h.minor,
                              " (this reader knows 1.0, 2.0 and 3.0)"));
  const std::size_t length_bytes = h.major == 1 ? 2 : 4;
  const std::size_t prelude = magic_bytes + 2 + length_bytes;
  if (bytes.size() < prelude)
    throw format_error(concat(file, ": truncated: ", bytes.size(), " bytes end inside the ", prelude,
                              "-byte prelude of a version ", h.major, ".0 file"));
  const std::uint64_t header_length = detail::little_endian(bytes.subspan(8, length_bytes));
  if (header_length > bytes.size() - prelude)
    throw format_error(concat(file, ": truncated: the header length field says ", header_length,
                              " bytes, the file has ", bytes.size() - prelude, " after the prelude"));
  h.data_offset = prelude + static_cast<std::size_t>(header_length);
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + prelude),
                              static_cast<std::size_t>(header_length));
  detail::header_parser(text, file).parse(h);

  const std::size_t n = h.shape.size();
  const std::size_t item = item_bytes(h.type);
  if (n > std::numeric_limits<std::size_t>::max() / item)
    throw format_error(concat(file, ": shape ", detail::tuple_text(h.shape), " of ", to_string(h.type),
                              " needs more bytes than a size_t can count"));
  const std::size_t need = n * item;
  const std::size_t have = bytes.size() - h.data_offset;
  if (have < need)
    throw format_error(concat(file, ": truncated: shape ", detail::tuple_text(h.shape), " of ", to_string(h.type),
                              " needs ", need, " data bytes, the file has ", have));
  if (have > need)
    throw format_error(concat(file, ": ", have - need, " bytes follow the ", need, " data bytes of shape ",
                              detail::tuple_text(h.shape), " of ", to_string(h.type)));
  return h;
}

/// Validates a whole file held in memory and converts its data to float32.
[[nodiscard]] inline array parse(std::span<const std::byte> bytes, std::string_view file) {
  const header h = parse_header(bytes, file);
  array a{h.shape, h.type, std::vector<float>(h.shape.size())};
  const std::byte* data = bytes.data() + h.data_offset;
  if (h.type == dtype::float32) {
    std::memcpy(a.values.data(), data, a.values.size() * sizeof(float));
  } else {
    for (std::size_t i = 0; i < a.values.size(); ++i) {
      std::uint16_t bits;
      std::memcpy(&bits, data + 2 * i, 2);
      a.values[i] = half_to_float(bits);
    }
  }
  return a;
}

/// Reads and validates an .npy file.
[[nodiscard]] inline array read(const std::filesystem::path& path) {
  using bellows::detail::concat;
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) throw format_error(concat(path.string(), ": no such file"));
  if (!std::filesystem::is_regular_file(status)) throw format_error(concat(path.string(), ": not a regular file"));
  std::vector<std::byte> bytes;
  try {
    bytes = bellows::read_file(path);
  } catch (const bellows::error&) {
    throw format_error(concat(path.string(), ": cannot be read (permissions?)"));
  }
  return parse(bytes, path.string());
}

/// The bytes of a version 1.0 .npy file of float32 values in C order: NumPy reads it back with
/// numpy.load. The header is padded so that the data starts at a multiple of 64 bytes.
[[nodiscard]] inline std::vector<std::byte> encode(const bellows::shape& shape, std::span<const float> values) {
  BELLOWS_EXPECTS(values.size() == shape.size(), "npy::encode: ", values.size(), " values for shape ",
                  shape.to_string());
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': " + detail::tuple_text(shape) + ", }";
  const std::size_t prelude = magic_bytes + 4;
  const std::size_t unpadded = prelude + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict += '\n';
  std::vector<std::byte> out(prelude + dict.size() + values.size_bytes());
  std::memcpy(out.data(), magic, magic_bytes);
  out[6] = std::byte{1};
  out[7] = std::byte{0};
  out[8] = static_cast<std::byte>(dict.size() & 0xFF);
  out[9] = static_cast<std::byte>(dict.size() >> 8);
  std::memcpy(out.data() + prelude, dict.data(), dict.size());
  if (!values.empty()) std::memcpy(out.data() + prelude + dict.size(), values.data(), values.size_bytes());
  return out;
}

/// Writes `values` of `shape` as a float32 .npy file; a crash leaves the old file or the new one.
inline void write(const std::filesystem::path& path, const bellows::shape& shape, std::span<const float> values) {
  bellows::write_file_atomically(path, encode(shape, values));
}

}  // namespace bellows::tool::npy
