// SPDX-License-Identifier: Apache-2.0
// A CPU emulation of the part of NCCL that collectives/nccl.cuh and its tests use, on top of the
// CUDA emulation (cuda_runtime.h): communicators made together by ncclCommInitAll, one rank per
// host thread of this process, ncclAllReduce (sum) and ncclAllGather between them, and ncclSend /
// ncclRecv in groups (ncclGroupStart / ncclGroupEnd).
//
// A collective blocks its caller until every rank of the group has called it, reads every rank's
// send buffer into a buffer of its own, waits until every rank has read, and only then writes its
// receive buffer: in place is safe, and no rank goes on to change its buffers while another still
// reads them. Every rank computes the same sum in the same order (rank 0's value, then rank 1's
// added, and so on), so all get the same bits; that order is this emulation's, not NCCL's, whose
// order depends on its algorithm, but NCCL too gives every rank the same bits.
//
// What it checks, as NCCL does or could: a null communicator or output pointer, a data type or
// operation it does not know (half and bfloat16 are missing) and buffers that are not device
// memory (as NCCL does with NCCL_CHECK_POINTERS=1), all ncclInvalidArgument on the calling rank
// alone; ranks that disagree on the operation, the count or the type get ncclInvalidUsage, every
// one of them (NCCL would hang or corrupt memory).
//
// Sends and receives run at the ncclGroupEnd that closes their group, as one exchange of every
// rank of the communicator: each rank's calls are posted, every rank checks that the j-th send
// from a to b and the j-th receive at b from a exist together and agree on the bytes, and all
// get ncclInvalidUsage if any pair does not (NCCL would hang). This emulation asks more than NCCL
// does: a send or receive outside a group, or a collective inside a group, is ncclInvalidUsage on
// its caller; so is a group over more than one communicator, at its ncclGroupEnd, on that rank
// alone (the others wait for it); and every rank with a call in a group must meet every other
// rank there (a group whose calls leave a rank out waits for it forever).
//
// What it does not emulate: streams and asynchrony (the call returns when the result is there),
// other operations than the sum, timeouts and ncclCommAbort: a rank that never arrives leaves the
// others waiting forever. ncclCommInitAll accepts a device more than once, for more ranks than
// devices; NCCL refuses that.
#pragma once

#include <cuda_runtime.h>

#include <barrier>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

enum ncclResult_t { ncclSuccess = 0, ncclInvalidArgument = 4, ncclInvalidUsage = 5 };  // NCCL's values
enum ncclDataType_t {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclChar = ncclInt8,
  ncclInt = ncclInt32,
  ncclFloat = ncclFloat32,
  ncclDouble = ncclFloat64,
};
enum ncclRedOp_t { ncclSum = 0 };
struct ncclComm;

namespace bellows_emulation::nccl {

/// What each rank brings to a collective, compared across ranks before anything is read.
struct post {
  const void* send = nullptr;
  std::size_t count = 0;
  int type = 0, op = 0;  // op: the reduction, or -1 for a gather
};

/// One ncclSend or ncclRecv of a group, to or from rank `peer`.
struct transfer {
  int peer = 0;
  bool sends = false;  // else it receives
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t bytes = 0;
};

/// The ranks made by one ncclCommInitAll: they meet at `meet` (twice a collective).
struct group {
  explicit group(int ranks)
      : size(ranks), meet(ranks), posts(static_cast<std::size_t>(ranks)), transfers(static_cast<std::size_t>(ranks)) {}
  int size;
  std::barrier<> meet;
  std::vector<post> posts;
  std::vector<const std::vector<transfer>*> transfers;  // each rank's group at its ncclGroupEnd
};

/// The calling thread's open group: its depth, communicator and sends and receives so far.
struct open_group {
  int depth = 0;
  bool mixed = false;  // calls on more than one communicator
  ncclComm* comm = nullptr;
  std::vector<transfer> calls;
};
inline open_group& this_thread() {
  thread_local open_group g;
  return g;
}

/// Bytes per element, 0 for a type this emulation does not know.
inline std::size_t element_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
  }
  return 0;
}

/// True when the `bytes` from p (at least one) begin and end in device memory.
inline bool on_device(const void* p, std::size_t bytes) {
  cudaPointerAttributes first{}, last{};
  return p != nullptr && cudaPointerGetAttributes(&first, p) == cudaSuccess &&
         cudaPointerGetAttributes(&last, static_cast<const char*>(p) + bytes - 1) == cudaSuccess &&
         first.type == cudaMemoryTypeDevice && last.type == cudaMemoryTypeDevice;
}

