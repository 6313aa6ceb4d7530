// The emulation harness's own controls, beside the C ABI of the CUDA kernels
// (splat/kernels/capi_cuda.cpp, compiled into the same library with
// -DSPLAT_CUDAEMU): thread and block orders, the shared-memory poison, launch
// statistics and the self-test kernels of selftest.cu.  Plain C functions,
// loaded with ctypes by tests/cuda_emulation/build.py, like the rest of the
// library.
#include <cstdint>
#include <cstring>
#include <string>

#include "cudaemu.h"
#include "splat_api.h"  // SPLAT_API

cudaError_t cudaemu_selftest(const std::string& name);  // selftest.cu

namespace {

bool order(const char* name, cudaemu::Order* out) {
  const std::string s(name ? name : "");
  if (s == "fwd")
    *out = cudaemu::Order::Forward;
  else if (s == "rev")
    *out = cudaemu::Order::Reverse;
  else if (s == "rand")
    *out = cudaemu::Order::Random;
  else
    return false;
  return true;
}

void copy(const char* text, char* out, size_t len) {
  if (out && len) {
    std::strncpy(out, text, len - 1);
    out[len - 1] = '\0';
  }
}

}  // namespace

extern "C" {

// Thread order, block order ("fwd", "rev" or "rand"), poison byte, seed.
SPLAT_API int cudaemu_configure(const char* thread_order, const char* block_order, int poison,
                                unsigned seed, char* err, size_t err_len) {
  cudaemu::Order threads, blocks;
  if (!order(thread_order, &threads) || !order(block_order, &blocks)) {
    copy("order must be fwd, rev or rand", err, err_len);
    return 1;
  }
  if (poison < 0 || poison > 255) {
    copy("poison is a byte value", err, err_len);
    return 1;
  }
  cudaemu::configure(threads, blocks, poison, seed);
  return 0;
}

// [launches, blocks, fiber switches] so far.
SPLAT_API void cudaemu_stats(int64_t* out3) {
  const auto& s = cudaemu::st().stats;
  out3[0] = int64_t(s.launches);
  out3[1] = int64_t(s.blocks);
  out3[2] = int64_t(s.switches);
}

// Runs a known-bad (or good) kernel of selftest.cu; "ok" or the emulator's message.
SPLAT_API void cudaemu_run_selftest(const char* name, char* out, size_t len) {
  const cudaError_t e = cudaemu_selftest(name ? name : "");
  copy(e == cudaSuccess ? "ok" : cudaGetErrorString(e), out, len);
}

}  // extern "C"
