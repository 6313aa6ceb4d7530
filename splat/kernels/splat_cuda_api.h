/* The C ABI of splat's CUDA kernels (libsplat_cuda.so): no torch, no Python.
 *
 * The GPU half of splat_api.h, in its own library so that a CPU-only torch
 * never loads it (splat/_native_cuda.py dlopens it only when torch has CUDA
 * and a GPU is present) and so that it can link the CUDA runtime statically:
 * it then needs only the driver (libcuda.so.1), which torch's CUDA requires
 * anyway, and one build serves every torch >= 2.10 and every CPython.
 *
 * Tensors cross as SplatTensorArg descriptors (data pointer, shape, dtype,
 * device, contiguity) rather than bare pointers, so that the host call
 * sequence (cuda/host_sequence.h) validates them itself, with messages that
 * name the argument, for every caller: this library, the torch extension of
 * the source build (cuda/bindings_cuda.cpp) and the CUDA emulation harness
 * (tests/cuda_emulation/), which all run that one sequence.
 *
 * Memory: every buffer (outputs and scratch) comes from the caller's
 * allocator callback, on the inputs' device; Python allocates with torch, so
 * torch's caching allocator serves it and frees it stream-ordered (INRIA's
 * rasterizer does the same with its resize functions).  Scratch buffers
 * (slot < 0) must stay alive until the call returns; work queued on `stream`
 * may still use them afterwards, which the caching allocator allows (blocks
 * freed on a stream are reused only by later work on that stream).
 *
 * Every function returns 0 on success, or non-zero with a one-line message in
 * err[0 .. err_len) (C++ exceptions never cross this boundary).  Host syncs:
 * one per forward call (the number of (tile, primitive) pairs), none in
 * backward.
 */
#ifndef SPLAT_CUDA_API_H_
#define SPLAT_CUDA_API_H_

#include <stddef.h>
#include <stdint.h>

#include "splat_api.h" /* SPLAT_API */

