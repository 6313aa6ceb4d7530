// Plain-pointer argument blocks shared by the CPU and CUDA backends, so that
// neither the .cpp kernels nor the .cu files need torch headers.  All arrays
// are contiguous, row-major.  Shapes use N surfels, H x W pixels and
// P = number of (tile, surfel) pairs after binning.
#pragma once

#include <cstdint>

namespace splat {

template <typename T>
struct SurfelArrays {
  const T* Tuvw;        // [N, 9] rows Tu, Tv, Tw of M = K [a b c]
  const T* center;      // [N, 2] projected centre, pixels
  const T* normal;      // [N, 3] world-space normal facing the camera
  const T* color;       // [N, 3]
  const T* opacity;     // [N]
  const T* depth;       // [N] camera z of the centre: the sort key
  const int32_t*
      pixel_rect;  // [N, 4] pixels it may draw: x0, y0, x1, y1 (exclusive); empty = culled
  int64_t num_surfels;
  int width, height;
  T near, far;
};

// 3D Gaussians (core.h "3D Gaussians"): per-Gaussian pixel-space parameters.
template <typename T>
struct GaussianArrays {
  const T* params;      // [N, kGaussParams] conic, centre, opacity, depth and normal terms
  const T* color;       // [N, 3]
  const T* depth;       // [N] camera z of the mean: the sort key
  const int32_t* pixel_rect;  // [N, 4] as for surfels
  int64_t num_gaussians;
  int width, height;
  T near, far;
};

template <typename T>
struct ForwardOutputs {
  T* color_sum;       // [H, W, 3] sum w c
  T* transmittance;   // [H, W] final T
  T* depth_sum;       // [H, W] sum w z
  T* normal_sum;      // [H, W, 3] sum w n
  T* distortion;      // [H, W]
  T* median_depth;    // [H, W]
  int32_t* end;       // [H, W] one past the last blended list position (tile-local)
  int32_t* median_index;  // [H, W] tile-local list position of the median surfel, -1 if none
  T* totals;          // [H, W, kTotalsSize] final A, D, D2 and the m shift (core.h)
};

template <typename T>
struct UpstreamGrads {
  const T* v_color_sum;     // [H, W, 3]
  const T* v_transmittance; // [H, W]
  const T* v_depth_sum;     // [H, W]
  const T* v_normal_sum;    // [H, W, 3]
  const T* v_distortion;    // [H, W]
  const T* v_median_depth;  // [H, W]
  // Elements between consecutive pixels of each array above, in that order,
  // and between channels of v_color_sum and v_normal_sum: contiguous arrays
  // by default; 0 for a value broadcast to every pixel (or channel), as an
  // expanded gradient of a sum or mean is, so that it needs no copy.
  int64_t pixel_stride[6] = {3, 1, 1, 3, 1, 1};
  int64_t color_channel_stride = 1, normal_channel_stride = 1;
};

// Tile binning: the surfels of tile t are point_list[tile_offsets[t] .. tile_offsets[t+1]),
// front to back (by centre depth, ties by surfel index).
struct TileBins {
  const int64_t* tile_offsets;  // [num_tiles + 1]
  const int32_t* point_list;    // [P]
  int tiles_x, tiles_y;
};

}  // namespace splat
