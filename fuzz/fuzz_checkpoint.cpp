// SPDX-License-Identifier: Apache-2.0
// Synchronizer checkpoints: restore() may refuse the bytes with bellows::wire_error, and then
// must have changed nothing; it must never crash or accept a state of the wrong size.
#include <bellows/compressors/identity.hpp>
#include <bellows/regime/static_policy.hpp>
#include <bellows/sync/synchronizer.hpp>

#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static bellows::cpu::executor exec(1);
  bellows::synchronizer sync(bellows::identity<>{exec}, bellows::identity<>{exec},
                             bellows::static_policy(bellows::regime::critical), exec);
  sync.add_layer("fc1.weight", bellows::shape{16, 8});
  sync.add_layer("fc1.bias", bellows::shape{16});
  const bellows::rank_place solo{0, 1};
  const auto before = sync.checkpoint(solo);
  try {
    sync.restore(std::as_bytes(std::span(data, size)), solo);
    // the same states; a file of version 5 may also hold buckets (4 bytes each)
    if (sync.checkpoint(solo).size() != before.size() + sizeof(std::uint32_t) * sync.buckets().size()) std::abort();
  } catch (const bellows::wire_error&) {
    if (sync.checkpoint(solo) != before) std::abort();
  }
  return 0;
}
