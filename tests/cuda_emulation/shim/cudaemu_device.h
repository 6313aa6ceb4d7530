// The emulation's device policy for the CUDA host call sequence
// (splat/kernels/cuda/host_sequence.h), used when capi_cuda.cpp is compiled
// with -DSPLAT_CUDAEMU: "device" tensors are CPU tensors, and every buffer the
// sequence allocates is filled with garbage first, as memory from torch's
// caching allocator would be, so nothing may rely on it being zero.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace cudaemu {

struct EmulatedDevice {
  static constexpr int32_t kDeviceType = 1;  // DLPack's kDLCPU
  static constexpr bool kHostMemory = true;  // the binning's contents are checked too
  static void on_alloc(void* data, size_t bytes) { std::memset(data, 0xCD, bytes); }
  struct Guard {
    explicit Guard(int32_t) {}
  };
};

}  // namespace cudaemu
