// SPDX-License-Identifier: Apache-2.0
// The PayloadCodec members of topk, randk, qsgd and signsgd on cuda::executor (device memory)
// against those of the CPU compressors: for seeded inputs of several sizes (one element, and
// sizes that are not multiples of a bucket or a warp), the same payload bytes from encode, the
// same bits from decode_add, the same status from validate; a NaN or Inf input gives the CPU's
// flagged payload, validate says non_finite and decode_add leaves its accumulator alone;
// corrupted payloads raise wire_error with the CPU validation's very message, the accumulator
// untouched; spans of the wrong size raise bellows::error. stage and commit of top-k and rand-k
// give the CPU's payload, memory and step.
#include <bellows/compressors/qsgd.hpp>
#include <bellows/compressors/qsgd.cuh>
#include <bellows/compressors/randk.hpp>
#include <bellows/compressors/randk.cuh>
#include <bellows/compressors/signsgd.hpp>
#include <bellows/compressors/signsgd.cuh>
#include <bellows/compressors/topk.hpp>
#include <bellows/compressors/topk.cuh>
#include <bellows/concepts.hpp>
#include <bellows/core/error.hpp>
#include <bellows/core/shape.hpp>
#include <bellows/core/wire.hpp>
#include <bellows/cpu/executor.hpp>
#include <bellows/cuda/executor.cuh>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "../support/bits.hpp"
#include "../support/random.hpp"
#include "device_test.cuh"

namespace {

using bellows::step_status;
using bellows::test::device_array;

/// One edit of a payload's bytes: `width` little-endian bytes of `value` at `offset`.
struct edit {
  std::size_t offset;
  std::uint64_t value;
  std::size_t width;
};

/// A corrupted payload: edits of the bytes, then `resize` bytes more (or fewer), placed `shift`
/// bytes past a multiple of 8; `says` is a piece of the CPU's message, to be sure of what fails.
struct corruption {
  std::vector<edit> edits;
  std::ptrdiff_t resize = 0;
  std::size_t shift = 0;
  std::string says;
};

/// A payload's bytes in 8-byte words of host memory, starting `shift` bytes into them.
struct host_payload {
  std::vector<std::uint64_t> words;
  std::size_t shift = 0, size = 0;

  host_payload(std::span<const std::byte> bytes, std::size_t at) : words((at + bytes.size() + 7) / 8 + 1), shift(at) {
    size = bytes.size();
    if (size != 0) std::memcpy(data(), bytes.data(), size);
  }
  [[nodiscard]] std::byte* data() { return reinterpret_cast<std::byte*>(words.data()) + shift; }
  [[nodiscard]] std::span<const std::byte> span() { return {data(), size}; }
};

/// The same in device memory.
struct device_payload {
  device_array<std::uint64_t> words;
  std::size_t shift = 0, size = 0;

  explicit device_payload(host_payload& h) : words(h.words), shift(h.shift), size(h.size) {}
  [[nodiscard]] std::span<const std::byte> span() const {
    return {reinterpret_cast<const std::byte*>(words.data()) + shift, size};
  }
};

/// A device span's bytes, copied back.
std::vector<std::byte> bytes_of(std::span<const std::byte> device) {
  std::vector<std::byte> out(device.size());
  BELLOWS_CUDA_CHECK(cudaDeviceSynchronize());
  if (!out.empty()) BELLOWS_CUDA_CHECK(cudaMemcpy(out.data(), device.data(), out.size(), cudaMemcpyDeviceToHost));
  return out;
}

/// The message of the wire_error fn raises; otherwise says what happened instead.
std::string wire_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const bellows::wire_error& e) {
    return e.what();
  } catch (const bellows::error& e) {
    return std::string("(bellows::error, not wire_error) ") + e.what();
  }
  return "(no error)";
}

/// Both compressors of one kind with the same parameters, and a state of each for one layer.
template <template <class> class C, class Params>
struct codec_pair {
  bellows::cpu::executor cpu_exec{1};
  bellows::cuda::executor dev_exec;
  C<bellows::cpu::executor> cpu;
  C<bellows::cuda::executor> dev;
  bellows::layer_info layer;
  typename C<bellows::cpu::executor>::state cst;
  typename C<bellows::cuda::executor>::state dst;