#ifdef __cplusplus
extern "C" {
#endif

/* dtype codes of SplatTensorArg and of the allocator; names as torch's C++
 * prints them (the messages keep the extension's wording). */
enum {
  SPLAT_DTYPE_FLOAT32 = 0,
  SPLAT_DTYPE_FLOAT64 = 1,
  SPLAT_DTYPE_INT32 = 2,
  SPLAT_DTYPE_INT64 = 3,
  SPLAT_DTYPE_UINT8 = 4,
  SPLAT_DTYPE_OTHER = 255 /* any dtype splat never takes */
};

/* One tensor argument.  ndim < 0: undefined (Python's None).  Shapes of up to
 * 4 dimensions (no input has more).  device_type as DLPack: 1 CPU, 2 CUDA. */
typedef struct {
  void* data;
  int64_t shape[4];
  int32_t ndim;
  int32_t dtype;
  int32_t device_type;
  int32_t device_id;
  int32_t contiguous; /* non-zero when row-major contiguous */
  int32_t reserved;
} SplatTensorArg;

/* Allocates a contiguous tensor [shape[0 .. ndim)] of dtype on the inputs'
 * device and stores its data pointer in *data (NULL is fine for no elements).
 * slot >= 0: output `slot` of the call; slot < 0: scratch.  Returns 0, or
 * non-zero when it failed (the caller keeps its own reason: out of memory).  */
typedef int (*SplatAllocFn)(void* ctx, int32_t slot, int32_t dtype, int32_t ndim,
                            const int64_t* shape, void** data);

/* ABI version: bump on any signature change (Python checks it at load). */
#define SPLAT_CUDA_API_VERSION 3
SPLAT_API int splat_cuda_api_version(void);

/* The kernels' images, as nvcc names them, space-separated: "sm_75 sm_80 ...
 * compute_120" (SASS for each sm_, PTX for each compute_); "" when the build
 * did not record them (the emulation). */
SPLAT_API const char* splat_cuda_archs(void);

/* The CUDA runtime this library links (statically) and the driver's version,
 * as cudaRuntimeGetVersion / cudaDriverGetVersion (1000 * major + 10 * minor;
 * driver 0 when there is none).  Returns 0, or non-zero with err filled. */
SPLAT_API int splat_cuda_versions(int* runtime, int* driver, char* err, size_t err_len);

/* Surfels.  inputs[7]: Tuvw [N,9], center [N,2], normal [N,3], color [N,3],
 * opacity [N], depth [N], pixel_rect int32 [N,4], on one CUDA device.
 * Outputs (allocator slots 0..10): color_sum [H,W,3], transmittance [H,W],
 * depth_sum [H,W], normal_sum [H,W,3], distortion [H,W], median_depth [H,W],
 * end int32 [H,W], median_index int32 [H,W], totals [H,W,kTotalsSize],
 * tile_offsets int64 [num_tiles+1], point_list int32 [P].
 * stream: a cudaStream_t (torch's current stream of the inputs' device). */
SPLAT_API int splat_forward_cuda(const SplatTensorArg* inputs, int64_t width, int64_t height,
                                 double near_plane, double far_plane, void* stream,
                                 SplatAllocFn alloc, void* alloc_ctx, char* err, size_t err_len);
/* state[6]: tile_offsets, point_list, end, median_index, transmittance,
 * totals (forward's).  up[6]: the upstream gradients of color_sum,
 * transmittance, depth_sum, normal_sum, distortion, median_depth, contiguous.
 * Output (slot 0): v_surfels [N, kGradSize]. */
SPLAT_API int splat_backward_cuda(const SplatTensorArg* inputs, int64_t width, int64_t height,
                                  double near_plane, double far_plane, const SplatTensorArg* state,
                                  const SplatTensorArg* up, void* stream, SplatAllocFn alloc,
                                  void* alloc_ctx, char* err, size_t err_len);

/* 3D Gaussians.  inputs[4]: params [N,kGaussParams], color [N,3], depth [N],
 * pixel_rect int32 [N,4].  Outputs as splat_forward_cuda; backward's (slot 0):
 * v_gaussians [N, kGaussGradSize]. */
SPLAT_API int splat_forward_gaussians_cuda(const SplatTensorArg* inputs, int64_t width,
                                           int64_t height, double near_plane, double far_plane,
                                           void* stream, SplatAllocFn alloc, void* alloc_ctx,
                                           char* err, size_t err_len);
SPLAT_API int splat_backward_gaussians_cuda(const SplatTensorArg* inputs, int64_t width,
                                            int64_t height, double near_plane, double far_plane,
                                            const SplatTensorArg* state, const SplatTensorArg* up,
                                            void* stream, SplatAllocFn alloc, void* alloc_ctx,
                                            char* err, size_t err_len);

/* The fused surfel projection (project_surfels.h, cuda/project.cu), with the
 * results of the CPU's (cpu/project_cpu.h).  inputs[7]: means [N,3], quats
 * [N,4], scales [N,2], opacities [N], coeffs [N,K,3] SH coefficients (no
 * elements or undefined: no colour output), viewmat [4,4], K [3,3], all on
 * one CUDA device, one float dtype, contiguous; viewmat and K are read on the
 * device (no host copy, no sync).  sh_degree: 0..3 with coeffs.
 * Outputs (slots 0..7): Tuvw [N,9], center [N,2], normal [N,3], color [N,3]
 * ([0,3] without coeffs), depth [N], pixel_rect int32 [N,4], radii int32
 * [N], and the number of surfels over the magnitude limits limit_finite /
 * limit_drawn as an int64 [] on the device.  No host sync. */
SPLAT_API int splat_project_forward_cuda(const SplatTensorArg* inputs, int64_t sh_degree,
                                         int64_t width, int64_t height, double near_plane,
                                         double far_plane, double limit_finite, double limit_drawn,
                                         void* stream, SplatAllocFn alloc, void* alloc_ctx,
                                         char* err, size_t err_len);
/* grads[4]: the upstream gradients of Tuvw, center, normal, color (undefined
 * without coeffs), contiguous.  Outputs (slots 0..4): v_means [N,3], v_quats
 * [N,4], v_scales [N,2], v_coeffs (coeffs' shape; [0,0,3] when undefined), v_means2d
 * [N,2] (dL/d screen translation of each footprint).  No host sync. */
SPLAT_API int splat_project_backward_cuda(const SplatTensorArg* inputs, int64_t sh_degree,
                                          int64_t width, int64_t height, double near_plane,
                                          double far_plane, const SplatTensorArg* grads,
                                          void* stream, SplatAllocFn alloc, void* alloc_ctx,
                                          char* err, size_t err_len);

/* The fused projection of 3D Gaussians (project_gaussians.h, cuda/project.cu),
 * with the results of the CPU's (splat_api.h splat_project_gaussians_*_cpu).
 * inputs[7]: means [N,3], quats [N,4], scales
 * [N,3], opacities [N], viewmat [4,4], K [3,3], K_inv [3,3] (torch's
 * inverse of K), all on one CUDA device, one float dtype, contiguous.
 * Culls (camera depth of the mean in (near, far), opacity >= 1/255) and
 * projects the kept.  Outputs (slots 0..6): ids int64 [M] (the kept,
 * increasing), params [M,27], centre [M,2], depth [M], pixel_rect int32
 * [M,4], radii int32 [M], and the number of rows with a non-finite
 * parameter as an int64 [] on the device.  One host sync (M). */
SPLAT_API int splat_project_gaussians_forward_cuda(const SplatTensorArg* inputs, int64_t width,
                                                   int64_t height, double near_plane,
                                                   double far_plane, int64_t antialiased,
                                                   void* stream, SplatAllocFn alloc,
                                                   void* alloc_ctx, char* err, size_t err_len);
/* inputs[8]: means, quats, scales, opacities, ids [M] (the forward's), viewmat,
 * K, K_inv.  grads[2]: v_params [M,27], v_centre [M,2] (undefined: zero),
 * contiguous.  Outputs (slots 0..4): v_means [N,3], v_quats [N,4], v_scales
 * [N,3], v_opacities [N], v_means2d [N,2] (dL/d screen translation); zero
 * for the Gaussians not in ids; with_camera, also (slots 5..7) v_viewmat
 * [4,4], v_K [3,3], v_K_inv [3,3], summed as the CPU's.  No host sync. */
SPLAT_API int splat_project_gaussians_backward_cuda(const SplatTensorArg* inputs, int64_t width,
                                                    int64_t height, int64_t antialiased,
                                                    const SplatTensorArg* grads,
                                                    int64_t with_camera, void* stream,
                                                    SplatAllocFn alloc, void* alloc_ctx, char* err,
                                                    size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* SPLAT_CUDA_API_H_ */
