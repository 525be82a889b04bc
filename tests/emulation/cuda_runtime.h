// SPDX-License-Identifier: Apache-2.0
// A CPU emulation of the parts of CUDA that bellows' kernels and their tests use, so that the
// CUDA tests also run where there is no GPU (tests/CMakeLists.txt builds them against this
// header, with a host compiler, instead of the toolkit's). It checks what a kernel computes:
// indexing, tails, block and warp cooperation, the host-side arithmetic it must match. It says
// nothing about speed, the memory model or the GPU's own rounding of intrinsics.
//
// How it runs a kernel: at launch, at once (streams are ignored; every call is synchronous),
// block after block; the threads of a block are fibers on the calling OS thread (x86-64 only:
// the switch between them is a few lines of assembly). A thread runs until it reaches a
// barrier: __syncthreads (all live threads of the block) or a warp operation (__syncwarp,
// shuffles, __reduce_add_sync: all live threads of its warp). A barrier opens when
// every live thread it names waits at it; threads that returned from the kernel no longer
// count, as on the GPU. When no barrier can open, the kernel is stuck (a barrier inside
// divergent code), and the emulation aborts saying so; so does a shuffle that reads a lane that
// has left. __shared__ variables are static: one copy that every thread of a block sees.
// "Device" memory is host memory filled with 0xA5 bytes when allocated, so a kernel that reads
// what nobody wrote gets garbage, as it would on a GPU. Under AddressSanitizer the switches
// between stacks are announced to it, and buffers are exactly their size: a kernel's access past
// the end is reported with the kernel's line.
//
// Devices and host threads: the machine has three devices (cudaSetDevice picks one per host
// thread, as CUDA does), all sharing the one host memory, so that a test can run several NCCL
// ranks (tests/emulation/nccl.h) on threads of one process. Host threads may call the runtime
// and launch kernels at the same time: launches take turns (one mutex held for a whole grid, so
// the fibers, threadIdx and the static __shared__ variables serve one kernel at a time), the
// launch error and the current device are per host thread, and the registry of allocations,
// which tells device pointers from host ones (cudaPointerGetAttributes), has its own mutex.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define BELLOWS_EMULATION_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BELLOWS_EMULATION_ASAN 1
#endif
#endif
#if defined(BELLOWS_EMULATION_ASAN)
#include <sanitizer/common_interface_defs.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __launch_bounds__(...)
#define __shared__ static

using std::isfinite;

struct uint3 {
  unsigned x = 1, y = 1, z = 1;
};
inline uint3 threadIdx{0, 0, 0}, blockIdx{0, 0, 0}, blockDim, gridDim;

struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

// ---- runtime API ---------------------------------------------------------------------------

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
};
using cudaError = cudaError_t;
enum cudaMemcpyKind {
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};
struct cudaPointerAttributes {
  cudaMemoryType type = cudaMemoryTypeUnregistered;
  int device = 0;
  void* devicePointer = nullptr;
  void* hostPointer = nullptr;
};
struct CUstream_st {};
using cudaStream_t = CUstream_st*;

namespace bellows_emulation {
inline constexpr int devices = 3;
inline thread_local int current_device = 0;
inline thread_local cudaError_t last_error = cudaSuccess;
inline cudaError_t fail(cudaError_t e) {
  last_error = e;
  return e;
}

/// The live cudaMalloc blocks: base address -> bytes and the device current when it was allocated.
struct allocations {
  struct block {
    std::size_t bytes;
    int device;
  };
  std::mutex mutex;
  std::map<std::uintptr_t, block> blocks;
};
inline allocations allocated;
}  // namespace bellows_emulation