  codec_pair(const Params& params, std::size_t n, std::uint64_t step)
      : cpu(params, cpu_exec), dev(params, dev_exec), layer{2, "proj", bellows::shape{n}}, cst(cpu.make_state(layer)),
        dst(dev.make_state(layer)) {
    cst.step = step;
    dst.step = step;
  }

  /// The CPU's payload for `in`, in 8-byte aligned host memory.
  host_payload cpu_payload(const std::vector<float>& in, std::size_t rank) {
    std::vector<std::uint64_t> out((cpu.max_payload_bytes(cst) + 7) / 8);
    const std::span<std::byte> p = cpu.encode(cst, in, std::as_writable_bytes(std::span(out)), rank);
    return host_payload(p, 0);
  }
};

/// Encode, validate and decode_add of both backends on one input: the same bytes, statuses and
/// bits, and the step counter as it was. `flagged`: the input holds NaN or Inf.
template <template <class> class C, class Params>
void check_round_trip(codec_pair<C, Params>& p, const std::vector<float>& in, std::size_t rank, bool flagged) {
  const std::size_t n = in.size();
  const std::uint64_t step = p.dst.step;
  REQUIRE(p.dev.max_payload_bytes(p.dst) == p.cpu.max_payload_bytes(p.cst));
  host_payload want = p.cpu_payload(in, rank);
  device_array<float> din(in);
  device_array<std::uint64_t> dout((p.dev.max_payload_bytes(p.dst) + 7) / 8);
  const std::span<std::byte> got = p.dev.encode(p.dst, din.span(), std::as_writable_bytes(dout.span()), rank);
  CHECK(got.data() == reinterpret_cast<std::byte*>(dout.data()));
  const std::vector<std::byte> got_bytes = bytes_of(got);
  REQUIRE(got_bytes.size() == want.size);
  CHECK(std::memcmp(got_bytes.data(), want.data(), want.size) == 0);
  CHECK(p.dst.step == step);

  const step_status status = flagged ? step_status::non_finite : step_status::ok;
  CHECK(p.cpu.validate(p.cst, want.span()) == status);
  CHECK(p.dev.validate(p.dst, got) == status);

  const std::vector<float> acc0 = bellows::testing::normal_floats(n, 77 + n);
  std::vector<float> cpu_acc = acc0;
  CHECK(p.cpu.decode_add(p.cst, want.span(), cpu_acc) == status);
  device_array<float> dacc(acc0);
  CHECK(p.dev.decode_add(p.dst, got, dacc.span()) == status);
  CHECK(bellows::testing::same_bits(dacc.host(), cpu_acc));
  if (flagged) CHECK(bellows::testing::same_bits(dacc.host(), acc0));
}

/// A payload of the CPU's, corrupted, given to both backends' validate and decode_add: the same
/// wire_error message from each (a piece of it `says`), the device accumulator untouched.
template <template <class> class C, class Params>
void check_corrupted(codec_pair<C, Params>& p, const std::vector<float>& in, const corruption& bad) {
  CAPTURE(bad.says);
  host_payload clean = p.cpu_payload(in, 0);
  std::vector<std::byte> bytes(clean.span().begin(), clean.span().end());
  for (const edit& e : bad.edits) {
    REQUIRE(e.offset + e.width <= bytes.size());
    for (std::size_t b = 0; b < e.width; ++b) bytes[e.offset + b] = static_cast<std::byte>(e.value >> (8 * b));
  }
  bytes.resize(static_cast<std::size_t>(static_cast<std::ptrdiff_t>(bytes.size()) + bad.resize));
  host_payload h(bytes, bad.shift);
  device_payload d(h);

  const std::string want = wire_message([&] { (void)p.cpu.validate(p.cst, h.span()); });
  CHECK(want.find(bad.says) != std::string::npos);
  CHECK(wire_message([&] { (void)p.dev.validate(p.dst, d.span()); }) == want);

  const std::vector<float> acc0 = bellows::testing::normal_floats(in.size(), 5);
  std::vector<float> cpu_acc = acc0;
  CHECK(wire_message([&] { (void)p.cpu.decode_add(p.cst, h.span(), cpu_acc); }) == want);
  device_array<float> dacc(acc0);
  CHECK(wire_message([&] { (void)p.dev.decode_add(p.dst, d.span(), dacc.span()); }) == want);
  CHECK(bellows::testing::same_bits(dacc.host(), acc0));
}

