// SPDX-License-Identifier: Apache-2.0
// Where a backend keeps the payloads of a gather codec's step, for the code written once over
// executors (compressors/detail/scaled_codes.hpp): payload_slots_for<cpu::executor, Parts> is
// cpu::payload_slots (cpu/payload_slots.hpp: this rank's payload and a gather_buffer, host
// memory), payload_slots_for<cuda::executor, Parts> is cuda::payload_slots (one slot per rank in
// device memory, and the words the device's kernels report in). Parts names what the CPU's
// average reads of one payload (code_arrays, sign_arrays); the device reads the slots in place.
//
// Both have the same members: prepare(exec, ranks, bytes) before a step; mine(rank), this rank's
// payload storage (bytes long, 8-byte aligned); non_finite(), the flag word its encoding kernels
// set; gather(coll, rank), the step's one allgather; view(base, stride, ranks, bytes), which puts
// payloads a caller gathered (the phases' buffers) in place of the slots' own, after a
// prepare(exec, ranks, 0) that cleared the words; and a nested `words` type, the flag
// and verdict words of a call on one payload (encode, validate, decode_add), made from the
// executor: `words::reserve(exec)` at make_state, `words w(exec)` per call, with w.non_finite zero.
// scaled_payload_of says where the parts of such a payload lie, for every backend.
// The sparse codecs (compressors/detail/sparse_codec.hpp) use payload_slots_for<Exec,
// sparse_payload>: on the CPU cpu::sparse_slots (cpu/sparse_payload.hpp), which sends each
// payload at its length; on the device the same slots as the others. Both then tell count(r),
// the entries of rank r's gathered payload (after check_payloads, on the device).
#pragma once

#include <cstddef>
#include <cstdint>

#include "bellows/core/wire.hpp"
#include "bellows/plan/sparse.hpp"

namespace bellows {

/// Where the parts of a payload made of one float32 scale per bucket and then packed bytes (QSGD's
/// codes, EF-signSGD's sign bits) lie, for a layer: the header a finite sender writes, the first
/// byte and the count of the packed bytes, the bits used in the last of them (0: all eight), and
/// the payload's bytes (header, scales, packed bytes, zero padding to a multiple of 8).
struct scaled_payload {
  wire::header header{};
  std::size_t codes_at = 0;
  std::size_t code_bytes = 0;
  unsigned used_bits = 0;
  std::size_t bytes = 0;
};

/// The parts of a payload of codec `codec` for n elements: `buckets` scales, then `code_bytes`
/// packed bytes whose last uses `used_bits` (0: all eight); `param` is the header's param field.
[[nodiscard]] inline scaled_payload scaled_payload_of(std::uint8_t codec, std::uint64_t n, std::size_t buckets,
                                                      std::size_t code_bytes, std::uint32_t param, unsigned used_bits) {
  scaled_payload p;
  const std::size_t scales_end = wire::array_end<float>(0, buckets);
  p.codes_at = wire::header_bytes + scales_end;
  p.code_bytes = code_bytes;
  p.used_bits = used_bits;
  p.bytes = wire::payload_bytes(wire::array_end<std::uint8_t>(scales_end, code_bytes));
  p.header.codec = codec;
  p.header.n = n;
  p.header.count = buckets;
  p.header.param = param;
  p.header.body_bytes = p.bytes - wire::header_bytes;
  return p;
}

/// What the sparse payloads of a layer may be (top-k's and rand-k's: plan/sparse.hpp): the header
/// of one of `least` entries from a finite sender, and between `least` and `most` entries.
struct sparse_payload {
  wire::header header{};
  std::size_t least = 0;
  std::size_t most = 0;
};

/// The sparse payloads of codec `codec` for n elements, of `least` to `most` entries.
[[nodiscard]] inline sparse_payload sparse_payload_of(std::uint8_t codec, std::uint64_t n, std::size_t least,
                                                      std::size_t most) {
  sparse_payload p{{}, least, most};
  p.header.codec = codec;
  p.header.n = n;
  p.header.count = least;
  if (wide_indices(n)) p.header.flags = wire::flag::index64;
  p.header.body_bytes = sparse_payload_bytes(n, least) - wire::header_bytes;
  return p;
}

/// Specialised beside each backend's payload slots.
template <class Exec, class Parts>
struct payload_slots_of;
template <class Exec, class Parts>
using payload_slots_for = typename payload_slots_of<Exec, Parts>::type;

}  // namespace bellows
