// The CUDA half of the C ABI (splat_cuda_api.h): turns each call into the
// host call sequence (cuda/host_sequence.h) with this build's device policy,
// and every exception into an error code and a one-line message.
//
// Compiled three ways, always this file and that sequence:
//   * into libsplat_cuda.so with nvcc (splat/_native_build.py), CUDA runtime
//     linked statically;
//   * into the torch extension splat._C of the source build (setup.py), whose
//     bindings_cuda.cpp calls these functions with a torch allocator;
//   * into the CUDA emulation library (tests/cuda_emulation/build.py) with
//     -DSPLAT_CUDAEMU, against the cudaemu shim, whose device policy makes
//     the buffers CPU memory, poisoned.
#include "splat_cuda_api.h"

#include <cstring>
#include <exception>
#include <new>

#include "cuda/host_sequence.h"

#ifdef SPLAT_CUDAEMU
#include "cudaemu_device.h"  // tests/cuda_emulation/shim
using SplatDevice = cudaemu::EmulatedDevice;
#else
namespace {
struct CudaDevice {
  static constexpr int32_t kDeviceType = 2;  // DLPack's kDLCUDA
  static constexpr bool kHostMemory = false;
  static void on_alloc(void*, size_t) {}
  // Makes the inputs' device current for the call (the kernels launch on the
  // current device) and restores the caller's afterwards.
  class Guard {
   public:
    explicit Guard(int32_t device) {
      int current = 0;
      splat::host_sequence::check_cuda(cudaGetDevice(&current), "cudaGetDevice");
      if (current != device) {
        splat::host_sequence::check_cuda(cudaSetDevice(device), "cudaSetDevice");
        previous_ = current;
      }
    }
    ~Guard() {
      if (previous_ >= 0) cudaSetDevice(previous_);
    }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    int previous_ = -1;
  };
};
}  // namespace
using SplatDevice = CudaDevice;
#endif

// The SASS and PTX images of this build, from the same list as nvcc's
// -gencode flags (splat/_native_build.py); splat/_native_cuda.py checks the GPU
// against it before the first call.
#ifndef SPLAT_CUDA_ARCH_LIST
#define SPLAT_CUDA_ARCH_LIST ""
#endif

namespace {

namespace hs = splat::host_sequence;

void set_message(char* err, size_t err_len, const char* text) {
  if (err && err_len) {
    std::strncpy(err, text, err_len - 1);
    err[err_len - 1] = '\0';
  }
}

template <class F>
int guarded(char* err, size_t err_len, F&& body) {
  try {
    body();
    return 0;
  } catch (const std::bad_alloc&) {
    set_message(err, err_len, "out of host memory");
  } catch (const std::exception& e) {
    set_message(err, err_len, e.what());
  } catch (...) {
    set_message(err, err_len, "unknown C++ exception");
  }
  return 1;
}

hs::Allocator allocator(SplatAllocFn fn, void* ctx) {
  if (!fn) hs::fail("no allocator given");
  return hs::Allocator{fn, ctx};
}

}  // namespace

extern "C" {

SPLAT_API int splat_cuda_api_version(void) { return SPLAT_CUDA_API_VERSION; }

SPLAT_API const char* splat_cuda_archs(void) { return SPLAT_CUDA_ARCH_LIST; }

SPLAT_API int splat_cuda_versions(int* runtime, int* driver, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    *runtime = 0;
    *driver = 0;
#ifndef SPLAT_CUDAEMU
    hs::check_cuda(cudaRuntimeGetVersion(runtime), "cudaRuntimeGetVersion");
    hs::check_cuda(cudaDriverGetVersion(driver), "cudaDriverGetVersion");
#endif
  });
}

SPLAT_API int splat_forward_cuda(const SplatTensorArg* inputs, int64_t width, int64_t height,
                                 double near_plane, double far_plane, void* stream,
                                 SplatAllocFn alloc, void* alloc_ctx, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    hs::forward<SplatDevice>(inputs, width, height, near_plane, far_plane,
                             static_cast<cudaStream_t>(stream), allocator(alloc, alloc_ctx));
  });
}