inline cudaError_t cudaGetLastError() { return std::exchange(bellows_emulation::last_error, cudaSuccess); }
inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
  }
  return "cudaErrorUnknown";
}
inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
  }
  return "unknown error";
}
inline cudaError_t cudaGetDeviceCount(int* count) {
  *count = bellows_emulation::devices;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= bellows_emulation::devices) return bellows_emulation::fail(cudaErrorInvalidDevice);
  bellows_emulation::current_device = device;
  return cudaSuccess;
}
inline cudaError_t cudaGetDevice(int* device) {
  *device = bellows_emulation::current_device;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

inline cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  *p = nullptr;
  if (bytes > (std::size_t{1} << 40)) return bellows_emulation::fail(cudaErrorMemoryAllocation);
  // exactly `bytes` (256-aligned, as cudaMalloc's), so that AddressSanitizer sees a kernel
  // reading or writing past the end
  if (posix_memalign(p, 256, std::max<std::size_t>(bytes, 1)) != 0) {
    *p = nullptr;
    return bellows_emulation::fail(cudaErrorMemoryAllocation);
  }
  std::memset(*p, 0xA5, bytes);
  using namespace bellows_emulation;
  std::lock_guard lock(allocated.mutex);
  allocated.blocks[reinterpret_cast<std::uintptr_t>(*p)] = {bytes, current_device};
  return cudaSuccess;
}
template <class T>
cudaError_t cudaMalloc(T** p, std::size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
/// Frees a block of cudaMalloc (nullptr: nothing); any other pointer is an invalid value, as CUDA
/// reports it, and is left alone.
inline cudaError_t cudaFree(void* p) {
  using namespace bellows_emulation;
  if (p == nullptr) return cudaSuccess;
  std::unique_lock lock(allocated.mutex);
  const auto block = allocated.blocks.find(reinterpret_cast<std::uintptr_t>(p));
  if (block == allocated.blocks.end()) return fail(cudaErrorInvalidValue);
  void* base = reinterpret_cast<void*>(block->first);
  allocated.blocks.erase(block);
  lock.unlock();
  std::free(base);
  return cudaSuccess;
}
/// Pinned host memory: plain host memory here, which every copy reaches at once.
inline cudaError_t cudaMallocHost(void** p, std::size_t bytes) {
  *p = std::malloc(std::max<std::size_t>(bytes, 1));
  return *p != nullptr ? cudaSuccess : bellows_emulation::fail(cudaErrorMemoryAllocation);
}
inline cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}
/// Where p points: Device (on the device current at its allocation) inside a live cudaMalloc
/// block, Unregistered anywhere else, as CUDA says of plain host memory. Nothing here is Host
/// (pinned) or Managed memory.
inline cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* p) {
  using namespace bellows_emulation;
  if (attributes == nullptr) return fail(cudaErrorInvalidValue);
  *attributes = {};
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(allocated.mutex);
  const auto after = allocated.blocks.upper_bound(address);
  if (after == allocated.blocks.begin()) return cudaSuccess;
  const auto& [base, block] = *std::prev(after);  // the last block starting at or before p
  if (address - base >= block.bytes) return cudaSuccess;
  attributes->type = cudaMemoryTypeDevice;
  attributes->device = block.device;
  attributes->devicePointer = const_cast<void*>(p);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* to, const void* from, std::size_t bytes, cudaMemcpyKind) {
  if (bytes != 0) std::memmove(to, from, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* to, const void* from, std::size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t = nullptr) {
  return cudaMemcpy(to, from, bytes, kind);
}
inline cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t = nullptr) {
  if (bytes != 0) std::memset(p, value, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = new CUstream_st;
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete s;
  return cudaSuccess;
}
/// How many times this host thread waited for a stream (cudaStreamSynchronize), for the tests
/// that count a step's waits; BELLOWS_EMULATED_CUDA tells them the count is there.
#define BELLOWS_EMULATED_CUDA 1
inline std::uint64_t& bellows_emulated_waits() {
  thread_local std::uint64_t waits = 0;
  return waits;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) {
  ++bellows_emulated_waits();
  return cudaSuccess;
}

// ---- the block scheduler -------------------------------------------------------------------

// Switching between fibers: saves the callee-saved registers of x86-64 on the current stack,
// stores the stack pointer in *from and continues on the stack `to` (no system call, unlike
// swapcontext, which saves the signal mask on every switch).
extern "C" void bellows_emulation_switch(void** from, void* to);
asm(R"(
  .pushsection .text
  .weak bellows_emulation_switch
  .type bellows_emulation_switch, @function
bellows_emulation_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size bellows_emulation_switch, .-bellows_emulation_switch
  .popsection
)");

namespace bellows_emulation {

enum class wait : unsigned char { running, block, warp, done };

struct fiber {
  void* stack_pointer = nullptr;  // where its registers are saved while it is not running
  std::unique_ptr<char[]> stack;
  wait state = wait::done;
  void* asan_fake_stack = nullptr;
};

/// The fibers are made once and kept: a fiber that finished its thread of one block runs the
/// same thread of the next block (or of the next launch) when the scheduler resumes it.
struct machine {
  static constexpr std::size_t stack_bytes = 64 * 1024;
  std::deque<fiber> threads;  // a deque: a suspended fiber's references to itself stay valid
  void* scheduler = nullptr;
  const void* scheduler_stack = nullptr;  // its bottom and size, for AddressSanitizer
  std::size_t scheduler_stack_bytes = 0;
  void* scheduler_fake_stack = nullptr;
  unsigned current = 0;
  void (*entry)(void*) = nullptr;
  void* entry_context = nullptr;
  std::uint64_t exchange[1024];  // one slot a thread, for shuffles and votes
  int block_vote = 0;            // __syncthreads_or's result for the block
};
inline machine m;
inline std::mutex m_mutex;  // held by the host thread whose kernel runs on m

[[noreturn]] inline void stuck(const char* what) {
  std::fprintf(stderr, "cuda emulation: %s (block %u)\n", what, blockIdx.x);
  std::abort();
}

/// Switches from the stack running now to `to` (saved in *from meanwhile), telling
/// AddressSanitizer, where it runs, which stack the code runs on after the switch; when
/// `back_bottom` is given, learns there (and in back_bytes) the stack that switched back here.
inline void switch_stacks(void** from, void* to, void** fake_stack, const void* to_bottom, std::size_t to_bytes,
                          const void** back_bottom = nullptr, std::size_t* back_bytes = nullptr) {
#if defined(BELLOWS_EMULATION_ASAN)
  __sanitizer_start_switch_fiber(fake_stack, to_bottom, to_bytes);
  bellows_emulation_switch(from, to);
  __sanitizer_finish_switch_fiber(*fake_stack, back_bottom, back_bytes);
#else
  (void)fake_stack, (void)to_bottom, (void)to_bytes, (void)back_bottom, (void)back_bytes;
  bellows_emulation_switch(from, to);
#endif
}

/// The calling thread waits at a barrier until the scheduler opens it. The scheduler that
/// resumes it may run on another host thread's stack than the one it left (a fiber that finished
/// one launch starts the next, whichever host thread launches it): learn that stack again.
inline void arrive(wait at) {
  fiber& f = m.threads[m.current];
  f.state = at;
  switch_stacks(&f.stack_pointer, m.scheduler, &f.asan_fake_stack, m.scheduler_stack, m.scheduler_stack_bytes,
                &m.scheduler_stack, &m.scheduler_stack_bytes);
}

[[noreturn]] inline void fiber_main() {
#if defined(BELLOWS_EMULATION_ASAN)
  // the first switch into a fiber ends here: learn the scheduler's stack, to switch back to it
  __sanitizer_finish_switch_fiber(nullptr, &m.scheduler_stack, &m.scheduler_stack_bytes);
#endif
  for (;;) {
    m.entry(m.entry_context);
    arrive(wait::done);
  }
}

/// A fiber whose first switch enters fiber_main on its own stack: the six saved registers
/// (zero), then fiber_main as the return address, with the stack aligned as after a call.
inline void make_fiber(fiber& f) {
  f.stack = std::make_unique<char[]>(machine::stack_bytes);
  auto top = reinterpret_cast<std::uintptr_t>(f.stack.get() + machine::stack_bytes) / 16 * 16;
  auto* slots = reinterpret_cast<void**>(top - 64);
  for (int r = 0; r < 6; ++r) slots[r] = nullptr;
  slots[6] = reinterpret_cast<void*>(&fiber_main);
  slots[7] = nullptr;
  f.stack_pointer = slots;
}

/// Opens what can open: whole warps waiting at warp barriers, else the block barrier when every
/// live thread waits at it. False when the block has finished.
inline bool open_barriers(unsigned threads) {
  bool live = false, opened = false;
  for (unsigned w = 0; w * 32 < threads; ++w) {
    const unsigned lo = w * 32, hi = std::min(threads, lo + 32);
    bool all_at_warp = true, any = false;
    for (unsigned t = lo; t < hi; ++t) {
      if (m.threads[t].state == wait::done) continue;
      any = true;
      all_at_warp &= m.threads[t].state == wait::warp;
    }
    live |= any;
    if (any && all_at_warp) {
      for (unsigned t = lo; t < hi; ++t)
        if (m.threads[t].state == wait::warp) m.threads[t].state = wait::running;
      opened = true;
    }
  }
  if (!live || opened) return live;
  for (unsigned t = 0; t < threads; ++t)
    if (m.threads[t].state == wait::warp) stuck("a warp waits at a warp barrier that some of its threads never reach");
  for (unsigned t = 0; t < threads; ++t)
    if (m.threads[t].state == wait::block) m.threads[t].state = wait::running;
  return true;
}

inline void run_grid(unsigned blocks, unsigned threads, void (*entry)(void*), void* context) {
  while (m.threads.size() < threads) make_fiber(m.threads.emplace_back());
  m.entry = entry;
  m.entry_context = context;
  gridDim = {blocks, 1, 1};
  blockDim = {threads, 1, 1};
  for (unsigned b = 0; b < blocks; ++b) {
    blockIdx = {b, 0, 0};
    for (unsigned t = 0; t < threads; ++t) m.threads[t].state = wait::running;
    do {
      for (unsigned t = 0; t < threads; ++t) {
        if (m.threads[t].state != wait::running) continue;
        m.current = t;
        threadIdx = {t, 0, 0};
        switch_stacks(&m.scheduler, m.threads[t].stack_pointer, &m.scheduler_fake_stack, m.threads[t].stack.get(),
                      machine::stack_bytes);
      }
    } while (open_barriers(threads));
  }
}

/// Kernels the calling host thread has launched (each rank of a test runs on its own thread): a
/// test counts a step's launches as the difference of two readings.
inline thread_local std::uint64_t launched = 0;

/// Runs kernel(args...) over the grid, now, after any kernel another host thread is running. A bad
/// configuration sets the launch error, as CUDA's does.
template <class... Params>
void launch(void (*kernel)(Params...), unsigned blocks, unsigned threads, cudaStream_t, Params... args) {
  ++launched;
  if (blocks == 0 || threads == 0 || threads > 1024) {
    fail(cudaErrorInvalidConfiguration);
    return;
  }
  struct call {
    void (*kernel)(Params...);
    std::tuple<Params...> args;
  } pending{kernel, std::tuple<Params...>(args...)};
  std::lock_guard lock(m_mutex);
  run_grid(
      blocks, threads,
      [](void* p) {
        auto* c = static_cast<call*>(p);
        std::apply(c->kernel, c->args);  // each thread gets its own copies of the parameters
      },
      &pending);
}

/// The value `v` of lane `source` (an index within the calling thread's warp), exchanged
/// between the warp's live threads.
template <class T>
T from_lane(T v, unsigned source) {
  static_assert(sizeof(T) <= sizeof(std::uint64_t) && std::is_trivially_copyable_v<T>);
  const unsigned me = threadIdx.x, from = me / 32 * 32 + source;
  std::memcpy(&m.exchange[me], &v, sizeof(T));
  arrive(wait::warp);
  if (from >= blockDim.x || m.threads[from].state == wait::done)
    stuck("a shuffle reads a lane that has left or does not exist");
  T r;
  std::memcpy(&r, &m.exchange[from], sizeof(T));
  arrive(wait::warp);  // nobody writes its slot again before every lane has read
  return r;
}

}  // namespace bellows_emulation

// ---- device functions ----------------------------------------------------------------------

inline void __syncthreads() { bellows_emulation::arrive(bellows_emulation::wait::block); }
inline int __syncthreads_or(int predicate) {
  using namespace bellows_emulation;
  m.exchange[threadIdx.x] = predicate != 0;
  arrive(wait::block);
  // The lowest live thread ORs the votes once for the block (once per thread would cost the
  // square of the block's size); every thread reads the result after the second barrier, and
  // has read it before the next call's first barrier lets the lowest write it again.
  unsigned lowest = 0;
  while (m.threads[lowest].state == wait::done) ++lowest;
  if (threadIdx.x == lowest) {
    m.block_vote = 0;
    for (unsigned t = lowest; t < blockDim.x; ++t)
      m.block_vote |= m.threads[t].state != wait::done && m.exchange[t] != 0;
  }
  arrive(wait::block);
  return m.block_vote;
}
inline void __syncwarp(unsigned = 0xFFFFFFFFu) { bellows_emulation::arrive(bellows_emulation::wait::warp); }

template <class T>
T __shfl_sync(unsigned, T v, int source, int width = 32) {
  const unsigned lane = threadIdx.x % 32, w = static_cast<unsigned>(width);
  return bellows_emulation::from_lane(v, lane / w * w + static_cast<unsigned>(source) % w);
}
template <class T>
T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
  const unsigned lane = threadIdx.x % 32, w = static_cast<unsigned>(width);
  const unsigned source = lane ^ static_cast<unsigned>(mask);
  // a lane of a later group of `width` lanes gives back the caller's own value
  return bellows_emulation::from_lane(v, source / w > lane / w ? lane : source);
}

