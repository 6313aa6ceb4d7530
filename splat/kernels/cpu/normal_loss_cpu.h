// Fused depth-normal consistency loss on the CPU (no torch headers; see
// bindings.cpp).  splat/losses.py depth_to_normal + normal_consistency_loss is
// the plain-PyTorch form this op must match, and its oracle in the tests.
//
// For a depth map z [H, W] (camera z), intrinsics (fx, fy, cx, cy) with pixel
// centres at (j + 0.5, i + 0.5) (splat/conventions.py), world -> camera
// rotation R, rendered normals N [H, W, 3] (world) and weights a [H, W]
// (alpha, no gradient):
//     P(i, j) = z(i, j) ((j + 0.5 - cx) / fx, (i + 0.5 - cy) / fy, 1)
// and for interior pixels (1 <= i <= H-2, 1 <= j <= W-2) with z(i, j) > 0
//     c = (P(i+1, j) - P(i-1, j)) x (P(i, j+1) - P(i, j-1)),
//     n_cam = s c / max(|c|, 1e-12),  s = -1 if c . P(i, j) > 0 else 1,
//     n(i, j) = R^T n_cam   (zero on the border and where z <= 0);
//     L = mean_{i,j} a (1 - N . n).
// Gradients (s is piecewise constant, so it passes through):
//     dL/dN = -a n / (H W);   g = dL/dn_cam = R (-a N / (H W));
//     dL/dc = s (g - c_hat (c_hat . g)) / |c|  (or s g / 1e-12 when clamped);
//     with di, dj the two differences: dL/ddi = dj x dL/dc, dL/ddj = dL/dc x di,
//     which flow to P(i+-1, j) and P(i, j+-1) with signs +-, and
//     dL/dz(i, j) = dL/dP(i, j) . ((j + 0.5 - cx) / fx, (i + 0.5 - cy) / fy, 1).
// The backward pass writes dL/ddi, dL/ddj per pixel, then gathers them at
// each pixel from its four neighbours, so no two threads write one place and
// the result is bitwise identical for any thread count.
#pragma once

#include <cstdint>

namespace splat {

template <typename T>
struct NormalLossArgs {
  const T* depth;   // [H, W]
  const T* normal;  // [H, W, 3] rendered, world
  const T* alpha;   // [H, W]
  double fx, fy, cx, cy;
  double R[9];      // world -> camera rotation, row major
  int64_t height, width;
};

// Returns L.
template <typename T>
double normal_loss_forward_cpu(const NormalLossArgs<T>& a);

// Writes dL/ddepth [H, W] and dL/dnormal [H, W, 3], times `scale` (the
// upstream gradient of L).
template <typename T>
void normal_loss_backward_cpu(const NormalLossArgs<T>& a, double scale, T* v_depth, T* v_normal);

}  // namespace splat
