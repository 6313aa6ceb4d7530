// The fused EWA projection of 3D Gaussians on the CPU (no torch headers): one
// pass per Gaussian computes what splat/rasterize_3dgs.py
// gaussian_kernel_inputs (with splat/reference_3dgs.py project_gaussians and
// _screen_bounds) computes with dozens of whole-array PyTorch ops: the
// kGaussParams row the 3DGS raster kernels read, the centre, the sort depth,
// the pixel rectangle and the radius.  The per-Gaussian maths is
// ../project_gaussians.h; this file runs it over the Gaussians with OpenMP.
//
// Every Gaussian is independent, and the camera's gradient is summed per
// fixed block of Gaussians and then over blocks in order, so both passes are
// bitwise deterministic for any thread count.
#pragma once

#include <cstdint>
#include <functional>

namespace splat {

template <typename T>
struct GaussProjectArgs {
  const T* means;      // [N, 3]
  const T* quats;      // [N, 4] (w, x, y, z)
  const T* scales;     // [N, 3], > 0
  const T* opacities;  // [N]
  const int64_t* ids;  // [M]: the Gaussians projected (not culled), distinct, in [0, N)
  int64_t n, m;
  T viewmat[16];  // world -> camera, row major
  T K[9];
  T K_inv[9];  // torch.linalg.inv(K): the caller's, so that its backward stays torch's
  int width, height;
  int antialiased;
};

template <typename T>
struct GaussProjectOutputs {
  T* params;            // [M, kGaussParams]
  T* centre;            // [M, 2]
  T* depth;             // [M] camera z of the mean (the sort key)
  int32_t* pixel_rect;  // [M, 4]
  int32_t* radii;       // [M]
};

template <typename T>
struct GaussProjectGrads {
  const T* v_params;  // [M, kGaussParams] rows (unit column stride)
  const T* v_centre;  // [M, 2] rows, or nullptr
  int64_t v_params_row_stride, v_centre_row_stride;
  T* v_means;      // [N, 3] (zero for Gaussians not in ids)
  T* v_quats;      // [N, 4]
  T* v_scales;     // [N, 3]
  T* v_opacities;  // [N]
  T* v_means2d;    // [N, 2]: dL/d(screen translation of the footprint), v_params' centre entries
  T* v_viewmat;    // [16], or nullptr: the camera's gradients are not computed
  T* v_K;          // [9] (fx, fy, cx, cy entries; with v_viewmat)
  T* v_K_inv;      // [9] (with v_viewmat)
};

// The Gaussians to project, as gaussian_kernel_inputs culls them: camera depth
// of the mean (W_z . mean + t_z, in the dtype) strictly inside (near, far) and
// opacity >= kAlphaMin, both compared in float64.  Calls alloc_ids(M) once
// and writes their indices there in increasing order; returns M.  (in.ids and
// in.m are not read.)
template <typename T>
int64_t cull_gaussians_cpu(const GaussProjectArgs<T>& in, double near, double far,
                           const std::function<int64_t*(int64_t)>& alloc_ids);

// Returns the number of rows whose parameters are not all finite (the caller
// names them in its error).
template <typename T>
int64_t project_gaussians_forward_cpu(const GaussProjectArgs<T>& in,
                                      const GaussProjectOutputs<T>& out);

template <typename T>
void project_gaussians_backward_cpu(const GaussProjectArgs<T>& in, const GaussProjectGrads<T>& g);

}  // namespace splat