/// Spans of the wrong size or alignment raise bellows::error before anything runs.
template <template <class> class C, class Params>
void check_wrong_spans(codec_pair<C, Params>& p) {
  const std::size_t n = p.layer.size(), bytes = p.dev.max_payload_bytes(p.dst);
  device_array<float> in(std::vector<float>(n + 1, 0.5f));
  device_array<std::uint64_t> out(bytes / 8 + 2);
  const std::span<std::byte> storage = std::as_writable_bytes(out.span());
  CHECK_THROWS_AS((void)p.dev.encode(p.dst, in.span().first(n + 1), storage), bellows::error);
  if (n != 0) CHECK_THROWS_AS((void)p.dev.encode(p.dst, in.span().first(n - 1), storage), bellows::error);
  CHECK_THROWS_AS((void)p.dev.encode(p.dst, in.span().first(n), storage.first(bytes - 8)), bellows::error);
  CHECK_THROWS_AS((void)p.dev.encode(p.dst, in.span().first(n), storage.subspan(4, bytes)), bellows::error);
  // a good payload, and accumulators of the wrong size
  const std::span<std::byte> good = p.dev.encode(p.dst, in.span().first(n), storage);
  CHECK(p.dev.validate(p.dst, good) == step_status::ok);
  device_array<float> acc(n + 1);
  CHECK_THROWS_AS((void)p.dev.decode_add(p.dst, good, acc.span()), bellows::error);
  if (n != 0) CHECK_THROWS_AS((void)p.dev.decode_add(p.dst, good, acc.span().first(n - 1)), bellows::error);
}

/// Seeded input of n elements, optionally with magnitudes from a few levels (ties).
std::vector<float> input_of(std::size_t n, std::uint64_t seed, bool ties = false) {
  std::vector<float> g = bellows::testing::normal_floats(n, seed);
  if (ties)
    for (float& x : g) x = std::round(x * 2.0f) / 2.0f;
  return g;
}

/// Round trips at a few steps and ranks, then with a NaN and with an Inf.
template <template <class> class C, class Params>
void check_inputs(const Params& params, std::size_t n, bool ties = false) {
  CAPTURE(n);
  for (const std::uint64_t step : {std::uint64_t{0}, std::uint64_t{3}}) {
    codec_pair<C, Params> p(params, n, step);
    for (const std::size_t rank : {std::size_t{0}, std::size_t{2}})
      check_round_trip(p, input_of(n, 1000 * step + 10 * rank + n, ties), rank, false);
    std::vector<float> bad = input_of(n, 9 + n, ties);
    bad[n / 2] = std::numeric_limits<float>::quiet_NaN();
    check_round_trip(p, bad, 1, true);
    bad[n / 2] = -std::numeric_limits<float>::infinity();
    check_round_trip(p, bad, 1, true);
    check_wrong_spans(p);
  }
}

