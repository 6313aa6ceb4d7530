/* The C ABI of splat's kernels: plain pointers and sizes, no torch, no Python.
 *
 * Loaded with ctypes by splat/_native.py from libsplat_cpu.so (and, for the
 * GPU, libsplat_cuda.so).  Every function returns 0 on success, or non-zero
 * with a one-line message in err[0 .. err_len) (never throws: C++ exceptions
 * are caught at this boundary).  dtype: 0 = float32, 1 = float64.
 *
 * Outputs that today's bindings allocated in the CPU kernels' scratch memory
 * (cpu/scratch.h) come back as DLPack tensors (DLManagedTensor*, the layout
 * of dlpack.h v0.8, declared below) whose deleter returns the memory to the
 * cache; Python adopts them with torch.from_dlpack, so the memory reuse (and
 * with it the speed) is that of the torch bindings.  Variable-size buffers
 * (the tile binning's point list) are therefore allocated inside the library,
 * once their size is known, without a round trip to Python.
 *
 * num_threads: OpenMP threads for this call (> 0: omp_set_num_threads on the
 * calling thread first; <= 0: the runtime's current setting).  Python passes
 * torch.get_num_threads(), which keeps the kernels on torch's thread count even
 * when the library's OpenMP runtime is not torch's (a vendored libgomp).
 */
#ifndef SPLAT_API_H_
#define SPLAT_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define SPLAT_API __declspec(dllexport)
#else
#define SPLAT_API __attribute__((visibility("default")))
#endif

/* DLPack (https://github.com/dmlc/dlpack), unversioned DLManagedTensor. */
typedef struct {
  int32_t device_type; /* 1 = CPU, 2 = CUDA */
  int32_t device_id;
} SplatDLDevice;
typedef struct {
  uint8_t code; /* 0 int, 1 uint, 2 float */
  uint8_t bits;
  uint16_t lanes;
} SplatDLDataType;
typedef struct {
  void* data;
  SplatDLDevice device;
  int32_t ndim;
  SplatDLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} SplatDLTensor;
typedef struct SplatDLManagedTensor {
  SplatDLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct SplatDLManagedTensor* self);
} SplatDLManagedTensor;

/* ABI version: bump on any signature change (Python checks it at load). */
#define SPLAT_API_VERSION 3
SPLAT_API int splat_api_version(void);
/* kGradSize, kGaussParams, kGaussGradSize, kTileSize, kTotalsSize, kLanes. */
SPLAT_API void splat_constants(int64_t* out6);

/* Surfels.  inputs: Tuvw [N,9], center [N,2], normal [N,3], color [N,3],
 * opacity [N], depth [N], pixel_rect int32 [N,4].  outs[12]: color_sum,
 * transmittance, depth_sum, normal_sum, distortion, median_depth, end,
 * median_index, totals, tile_offsets, point_list, packed records. */
SPLAT_API int splat_forward_cpu(int dtype, const void* const* inputs, int64_t n, int64_t width,
                                int64_t height, double near_plane, double far_plane,
                                int num_threads, SplatDLManagedTensor** outs, char* err,
                                size_t err_len);
/* state: tile_offsets int64, point_list int32, end int32, median_index int32,
 * transmittance, totals.  up: the six upstream gradients; up_strides[8]: the
 * six pixel strides, then the colour and normal channel strides (raster_args.h
 * UpstreamGrads).  packed: forward's packed records or NULL; packed_bytes its
 * size.  out: v_surfels [N, kGradSize]. */
SPLAT_API int splat_backward_cpu(int dtype, const void* const* inputs, int64_t n, int64_t width,
                                 int64_t height, double near_plane, double far_plane,
                                 const void* const* state, const void* const* up,
                                 const int64_t* up_strides, const void* packed,
                                 int64_t packed_bytes, int num_threads, SplatDLManagedTensor** out,
                                 char* err, size_t err_len);

/* 3D Gaussians.  inputs: params [N,kGaussParams], color [N,3], depth [N],
 * pixel_rect int32 [N,4].  outs[11]: as splat_forward_cpu less the packed
 * records.  out: v_gaussians [N, kGaussGradSize]. */
SPLAT_API int splat_forward_gaussians_cpu(int dtype, const void* const* inputs, int64_t n,
                                          int64_t width, int64_t height, double near_plane,
                                          double far_plane, int num_threads,
                                          SplatDLManagedTensor** outs, char* err, size_t err_len);
SPLAT_API int splat_backward_gaussians_cpu(int dtype, const void* const* inputs, int64_t n,
                                           int64_t width, int64_t height, double near_plane,
                                           double far_plane, const void* const* state,
                                           const void* const* up, const int64_t* up_strides,
                                           int num_threads, SplatDLManagedTensor** out, char* err,
                                           size_t err_len);

/* The fused projection.  inputs: means [N,3], quats [N,4], scales [N,2],
 * opacities [N], coeffs [N,K,3] or NULL; viewmat[16], K[9] of dtype.
 * outs[8]: Tuvw, center, normal, color ([N,3], or [0,3] without coeffs),
 * depth, pixel_rect int32, radii int32, and a 0-d int64 tensor: the number of
 * surfels out of the magnitude limits. */
SPLAT_API int splat_project_forward_cpu(int dtype, const void* const* inputs, int64_t n,
                                        int64_t num_coeffs, int64_t sh_degree, const void* viewmat,
                                        const void* K, int64_t width, int64_t height,
                                        double near_plane, double far_plane, double limit_finite,
                                        double limit_drawn, int num_threads,
                                        SplatDLManagedTensor** outs, char* err, size_t err_len);
