// SPDX-License-Identifier: Apache-2.0
// The checkpoint record of a compressor whose layer carries only its step counter and its error
// memory from step to step (top-k, rand-k, QSGD and EF-signSGD, on every backend): the counter,
// then the memory as an array (empty without a memory). Written and read here only, so a run
// saved on one backend resumes on the other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "bellows/core/checkpoint.hpp"
#include "bellows/feedback/error_feedback.hpp"

namespace bellows::detail {

inline void write_step_record(checkpoint_writer& out, std::uint64_t step, std::span<const float> memory) {
  out.put(step);
  out.put_array(memory);
}

/// A record as read back: the counter and a memory of the size the layer's state holds.
struct step_record {
  std::uint64_t step = 0;
  std::vector<float> memory;
};

/// Reads a record for a memory of `memory_size` floats and checks all of it (every value finite)
/// before the caller changes anything; raises bellows::wire_error naming `what_step` or
/// `what_memory`.
[[nodiscard]] inline step_record read_step_record(checkpoint_reader& in, std::size_t memory_size,
                                                  std::string_view what_step, std::string_view what_memory) {
  step_record rec;
  rec.step = in.get<std::uint64_t>(what_step);
  rec.memory.resize(memory_size);
  in.get_finite_array(std::span<float>(rec.memory), what_memory);
  return rec;
}

/// Appends the record of a layer's counter and memory (in the backend's memory). Waits for the
/// executor.
template <class Exec>
void save_step_record(Exec& exec, std::uint64_t step, const layer_memory<Exec>& memory, checkpoint_writer& out) {
  std::vector<float> staging;
  write_step_record(out, step, memory.host(exec, staging));
}

/// Reads a record (written by either backend) into `step` and `memory`, checking all of it
/// before either changes. Waits for the executor.
template <class Exec>
void load_step_record(Exec& exec, std::uint64_t& step, layer_memory<Exec>& memory, checkpoint_reader& in,
                      std::string_view what_step, std::string_view what_memory) {
  const step_record rec = read_step_record(in, memory.values().size(), what_step, what_memory);
  memory.assign(exec, rec.memory);
  step = rec.step;
}

}  // namespace bellows::detail