SPLAT_API int splat_backward_cuda(const SplatTensorArg* inputs, int64_t width, int64_t height,
                                  double near_plane, double far_plane, const SplatTensorArg* state,
                                  const SplatTensorArg* up, void* stream, SplatAllocFn alloc,
                                  void* alloc_ctx, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    hs::backward<SplatDevice>(inputs, width, height, near_plane, far_plane, state, up,
                              static_cast<cudaStream_t>(stream), allocator(alloc, alloc_ctx));
  });
}

SPLAT_API int splat_forward_gaussians_cuda(const SplatTensorArg* inputs, int64_t width,
                                           int64_t height, double near_plane, double far_plane,
                                           void* stream, SplatAllocFn alloc, void* alloc_ctx,
                                           char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    hs::forward_gaussians<SplatDevice>(inputs, width, height, near_plane, far_plane,
                                       static_cast<cudaStream_t>(stream),
                                       allocator(alloc, alloc_ctx));
  });
}

SPLAT_API int splat_backward_gaussians_cuda(const SplatTensorArg* inputs, int64_t width,
                                            int64_t height, double near_plane, double far_plane,
                                            const SplatTensorArg* state, const SplatTensorArg* up,
                                            void* stream, SplatAllocFn alloc, void* alloc_ctx,
                                            char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    hs::backward_gaussians<SplatDevice>(inputs, width, height, near_plane, far_plane, state, up,
                                        static_cast<cudaStream_t>(stream),
                                        allocator(alloc, alloc_ctx));
  });
}

SPLAT_API int splat_project_forward_cuda(const SplatTensorArg* inputs, int64_t sh_degree,
                                         int64_t width, int64_t height, double near_plane,
                                         double far_plane, double limit_finite, double limit_drawn,
                                         void* stream, SplatAllocFn alloc, void* alloc_ctx,
                                         char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    hs::project_forward<SplatDevice>(inputs, sh_degree, width, height, near_plane, far_plane,
                                     limit_finite, limit_drawn, static_cast<cudaStream_t>(stream),
                                     allocator(alloc, alloc_ctx));
  });
}

SPLAT_API int splat_project_backward_cuda(const SplatTensorArg* inputs, int64_t sh_degree,
                                          int64_t width, int64_t height, double near_plane,
                                          double far_plane, const SplatTensorArg* grads,
                                          void* stream, SplatAllocFn alloc, void* alloc_ctx,
                                          char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    hs::project_backward<SplatDevice>(inputs, sh_degree, width, height, near_plane, far_plane,
                                      grads, static_cast<cudaStream_t>(stream),
                                      allocator(alloc, alloc_ctx));
  });
}

SPLAT_API int splat_project_gaussians_forward_cuda(const SplatTensorArg* inputs, int64_t width,
                                                   int64_t height, double near_plane,
                                                   double far_plane, int64_t antialiased,
                                                   void* stream, SplatAllocFn alloc,
                                                   void* alloc_ctx, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    hs::project_gaussians_forward<SplatDevice>(inputs, width, height, near_plane, far_plane,
                                               antialiased, static_cast<cudaStream_t>(stream),
                                               allocator(alloc, alloc_ctx));
  });
}

SPLAT_API int splat_project_gaussians_backward_cuda(const SplatTensorArg* inputs, int64_t width,
                                                    int64_t height, int64_t antialiased,
                                                    const SplatTensorArg* grads,
                                                    int64_t with_camera, void* stream,
                                                    SplatAllocFn alloc, void* alloc_ctx, char* err,
                                                    size_t err_len) {
  return guarded(err, err_len, [&] {
    hs::project_gaussians_backward<SplatDevice>(inputs, width, height, antialiased, grads,
                                                with_camera, static_cast<cudaStream_t>(stream),
                                                allocator(alloc, alloc_ctx));
  });
}

}  // extern "C"
