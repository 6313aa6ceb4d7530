// cudaemu: "CUDA on the CPU" for testing.  The UNCHANGED .cu kernel sources are
// compiled by the host C++ compiler against this header (which stands in for
// <cuda_runtime.h>) and executed on the CPU, so their results can be compared
// with the C++ CPU backend on machines without a GPU.
//
// Execution model
//   * blocks run one after another, in forward, reverse or random order;
//   * the threads of a block are fibers on ONE OS thread (a hand-written
//     x86-64 context switch, ucontext elsewhere: cudaemu_runtime.cpp).  A
//     fiber runs until it reaches a synchronisation point (__syncthreads*, a
//     warp collective) or exits; then the scheduler resumes the next ready
//     fiber (forward, reverse or random order, re-drawn every round).  As a
//     fiber runs as far ahead as it can, a missing __syncthreads (a read
//     before the write, or an overwrite before the read, of shared memory)
//     gives wrong results, and different thread orders expose it;
//   * __syncthreads*: every live thread must arrive at the same call site
//     (threads that exited count as arrived, as on the hardware); warp
//     collectives (__shfl_*_sync, __any/__all/__ballot_sync, __syncwarp): the
//     mask must name exactly the lanes that arrive, all at one call site, and
//     no exited lane.  A divergent barrier, a mask error or a deadlock ends the
//     launch with cudaErrorLaunchFailure and a message naming the .cu file and
//     line (cudaGetErrorString returns it; it is also printed to stderr);
//   * __shared__ variables are statics (one block runs at a time, so a static
//     IS the block's shared memory); the rewrite tool (rewrite.py) adds a
//     ::cudaemu::shared_decl call after each declaration, which fills the
//     variable with the poison byte the first time a thread of each block
//     reaches it (reads of never-written shared memory then see garbage) and
//     checks the 48 KiB static shared-memory limit;
//   * atomics are plain read-modify-writes (one fiber runs at a time);
//   * launch configurations are checked against the device limits.
// Kernel launches k<<<g, b, smem, stream>>>(args) are rewritten to
// ::cudaemu::launch(k, __FILE__, __LINE__, g, b, smem, stream)(args) by rewrite.py.
//
// What this cannot show: the device maths library (host libm is used), real
// CUB (cub_host.h), races between blocks (blocks never overlap), timing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__) && !defined(CUDAEMU_UCONTEXT)
#define CUDAEMU_ASM_SWITCH 1
#else
#define CUDAEMU_ASM_SWITCH 0
#include <ucontext.h>
#endif

// ---- keywords ----------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __constant__ static
#define __shared__ static

// ---- vector types, runtime enums -----------------------------------------------
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorLaunchFailure = 719,
};
using cudaError = cudaError_t;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace cudaemu {

enum class Order { Forward, Reverse, Random };
enum class Wait : uint8_t { Ready, Block, Warp, Done };

struct Context {  // a suspended execution context
#if CUDAEMU_ASM_SWITCH
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
};

struct Fiber {
  Context ctx;
  char* stack = nullptr;
  uint3 tid{0, 0, 0};
  int linear = 0;
  Wait wait = Wait::Ready;
  const char* what = "";   // the pending collective
  const char* file = "";   // its call site
  int line = 0;
  unsigned mask = 0;        // warp collectives: participating lanes
  int pred = 0;             // __syncthreads_count/and/or
  uint64_t value = 0;       // warp exchange payload
  uint64_t result = 0;      // block collectives: the result
  const uint64_t* table = nullptr;  // warp collectives: the 32 exchanged values
  void* asan_fake = nullptr;
};

struct Stats {
  uint64_t switches = 0, blocks = 0, launches = 0;
};

struct State {
  Context sched;
  std::vector<Fiber> fibers;
  std::vector<uint64_t> warp_tables;  // [warp][32]
  std::vector<int> order;
  Fiber* cur = nullptr;
  uint3 block_idx{0, 0, 0};
  dim3 block_dim, grid_dim;
  std::function<void()> body;
  const char* launch_file = "";
  int launch_line = 0;
  cudaError_t last_error = cudaSuccess;
  std::string message;  // of the last failure
  bool failed = false;  // the running launch hit a failure
  std::mt19937 rng{12345};
  Order thread_order = Order::Forward, block_order = Order::Forward;
  int poison = 0x7F;
  Stats stats;
  uint64_t block_serial = 0;  // blocks run so far (shared-memory generations)
  size_t block_smem = 0;      // static shared bytes declared by this block
  const void* asan_sched_bottom = nullptr;
  size_t asan_sched_size = 0;
};

extern State g_state;
inline State& st() { return g_state; }

// Schedule of later launches (orders, shared-memory poison byte, RNG seed).
void configure(Order thread_order, Order block_order, int poison, unsigned seed);

// Ends the running launch with `message` (printf format).  From a kernel
// (fiber) it never returns; from host code it returns after recording it.
void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] void outside_kernel(const char* what);

