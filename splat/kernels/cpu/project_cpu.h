// Fused per-surfel projection on the CPU (no torch headers; see bindings.cpp).
//
// One pass per surfel computes what splat/rasterize.py's torch path
// (_project, _screen_bounds, _surfel_colors, facing_normals) computes with
// dozens of whole-array ops: the screen matrix M = K [a b c] (rows Tu, Tv,
// Tw), the centre, the camera-facing normal, the SH colour, the camera depth,
// the pixel rectangle and the radius.  The backward pass recomputes the
// forward quantities of a surfel and applies the exact chain rule (checked by
// float64 finite differences in tests/test_projection.py).  Every surfel is
// independent, so both passes are bitwise deterministic for any thread count.
#pragma once

#include <cstdint>

namespace splat {

template <typename T>
struct ProjectInputs {
  const T* means;      // [N, 3]
  const T* quats;      // [N, 4] (w, x, y, z), any finite non-zero length
  const T* scales;     // [N, 2]
  const T* opacities;  // [N]
  const T* coeffs;     // [N, num_coeffs, 3] SH coefficients, or nullptr (no colour output)
  int64_t num_coeffs;
  int sh_degree;       // 0..3 when coeffs != nullptr
  T viewmat[16];       // world -> camera, row major
  T K[9];
  int64_t n;
  int width, height;
  double near, far;
  double limit_finite, limit_drawn;  // magnitude limits (rasterize.py _check_magnitude)
};

template <typename T>
struct ProjectOutputs {
  T* Tuvw;             // [N, 9]
  T* center;           // [N, 2]
  T* normal;           // [N, 3]
  T* color;            // [N, 3] (only with coeffs)
  T* depth;            // [N]
  int32_t* pixel_rect; // [N, 4]
  int32_t* radii;      // [N]
};

template <typename T>
struct ProjectGrads {
  // upstream: rows of these (unit column stride), row i at i * *_row_stride;
  // the rasterizer's backward hands them over as column slices of its [N, 18]
  // gradient records, so they are read in place instead of copied
  const T* v_Tuvw;     // [N, 9]
  const T* v_center;   // [N, 2]
  const T* v_normal;   // [N, 3]
  const T* v_color;    // [N, 3] (only with coeffs)
  // results
  T* v_means;          // [N, 3]
  T* v_quats;          // [N, 4]
  T* v_scales;         // [N, 2]
  T* v_coeffs;         // [N, num_coeffs, 3] (only with coeffs)
  T* v_means2d;        // [N, 2]: dL/d(screen translation of the footprint)
  // row strides of the upstream arrays, in elements
  int64_t v_Tuvw_row_stride = 9, v_center_row_stride = 2, v_normal_row_stride = 3,
          v_color_row_stride = 3;
};

// Returns the number of surfels whose screen matrix the dtype cannot carry
// (see rasterize.py _check_magnitude); 0 when all are fine.
template <typename T>
int64_t project_forward_cpu(const ProjectInputs<T>& in, const ProjectOutputs<T>& out);

template <typename T>
void project_backward_cpu(const ProjectInputs<T>& in, const ProjectGrads<T>& g);

}  // namespace splat