/// out = posts[0] + posts[1] + ... element by element, in rank order.
template <class T>
void sum(const std::vector<post>& posts, std::size_t count, std::byte* out) {
  std::vector<T> total(static_cast<const T*>(posts[0].send), static_cast<const T*>(posts[0].send) + count);
  for (std::size_t r = 1; r < posts.size(); ++r) {
    const auto* v = static_cast<const T*>(posts[r].send);
    for (std::size_t i = 0; i < count; ++i) total[i] += v[i];
  }
  std::memcpy(out, total.data(), count * sizeof(T));
}

}  // namespace bellows_emulation::nccl

struct ncclComm {
  std::shared_ptr<bellows_emulation::nccl::group> group;  // the last rank destroyed frees it
  int rank;
};
using ncclComm_t = ncclComm*;

inline const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
  }
  return "unknown result code";
}

/// ndev ranks in one group, rank i on devlist[i] (devices 0 .. ndev - 1 when devlist is null).
inline ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  int devices = 0;
  (void)cudaGetDeviceCount(&devices);
  if (comms == nullptr || ndev < 1) return ncclInvalidArgument;
  for (int i = 0; devlist != nullptr && i < ndev; ++i)
    if (devlist[i] < 0 || devlist[i] >= devices) return ncclInvalidArgument;
  auto g = std::make_shared<bellows_emulation::nccl::group>(ndev);
  for (int i = 0; i < ndev; ++i) comms[i] = new ncclComm{g, i};
  return ncclSuccess;
}
inline ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;  // null is allowed, as in NCCL
  return ncclSuccess;
}
inline ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}
inline ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return ncclInvalidArgument;
  *count = comm->group->size;
  return ncclSuccess;
}

namespace bellows_emulation::nccl {

/// One collective on the calling rank: meets the others, checks that they agree, lets `read`
/// fill this rank's result from everyone's posts, meets them again, then writes recv.
template <class Read>
ncclResult_t collective(ncclComm_t comm, post mine, std::size_t recv_bytes, void* recv, Read read) {
  if (this_thread().depth > 0) return ncclInvalidUsage;  // only sends and receives in a group
  group& g = *comm->group;
  g.posts[static_cast<std::size_t>(comm->rank)] = mine;
  g.meet.arrive_and_wait();
  bool agree = true;
  for (const post& p : g.posts) agree = agree && p.count == mine.count && p.type == mine.type && p.op == mine.op;
  std::vector<std::byte> result(agree ? recv_bytes : 0);
  if (agree) read(g.posts, result.data());
  g.meet.arrive_and_wait();  // every rank has read every send buffer
  if (!agree) return ncclInvalidUsage;
  std::memcpy(recv, result.data(), recv_bytes);
  return ncclSuccess;
}

}  // namespace bellows_emulation::nccl

/// recvbuff = the sum of every rank's sendbuff (count elements; the same buffer is allowed).
inline ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, std::size_t count, ncclDataType_t type,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  using namespace bellows_emulation::nccl;
  const std::size_t size = element_bytes(type), bytes = count * size;
  if (comm == nullptr || size == 0 || op != ncclSum) return ncclInvalidArgument;
  if (count == 0) return ncclSuccess;
  if (!on_device(sendbuff, bytes) || !on_device(recvbuff, bytes)) return ncclInvalidArgument;
  const auto add = [&](const std::vector<post>& posts, std::byte* out) {
    switch (type) {
      case ncclInt8: sum<std::int8_t>(posts, count, out); break;
      case ncclUint8: sum<std::uint8_t>(posts, count, out); break;
      case ncclInt32: sum<std::int32_t>(posts, count, out); break;
      case ncclUint32: sum<std::uint32_t>(posts, count, out); break;
      case ncclInt64: sum<std::int64_t>(posts, count, out); break;
      case ncclUint64: sum<std::uint64_t>(posts, count, out); break;
      case ncclFloat32: sum<float>(posts, count, out); break;
      case ncclFloat64: sum<double>(posts, count, out); break;
    }
  };
  return collective(comm, {sendbuff, count, type, op}, bytes, recvbuff, add);
}

/// Rank r's sendcount elements land at recvbuff + r * sendcount elements; sendbuff may be that
/// very place (in place).
inline ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, std::size_t sendcount, ncclDataType_t type,
                                  ncclComm_t comm, cudaStream_t) {
  using namespace bellows_emulation::nccl;
  const std::size_t size = element_bytes(type), bytes = sendcount * size;
  if (comm == nullptr || size == 0) return ncclInvalidArgument;
  if (sendcount == 0) return ncclSuccess;
  const std::size_t ranks = static_cast<std::size_t>(comm->group->size);
  if (!on_device(sendbuff, bytes) || !on_device(recvbuff, ranks * bytes)) return ncclInvalidArgument;
  const auto concatenate = [&](const std::vector<post>& posts, std::byte* out) {
    for (std::size_t r = 0; r < ranks; ++r) std::memcpy(out + r * bytes, posts[r].send, bytes);
  };
  return collective(comm, {sendbuff, sendcount, type, -1}, ranks * bytes, recvbuff, concatenate);
}