inline Fiber& self() {
  Fiber* f = g_state.cur;
  if (!f) outside_kernel("a device built-in");
  return *f;
}

// Runs the grid: `st().body` is every thread's code.
void run_grid(dim3 grid, dim3 block);

template <typename... P>
struct Launcher {
  void (*kernel)(P...);
  const char* file;
  int line;
  dim3 grid, block;
  size_t smem;

  template <typename... A>
  void operator()(A&&... args) const {
    State& s = st();
    s.launch_file = file;
    s.launch_line = line;
    s.failed = false;
    const uint64_t threads = uint64_t(block.x) * block.y * block.z;
    // Device limits of every GPU since sm_30.
    if (threads == 0 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
        grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 ||
        grid.z > 65535) {
      fail("invalid launch configuration at %s:%d: grid (%u, %u, %u), block (%u, %u, %u)", file,
           line, grid.x, grid.y, grid.z, block.x, block.y, block.z);
      s.last_error = cudaErrorInvalidConfiguration;
      s.failed = false;
      return;
    }
    if (smem != 0) {
      fail("dynamic shared memory is not emulated (launch at %s:%d)", file, line);
      s.last_error = cudaErrorLaunchFailure;
      s.failed = false;
      return;
    }
    // Kernel arguments are copied once, as for a real launch.
    std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
    auto k = kernel;
    s.body = [&params, k] { std::apply(k, params); };
    run_grid(grid, block);
    s.body = nullptr;
  }
};

template <typename... P>
Launcher<P...> launch(void (*kernel)(P...), const char* file, int line, dim3 grid, dim3 block,
                      size_t smem = 0, cudaStream_t = nullptr) {
  return Launcher<P...>{kernel, file, line, grid, block, smem};
}

// A __shared__ declaration was reached: poison it once per block, and count it.
void shared_decl(void* p, size_t bytes, const char* file, int line);

// ---- collectives -------------------------------------------------------------
uint64_t block_barrier(const char* what, const char* file, int line, int pred);
// Returns the warp's 32 exchanged values (valid until this lane's next collective).
const uint64_t* warp_exchange(const char* what, const char* file, int line, unsigned mask,
                              uint64_t value);

template <typename T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8, "warp exchange of types up to 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

inline int src_xor(int lane, int m, int width) { return (lane & ~(width - 1)) | ((lane ^ m) & (width - 1)); }
inline int src_down(int lane, int d, int width) {
  const int base = lane & ~(width - 1), off = lane & (width - 1);
  return off + d < width ? base + off + d : lane;
}
inline int src_up(int lane, int d, int width) {
  const int base = lane & ~(width - 1), off = lane & (width - 1);
  return off - d >= 0 ? base + off - d : lane;
}
inline int src_idx(int lane, int s, int width) { return (lane & ~(width - 1)) | (s & (width - 1)); }

template <typename T>
T shfl(const char* what, const char* file, int line, unsigned mask, T v,
       int (*src_of_lane)(int lane, int arg, int width), int arg, int width) {
  const uint64_t* t = warp_exchange(what, file, line, mask, to_bits(v));
  const int lane = self().linear & 31;
  const int src = src_of_lane(lane, arg, width);
  // Reading a lane outside the mask is undefined on the hardware.
  if (!(mask >> src & 1u))
    fail("%s at %s:%d: lane %d reads lane %d, which is not in the mask 0x%08x", what, file, line,
         lane, src, mask);
  return from_bits<T>(t[src]);
}

inline unsigned ballot(const char* what, const char* file, int line, unsigned mask, int pred) {
  const uint64_t* t = warp_exchange(what, file, line, mask, pred != 0);
  unsigned b = 0;
  for (int l = 0; l < 32; ++l)
    if ((mask >> l & 1u) && t[l]) b |= 1u << l;
  return b;
}

inline int width_arg() { return 32; }
inline int width_arg(int w) { return w; }
inline unsigned syncwarp_mask() { return 0xffffffffu; }
inline unsigned syncwarp_mask(unsigned m) { return m; }

}  // namespace cudaemu

// ---- built-in variables ----------------------------------------------------------
#define threadIdx (::cudaemu::self().tid)
#define blockIdx (::cudaemu::st().block_idx)
#define blockDim (::cudaemu::st().block_dim)
#define gridDim (::cudaemu::st().grid_dim)
constexpr int warpSize = 32;