/// What a payload of the wire format of any codec may get wrong in its header, its size and its
/// alignment, against a payload of `bytes` bytes.
std::vector<corruption> header_corruptions(std::size_t bytes) {
  const std::ptrdiff_t size = static_cast<std::ptrdiff_t>(bytes);
  return {
      {{{0, 0x12345678, 4}}, 0, 0, "bad magic"},
      {{{4, 2, 2}}, 0, 0, "unsupported version"},
      {{{6, 0x7F, 1}}, 0, 0, "payload of codec 127"},
      {{{7, 0x80, 1}}, 0, 0, "unknown flag bits"},
      {{{28, 1, 4}}, 0, 0, "reserved field"},
      {{{32, 16, 8}}, 0, 0, "header says 16 body bytes"},
      {{}, -8, 0, "body bytes, payload has"},                 // truncated
      {{}, 8, 0, "body bytes, payload has"},                  // a word too many
      {{}, 40 - size, 0, "body bytes, payload has 0"},        // the header alone
      {{}, 20 - size, 0, "shorter than the 40-byte header"},  // not even that
      {{}, 0, 4, "does not start at a multiple of 8 bytes"},  // misaligned
      {{{8, bytes * 3 + 1, 8}}, 0, 0, "payload for"},         // the header's n
  };
}

}  // namespace

TEST_CASE("cuda payload codecs: the device members model PayloadCodec") {
  static_assert(bellows::PayloadCodec<bellows::topk<bellows::cuda::executor>>);
  static_assert(bellows::PayloadCodec<bellows::randk<bellows::cuda::executor>>);
  static_assert(bellows::PayloadCodec<bellows::qsgd<bellows::cuda::executor>>);
  static_assert(bellows::PayloadCodec<bellows::signsgd<bellows::cuda::executor>>);
  CHECK(true);
}

TEST_CASE("cuda topk payloads: encode, validate and decode_add equal the CPU's, bit for bit" *
          doctest::skip(bellows::test::no_device())) {
  for (const std::size_t n : {std::size_t{1}, std::size_t{33}, std::size_t{1000}, std::size_t{4099}}) {
    check_inputs<bellows::topk>(bellows::topk_params{.ratio = 0.05}, n);
    check_inputs<bellows::topk>(bellows::topk_params{.ratio = 0.3, .feedback = bellows::feedback::none}, n, true);
  }
  check_inputs<bellows::topk>(bellows::topk_params{.k = 37}, 1000, true);
}