/* grads_in: v_Tuvw, v_center, v_normal, v_color (NULL without coeffs) with
 * row strides row_strides[4].  v_coeffs: caller-allocated [N,K,3] (or NULL).
 * outs[4]: v_means, v_quats, v_scales, v_means2d. */
SPLAT_API int splat_project_backward_cpu(int dtype, const void* const* inputs, int64_t n,
                                         int64_t num_coeffs, int64_t sh_degree, const void* viewmat,
                                         const void* K, int64_t width, int64_t height,
                                         double near_plane, double far_plane,
                                         const void* const* grads_in, const int64_t* row_strides,
                                         void* v_coeffs, int num_threads,
                                         SplatDLManagedTensor** outs, char* err, size_t err_len);

/* ---- The fused projection of 3D Gaussians (cpu/project_gaussians_cpu.h) ----
 * inputs: means [N,3], quats [N,4], scales [N,3], opacities [N]; viewmat[16],
 * K[9], K_inv[9] of dtype.  Culls (depth in (near, far), opacity >= 1/255)
 * and projects the rest.  outs[7]: ids int64 [M] (the Gaussians kept, in
 * index order), params [M,kGaussParams], centre [M,2], depth [M], pixel_rect
 * int32 [M,4], radii int32 [M], and a 0-d int64 tensor: the number of rows
 * whose params are not all finite. */
SPLAT_API int splat_project_gaussians_forward_cpu(
    int dtype, const void* const* inputs, int64_t n, const void* viewmat, const void* K,
    const void* K_inv, int64_t width, int64_t height, double near_plane, double far_plane,
    int antialiased, int num_threads, SplatDLManagedTensor** outs, char* err, size_t err_len);
/* inputs: as the forward's, then forward's ids [M] (distinct, in [0, N)).
 * grads_in: v_params [M,kGaussParams] and v_centre [M,2] (or NULL) with row
 * strides row_strides[2].  with_camera: also the camera's gradients.
 * outs[5] (with_camera: 8): v_means [N,3], v_quats [N,4], v_scales [N,3],
 * v_opacities [N], v_means2d [N,2] (dL/d(screen translation): v_params'
 * centre entries; all zero outside ids), then v_viewmat [4,4], v_K [3,3]
 * (its fx, fy, cx, cy entries), v_K_inv [3,3]. */
SPLAT_API int splat_project_gaussians_backward_cpu(int dtype, const void* const* inputs, int64_t n,
                                                   int64_t m, const void* viewmat, const void* K,
                                                   const void* K_inv, int64_t width, int64_t height,
                                                   int antialiased, const void* const* grads_in,
                                                   const int64_t* row_strides, int with_camera,
                                                   int num_threads, SplatDLManagedTensor** outs,
                                                   char* err, size_t err_len);
/* ---- end of the 3D Gaussians' projection ---- */

/* SSIM of [H,W,C] images x, y with window [window_size].  outs[2]: the mean
 * SSIM (0-d, of dtype) and the [3,H,W,C] gradient maps (when with_grad, else
 * [0]).  Backward: out dx. */
SPLAT_API int splat_ssim_forward_cpu(int dtype, const void* x, const void* y, const void* window,
                                     int64_t window_size, int64_t height, int64_t width,
                                     int64_t channels, double c1, double c2, int with_grad,
                                     int num_threads, SplatDLManagedTensor** outs, char* err,
                                     size_t err_len);
SPLAT_API int splat_ssim_backward_cpu(int dtype, const void* x, const void* y, const void* window,
                                      int64_t window_size, int64_t height, int64_t width,
                                      int64_t channels, double c1, double c2, const void* maps,
                                      double scale, int num_threads, SplatDLManagedTensor** dx,
                                      char* err, size_t err_len);

/* Depth-normal loss.  depth [H,W], normal [H,W,3], alpha [H,W]; K[9] and
 * viewmat[16] in float64.  loss: a 0-d tensor of dtype.  Backward: outs[2]
 * v_depth, v_normal. */
SPLAT_API int splat_normal_loss_forward_cpu(int dtype, const void* depth, const void* normal,
                                            const void* alpha, const double* K,
                                            const double* viewmat, int64_t height, int64_t width,
                                            int num_threads, SplatDLManagedTensor** loss, char* err,
                                            size_t err_len);
SPLAT_API int splat_normal_loss_backward_cpu(int dtype, const void* depth, const void* normal,
                                             const void* alpha, const double* K,
                                             const double* viewmat, int64_t height, int64_t width,
                                             double scale, int num_threads,
                                             SplatDLManagedTensor** outs, char* err,
                                             size_t err_len);

/* core.h's float32 exp over n floats (n a multiple of 8): one element at a
 * time into scalar_out, 8 lanes at a time into lanes_out. */
SPLAT_API int splat_exp_float32(const float* x, int64_t n, float* scalar_out, float* lanes_out,
                                char* err, size_t err_len);

/* CPU kernel mode (0 reference, 1 scalar, 2 simd), and the scratch cache. */
SPLAT_API int splat_set_cpu_kernel_mode(int mode, char* err, size_t err_len);
SPLAT_API int splat_cpu_kernel_mode(void);
SPLAT_API int64_t splat_release_cpu_scratch(void);

#ifdef __cplusplus
}
#endif

#endif /* SPLAT_API_H_ */