// ---- synchronisation ----------------------------------------------------------------
#define CUDAEMU_BARRIER(name, p) ::cudaemu::block_barrier(name, __FILE__, __LINE__, (p) ? 1 : 0)
#define __syncthreads() ((void)CUDAEMU_BARRIER("__syncthreads", 0))
#define __syncthreads_count(p) int(CUDAEMU_BARRIER("__syncthreads_count", p))
#define __syncthreads_and(p) int(CUDAEMU_BARRIER("__syncthreads_and", p))
#define __syncthreads_or(p) int(CUDAEMU_BARRIER("__syncthreads_or", p))
#define __syncwarp(...) \
  ((void)::cudaemu::ballot("__syncwarp", __FILE__, __LINE__, ::cudaemu::syncwarp_mask(__VA_ARGS__), 1))
#define __ballot_sync(m, p) ::cudaemu::ballot("__ballot_sync", __FILE__, __LINE__, (m), (p) ? 1 : 0)
#define __any_sync(m, p) \
  int(::cudaemu::ballot("__any_sync", __FILE__, __LINE__, (m), (p) ? 1 : 0) != 0u)
#define __all_sync(m, p) \
  int(::cudaemu::ballot("__all_sync", __FILE__, __LINE__, (m), (p) ? 1 : 0) == unsigned(m))
#define CUDAEMU_SHFL(name, src, m, v, a, ...)                                          \
  ::cudaemu::shfl(name, __FILE__, __LINE__, (m), (v), ::cudaemu::src, (a), \
                  ::cudaemu::width_arg(__VA_ARGS__))
#define __shfl_sync(m, v, s, ...) CUDAEMU_SHFL("__shfl_sync", src_idx, m, v, s, ##__VA_ARGS__)
#define __shfl_xor_sync(m, v, x, ...) CUDAEMU_SHFL("__shfl_xor_sync", src_xor, m, v, x, ##__VA_ARGS__)
#define __shfl_down_sync(m, v, d, ...) CUDAEMU_SHFL("__shfl_down_sync", src_down, m, v, d, ##__VA_ARGS__)
#define __shfl_up_sync(m, v, d, ...) CUDAEMU_SHFL("__shfl_up_sync", src_up, m, v, d, ##__VA_ARGS__)
#define __activemask() (::cudaemu::outside_kernel("__activemask (no deterministic emulation)"), 0u)

// ---- atomics (one fiber runs at a time) -------------------------------------------
template <typename T>
inline T atomicAdd(T* a, T v) {
  T old = *a;
  *a = old + v;
  return old;
}
template <typename T>
inline T atomicMax(T* a, T v) {
  T old = *a;
  *a = old > v ? old : v;
  return old;
}
template <typename T>
inline T atomicMin(T* a, T v) {
  T old = *a;
  *a = old < v ? old : v;
  return old;
}
template <typename T>
inline T atomicExch(T* a, T v) {
  T old = *a;
  *a = v;
  return old;
}
template <typename T>
inline T atomicCAS(T* a, T cmp, T v) {
  T old = *a;
  if (old == cmp) *a = v;
  return old;
}

// ---- loads, bit casts, integer min/max ------------------------------------------------
template <typename T>
inline T __ldg(const T* p) { return *p; }
inline unsigned __float_as_uint(float f) { return ::cudaemu::from_bits<unsigned>(::cudaemu::to_bits(f)); }
inline int __float_as_int(float f) { return ::cudaemu::from_bits<int>(::cudaemu::to_bits(f)); }
inline float __uint_as_float(unsigned u) { return ::cudaemu::from_bits<float>(u); }
inline float __int_as_float(int u) { return ::cudaemu::from_bits<float>(uint32_t(u)); }
inline long long __double_as_longlong(double d) { return ::cudaemu::from_bits<long long>(::cudaemu::to_bits(d)); }
inline double __longlong_as_double(long long b) { return ::cudaemu::from_bits<double>(uint64_t(b)); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }

// ---- runtime API (host memory is device memory; everything is synchronous) -----------
inline cudaError_t cudaGetLastError() {
  cudaError_t e = ::cudaemu::st().last_error;
  ::cudaemu::st().last_error = cudaSuccess;
  return e;
}
inline cudaError_t cudaPeekAtLastError() { return ::cudaemu::st().last_error; }
const char* cudaGetErrorString(cudaError_t e);
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind,
                                   cudaStream_t = nullptr) {
  std::memmove(dst, src, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind k) {
  return cudaMemcpyAsync(dst, src, n, k);
}
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t = nullptr) {
  std::memset(p, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemset(void* p, int v, size_t n) { return cudaMemsetAsync(p, v, n); }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