inline unsigned __reduce_add_sync(unsigned, unsigned v) {
  using namespace bellows_emulation;
  const unsigned me = threadIdx.x, lo = me / 32 * 32, hi = std::min(blockDim.x, lo + 32);
  m.exchange[me] = v;
  arrive(wait::warp);
  unsigned sum = 0;
  for (unsigned t = lo; t < hi; ++t) {
    if (m.threads[t].state == wait::done) stuck("__reduce_add_sync with a lane that has left");
    sum += static_cast<unsigned>(m.exchange[t]);
  }
  arrive(wait::warp);
  return sum;
}

/// The position of the offset-th set bit of `mask` counting up from bit `base` (offset >= 1;
/// the only form bellows uses), or 0xFFFFFFFF when there are fewer.
inline unsigned __fns(unsigned mask, unsigned base, int offset) {
  if (offset < 1) bellows_emulation::stuck("__fns with offset < 1 is not emulated");
  for (unsigned b = base; b < 32; ++b)
    if ((mask >> b & 1u) != 0 && --offset == 0) return b;
  return 0xFFFFFFFFu;
}

template <class T>
T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <class T>
T atomicOr(T* p, T v) {
  const T old = *p;
  *p = old | v;
  return old;
}

template <class A, class B>
auto min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(a) : static_cast<C>(b);
}
template <class A, class B>
auto max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
}

inline int __popc(unsigned x) { return std::popcount(x); }
inline int __ffsll(long long x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned long long>(x)) + 1; }

inline std::uint32_t __float_as_uint(float x) { return std::bit_cast<std::uint32_t>(x); }
inline float __uint_as_float(std::uint32_t x) { return std::bit_cast<float>(x); }
// The tests build with -ffp-contract=off: each operation rounds on its own, as the _rn forms do.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }

template <class T>
T __ldg(const T* p) {
  return *p;
}
template <class T>
T __ldcs(const T* p) {
  return *p;
}
template <class T>
void __stcs(T* p, T v) {
  *p = v;
}