namespace bellows_emulation::nccl {

/// A send or receive of `count` elements of `type`, queued in the calling thread's open group.
inline ncclResult_t queue(bool sends, const void* send, void* recv, std::size_t count, ncclDataType_t type, int peer,
                          ncclComm_t comm) {
  const std::size_t size = element_bytes(type), bytes = count * size;
  if (comm == nullptr || size == 0 || peer < 0 || peer >= comm->group->size) return ncclInvalidArgument;
  if (bytes > 0 && !on_device(sends ? send : recv, bytes)) return ncclInvalidArgument;
  open_group& g = this_thread();
  if (g.depth == 0) return ncclInvalidUsage;
  g.mixed = g.mixed || (g.comm != nullptr && g.comm != comm);
  g.comm = comm;
  g.calls.push_back({peer, sends, send, recv, bytes});
  return ncclSuccess;
}

/// Whether every send from rank a to rank b has its receive at b, in the same order and of the
/// same bytes, and no receive is left over, over all pairs.
inline bool matched(const std::vector<const std::vector<transfer>*>& all) {
  const std::size_t w = all.size();
  for (std::size_t a = 0; a < w; ++a)
    for (std::size_t b = 0; b < w; ++b) {
      std::vector<std::size_t> sent, received;
      for (const transfer& t : *all[a])
        if (t.sends && static_cast<std::size_t>(t.peer) == b) sent.push_back(t.bytes);
      for (const transfer& t : *all[b])
        if (!t.sends && static_cast<std::size_t>(t.peer) == a) received.push_back(t.bytes);
      if (sent != received) return false;
    }
  return true;
}

}  // namespace bellows_emulation::nccl

inline ncclResult_t ncclGroupStart() {
  ++bellows_emulation::nccl::this_thread().depth;
  return ncclSuccess;
}

/// Runs the group's sends and receives when it closes the outermost group (see the top).
inline ncclResult_t ncclGroupEnd() {
  using namespace bellows_emulation::nccl;
  open_group& open = this_thread();
  if (open.depth == 0) return ncclInvalidUsage;
  if (--open.depth > 0) return ncclSuccess;
  const std::vector<transfer> calls = std::move(open.calls);
  ncclComm* comm = open.comm;
  const bool mixed = open.mixed;
  open = {};
  if (calls.empty()) return ncclSuccess;
  if (mixed) return ncclInvalidUsage;
  group& g = *comm->group;
  const std::size_t me = static_cast<std::size_t>(comm->rank);
  g.transfers[me] = &calls;
  g.meet.arrive_and_wait();
  const bool agree = matched(g.transfers);
  // Each receive reads the matching send into a buffer of its own before anyone writes.
  std::vector<std::vector<std::byte>> got;
  for (std::size_t i = 0; agree && i < calls.size(); ++i) {
    if (calls[i].sends) continue;
    const std::size_t from = static_cast<std::size_t>(calls[i].peer);
    std::size_t nth = 0;  // this is the nth receive from `from`
    for (std::size_t j = 0; j < i; ++j) nth += !calls[j].sends && calls[j].peer == calls[i].peer;
    for (const transfer& t : *g.transfers[from])
      if (t.sends && static_cast<std::size_t>(t.peer) == me && nth-- == 0) {
        const auto* b = static_cast<const std::byte*>(t.send);
        got.emplace_back(b, b + t.bytes);
        break;
      }
  }
  g.meet.arrive_and_wait();  // every rank has read every send buffer
  if (!agree) return ncclInvalidUsage;
  std::size_t k = 0;
  for (const transfer& t : calls)
    if (!t.sends) {
      if (t.bytes > 0) std::memcpy(t.recv, got[k].data(), t.bytes);
      ++k;
    }
  return ncclSuccess;
}

/// Queues `count` elements from sendbuff for rank `peer`, sent at the group's end.
inline ncclResult_t ncclSend(const void* sendbuff, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                             cudaStream_t) {
  return bellows_emulation::nccl::queue(true, sendbuff, nullptr, count, type, peer, comm);
}

/// Queues `count` elements from rank `peer` into recvbuff, received at the group's end.
inline ncclResult_t ncclRecv(void* recvbuff, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                             cudaStream_t) {
  return bellows_emulation::nccl::queue(false, nullptr, recvbuff, count, type, peer, comm);
}
