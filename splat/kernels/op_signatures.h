// The parameter lists of the torch raster ops, once per primitive, for every
// place that declares, defines or forwards them: bindings.cpp (CPU) and
// cuda/bindings_cuda.{h,cpp} (CUDA, which hands them to the torch-free C ABI
// of splat_cuda_api.h in the same order).  Python calls each op
// positionally (splat/rasterize.py), so the order here is the ops' contract:
//
//   forward(INPUTS)                         -> sums, binning (raster_args.h)
//   backward(INPUTS, SAVED_STATE, UPSTREAM) -> per-primitive gradient records
//
// (the CPU surfel backward takes the forward's packed records last).  Each
// *_PARAMS macro declares the parameters; its *_NAMES twin passes them on.
// Needs torch::Tensor in scope (only the torch-level files include this; the
// .cu kernels see raw pointers only, raster_args.h).
#pragma once

// Surfels: core.h's per-surfel record (raster_args.h SurfelArrays).
#define SPLAT_SURFEL_PARAMS                                                                 \
  const torch::Tensor &Tuvw, const torch::Tensor &center, const torch::Tensor &normal,      \
      const torch::Tensor &color, const torch::Tensor &opacity, const torch::Tensor &depth, \
      const torch::Tensor &pixel_rect, int64_t width, int64_t height, double near, double far
#define SPLAT_SURFEL_NAMES \
  Tuvw, center, normal, color, opacity, depth, pixel_rect, width, height, near, far

// 3D Gaussians: core.h "3D Gaussians" (raster_args.h GaussianArrays).
#define SPLAT_GAUSSIAN_PARAMS                                                          \
  const torch::Tensor &params, const torch::Tensor &color, const torch::Tensor &depth, \
      const torch::Tensor &pixel_rect, int64_t width, int64_t height, double near, double far
#define SPLAT_GAUSSIAN_NAMES params, color, depth, pixel_rect, width, height, near, far

// What forward returned for backward (its binning and per-pixel state), then
// the six upstream gradients of the sums; the same for both primitives.
#define SPLAT_BACKWARD_STATE_PARAMS                                                             \
  const torch::Tensor &tile_offsets, const torch::Tensor &point_list, const torch::Tensor &end, \
      const torch::Tensor &median_index, const torch::Tensor &transmittance,                    \
      const torch::Tensor &totals, const torch::Tensor &v_color_sum,                            \
      const torch::Tensor &v_transmittance, const torch::Tensor &v_depth_sum,                   \
      const torch::Tensor &v_normal_sum, const torch::Tensor &v_distortion,                     \
      const torch::Tensor &v_median_depth
#define SPLAT_BACKWARD_STATE_NAMES                                                 \
  tile_offsets, point_list, end, median_index, transmittance, totals, v_color_sum, \
      v_transmittance, v_depth_sum, v_normal_sum, v_distortion, v_median_depth