TEST_CASE("cuda topk payloads in approximate mode: the CPU's sample, count and bytes" *
          doctest::skip(bellows::test::no_device())) {
  constexpr auto approximate = bellows::topk_mode::approximate;
  for (const std::size_t n : {std::size_t{1}, std::size_t{33}, std::size_t{1000}, std::size_t{40'000}}) {
    check_inputs<bellows::topk>(bellows::topk_params{.ratio = 0.05, .mode = approximate, .seed = 9}, n);
    check_inputs<bellows::topk>(bellows::topk_params{.ratio = 0.2, .mode = approximate}, n, true);
  }
  // payloads of more than k entries, whose count the rank and the step change
  codec_pair<bellows::topk, bellows::topk_params> p({.ratio = 0.2, .mode = approximate}, 1000, 0);
  std::size_t longest = 0;
  for (const std::size_t rank : {std::size_t{0}, std::size_t{1}, std::size_t{2}}) {
    check_round_trip(p, input_of(1000, 5), rank, false);
    longest = std::max(longest, p.cpu_payload(input_of(1000, 5), rank).size);
  }
  CHECK(longest > bellows::wire::header_bytes + 8 * 200);
}

TEST_CASE("cuda randk payloads: encode, validate and decode_add equal the CPU's, bit for bit" *
          doctest::skip(bellows::test::no_device())) {
  for (const std::size_t n : {std::size_t{1}, std::size_t{33}, std::size_t{1000}, std::size_t{4099}}) {
    check_inputs<bellows::randk>(bellows::randk_params{.ratio = 0.05}, n);
    check_inputs<bellows::randk>(bellows::randk_params{.ratio = 0.05, .mode = bellows::randk_mode::per_rank}, n);
    check_inputs<bellows::randk>(
        bellows::randk_params{.ratio = 0.2, .unbiased = true, .feedback = bellows::feedback::none, .seed = 11}, n);
  }
}

TEST_CASE("cuda qsgd payloads: encode, validate and decode_add equal the CPU's, bit for bit" *
          doctest::skip(bellows::test::no_device())) {
  for (const std::size_t n : {std::size_t{1}, std::size_t{33}, std::size_t{1001}, std::size_t{4099}}) {
    check_inputs<bellows::qsgd>(bellows::qsgd_params{.bits = 2, .bucket = 7}, n);
    check_inputs<bellows::qsgd>(bellows::qsgd_params{.bits = 4, .bucket = 100, .norm = bellows::qsgd_norm::max_abs}, n);
    check_inputs<bellows::qsgd>(bellows::qsgd_params{.bits = 8, .bucket = 512, .seed = 5}, n);
  }
}

TEST_CASE("cuda signsgd payloads: encode, validate and decode_add equal the CPU's, bit for bit" *
          doctest::skip(bellows::test::no_device())) {
  for (const std::size_t n : {std::size_t{1}, std::size_t{33}, std::size_t{1001}, std::size_t{5000}}) {
    check_inputs<bellows::signsgd>(bellows::signsgd_params{.bucket = 0}, n);
    check_inputs<bellows::signsgd>(bellows::signsgd_params{.bucket = 7}, n);
    check_inputs<bellows::signsgd>(bellows::signsgd_params{.bucket = 2048, .feedback = bellows::feedback::none}, n);
  }
}

TEST_CASE("cuda sparse payloads: corrupted ones raise the CPU's wire_error, the accumulator untouched" *
          doctest::skip(bellows::test::no_device())) {
  // 1000 elements, k = 10: the header, 10 indices (40 bytes), 10 values (40 bytes)
  const std::size_t n = 1000, k = 10, at = bellows::wire::header_bytes;
  const auto sparse_corruptions = [&](std::size_t bytes) {
    std::vector<corruption> all = header_corruptions(bytes);
    all.push_back({{{16, k - 1, 8}}, 0, 0, "entries where layer"});                     // the count
    all.push_back({{{24, 1, 4}}, 0, 0, "payload for 1000 elements (param 1"});          // the param
    all.push_back({{{at + 4 * (k - 1), n, 4}}, 0, 0, "has index 1000"});                // the last index is n
    all.push_back({{{at + 4 * (k - 1), 0xFFFFFFFF, 4}}, 0, 0, "indices must ascend"});  // far out of range
    all.push_back({{{at + 4, 0, 4}}, 0, 0, "entry 1 of layer"});                        // index 1 is 0: not above 0
    all.push_back({{{at + 4 * k, 0x7FC00000, 4}}, 0, 0, "non-finite value"});           // value 0 is NaN
    all.push_back({{{at + 4 * k + 8, 0xFF800000, 4}}, 0, 0, "non-finite value -inf"});  // value 2 is -Inf
    all.push_back({{{7, 2, 1}}, 0, 0, "flagged non-finite carries 10"});                // the flag, with entries
    // flagged and empty, but the whole size: the body is not what the header says
    all.push_back({{{7, 2, 1}, {16, 0, 8}, {32, 0, 8}}, 0, 0, "header says 0 body bytes"});
    return all;
  };
  {
    codec_pair<bellows::topk, bellows::topk_params> p({.ratio = 0.01}, n, 0);
    const std::vector<float> in = input_of(n, 3);
    for (const corruption& bad : sparse_corruptions(p.cpu.max_payload_bytes(p.cst))) check_corrupted(p, in, bad);
  }
  {
    codec_pair<bellows::randk, bellows::randk_params> p({.ratio = 0.01}, n, 4);
    const std::vector<float> in = input_of(n, 4);
    for (const corruption& bad : sparse_corruptions(p.cpu.max_payload_bytes(p.cst))) check_corrupted(p, in, bad);
  }
  {  // approximate mode, k = 200 to 250 entries: the count is the header's
    codec_pair<bellows::topk, bellows::topk_params> p({.ratio = 0.2, .mode = bellows::topk_mode::approximate}, n, 0);
    const std::vector<float> in = input_of(n, 3);
    const std::size_t size = p.cpu_payload(in, 0).size, count = (size - at) / 8;
    REQUIRE(count > 200);
    for (const corruption& bad : header_corruptions(size)) check_corrupted(p, in, bad);
    check_corrupted(p, in, {{{16, 251, 8}}, 0, 0, "expects 200 to 250"});
    check_corrupted(p, in, {{{16, 199, 8}}, 0, 0, "expects 200 to 250"});
    check_corrupted(p, in, {{{16, count - 1, 8}}, 0, 0, "bytes follow the arrays"});  // within bounds, not the body
    check_corrupted(p, in, {{{at + 4 * (count - 1), n, 4}}, 0, 0, "has index 1000"});
    check_corrupted(p, in, {{{at + 4 * count, 0x7FC00000, 4}}, 0, 0, "non-finite value"});
  }
  {  // one element: a payload of one entry
    codec_pair<bellows::topk, bellows::topk_params> p({.ratio = 1.0}, 1, 0);
    const std::vector<float> in = input_of(1, 6);
    for (const corruption& bad : header_corruptions(p.cpu.max_payload_bytes(p.cst))) check_corrupted(p, in, bad);
    check_corrupted(p, in, {{{at, 1, 4}}, 0, 0, "has index 1"});
    check_corrupted(p, in, {{{at + 4, 0x7F800001, 4}}, 0, 0, "non-finite value"});
  }
}

TEST_CASE("cuda qsgd and signsgd payloads: corrupted ones raise the CPU's wire_error, the accumulator untouched" *
          doctest::skip(bellows::test::no_device())) {
  const std::size_t at = bellows::wire::header_bytes;
  {
    // 1001 elements, 2 bits, buckets of 7: 143 scales (572 bytes), 251 code bytes (the last
    // with 2 bits used), 1 byte of padding
    const bellows::qsgd_params params{.bits = 2, .bucket = 7};
    codec_pair<bellows::qsgd, bellows::qsgd_params> p(params, 1001, 2);
    const std::size_t codes_at = at + 572, bytes = p.cpu.max_payload_bytes(p.cst);
    REQUIRE(bytes == at + 572 + 251 + 1);
    std::vector<corruption> all = header_corruptions(bytes);
    all.push_back({{{16, 142, 8}}, 0, 0, "in 142 buckets"});                         // the count
    all.push_back({{{24, 4 | 7 << 8, 4}}, 0, 0, "(param 0x"});                       // the param: 4 bits
    all.push_back({{{at, 0x7FC00000, 4}}, 0, 0, "scale nan of bucket 0"});           // a NaN scale
    all.push_back({{{at + 4 * 142, 0xBF800000, 4}}, 0, 0, "of bucket 142 is not"});  // a negative scale
    all.push_back({{{at + 8, 0x7F800000, 4}}, 0, 0, "scale inf of bucket 2"});       // an infinite one
    all.push_back({{{codes_at + 250, 0xF0, 1}}, 0, 0, "unused bits of the last code byte"});
    all.push_back({{{codes_at + 251, 0x80, 1}}, 0, 0, "non-zero padding byte"});
    all.push_back({{{7, 1, 1}}, 0, 0, "payload for 1001 elements"});  // 64-bit index flag
    const std::vector<float> in = input_of(1001, 8);
    for (const corruption& bad : all) check_corrupted(p, in, bad);
    // a flagged payload's scales may be anything
    std::vector<float> nan_in = in;
    nan_in[500] = std::numeric_limits<float>::quiet_NaN();
    check_round_trip(p, nan_in, 0, true);
  }
  {
    // 1001 elements in buckets of 7: 143 scales (572 bytes), 126 sign bytes (the last with 1 bit
    // used), 6 bytes of padding
    const bellows::signsgd_params params{.bucket = 7};
    codec_pair<bellows::signsgd, bellows::signsgd_params> p(params, 1001, 0);
    const std::size_t signs_at = at + 572, bytes = p.cpu.max_payload_bytes(p.cst);
    REQUIRE(bytes == at + 572 + 126 + 6);
    std::vector<corruption> all = header_corruptions(bytes);
    all.push_back({{{16, 144, 8}}, 0, 0, "in 144 buckets"});                           // the count
    all.push_back({{{24, 8, 4}}, 0, 0, "bucket parameter 8"});                         // the param
    all.push_back({{{at + 4 * 5, 0x7FC00000, 4}}, 0, 0, "scale nan of bucket 5"});     // a NaN scale
    all.push_back({{{at + 3, 0xFF, 1}}, 0, 0, "of bucket 0 is not a finite number"});  // negative
    all.push_back({{{signs_at + 125, 0xFE, 1}}, 0, 0, "unused bits of the last sign byte"});
    all.push_back({{{signs_at + 126, 1, 1}}, 0, 0, "non-zero padding byte"});
    all.push_back({{{7, 1, 1}}, 0, 0, "flags 1"});  // 64-bit index flag
    const std::vector<float> in = input_of(1001, 9);
    for (const corruption& bad : all) check_corrupted(p, in, bad);
  }
  {  // one element: a scale, a sign byte, 3 bytes of padding
    codec_pair<bellows::signsgd, bellows::signsgd_params> p({.bucket = 0}, 1, 0);
    const std::vector<float> in = input_of(1, 10);
    for (const corruption& bad : header_corruptions(p.cpu.max_payload_bytes(p.cst))) check_corrupted(p, in, bad);
    check_corrupted(p, in, {{{at + 4, 0x02, 1}}, 0, 0, "unused bits of the last sign byte"});
  }
}

namespace {

/// stage and commit of one sparse compressor on both backends, for several steps and ranks:
/// the staged payload has the CPU's bytes, commit leaves the CPU's memory and step, and input
/// with a NaN stages the CPU's flagged payload, which neither backend lets commit.
template <template <class> class C, class Params>
void check_stage_commit(const Params& params, std::size_t n) {
  bellows::cpu::executor host(1);
  bellows::cuda::executor device;
  C<bellows::cpu::executor> cpu(params, host);
  C<bellows::cuda::executor> dev(params, device);
  const bellows::layer_info layer{3, "fc.weight", bellows::shape{n}};
  auto cpu_st = cpu.make_state(layer);
  auto dev_st = dev.make_state(layer);
  for (std::size_t step = 0; step < 3; ++step) {
    const std::size_t rank = step % 2;
    std::vector<float> x = input_of(n, 100 * step + n);
    if (step == 2 && n > 1) x[n / 2] = std::numeric_limits<float>::quiet_NaN();
    const device_array<float> dx(x);
    const std::span<const std::byte> want = cpu.stage(cpu_st, x, rank);
    const std::span<const std::byte> got = dev.stage(dev_st, dx.span(), rank);
    REQUIRE(got.size() == want.size());
    std::vector<std::byte> back(got.size());
    BELLOWS_CUDA_CHECK(cudaMemcpy(back.data(), got.data(), got.size(), cudaMemcpyDeviceToHost));
    CHECK(std::ranges::equal(back, want));
    if (step == 2 && n > 1) {
      CHECK_THROWS_AS(cpu.commit(cpu_st), bellows::error);
      CHECK_THROWS_AS(dev.commit(dev_st), bellows::error);
      continue;
    }
    cpu.commit(cpu_st);
    dev.commit(dev_st);
    CHECK(dev_st.step == cpu_st.step);
    CHECK(bellows::testing::same_bits(bellows::test::memory_of(dev_st.memory), cpu_st.memory.values()));
  }
}

}  // namespace

TEST_CASE("cuda topk and randk: stage and commit give the CPU's payload, memory and step" *
          doctest::skip(bellows::test::no_device())) {
  for (const std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{4099}}) {
    check_stage_commit<bellows::topk>(bellows::topk_params{.ratio = 0.05}, n);
    check_stage_commit<bellows::topk>(bellows::topk_params{.ratio = 0.2, .mode = bellows::topk_mode::approximate}, n);
    check_stage_commit<bellows::randk>(bellows::randk_params{.ratio = 0.05, .mode = bellows::randk_mode::per_rank}, n);
  }
}
