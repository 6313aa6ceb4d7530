// Per-pixel maths of the surfel rasterizer, shared by the CPU (C++/OpenMP) and
// CUDA backends.  Every function is `__host__ __device__` and templated on the
// scalar type, so the float64 CPU build checks exactly the maths the GPU runs.
//
// Conventions (written once for the Python side in splat/conventions.py; the
// constants below must match it, and tests/test_conventions.py checks that):
//   * pixel (row i, column j) has its centre at (j + 0.5, i + 0.5);
//   * a surfel is described in screen space by the 3x3 matrix
//         M = K [a b c],  a = s_u R t_u,  b = s_v R t_v,  c = camera-space centre,
//     which maps local surfel coordinates (u, v, 1) to homogeneous pixels.  Its
//     rows are called Tu, Tv, Tw; Tw = (a_z, b_z, c_z) because K's last row is (0,0,1).
//   * A pixel (x, y) lies on the two screen planes h_x = Tu - x Tw and
//     h_y = Tv - y Tw (in surfel coordinates); their intersection
//     q = h_x x h_y gives the ray-surfel intersection (u, v) = (q0, q1) / q2 and
//     its camera depth z = Tw . (u, v, 1).
//   * Low-pass fallback: rho = min(rho_3d, rho_2d), with
//     rho_3d = u^2 + v^2 and rho_2d = kLowpassInvVariance * |centre - pixel|^2.
//     In the fallback branch the surfel is a sub-pixel screen-space blob, so its
//     depth is the centre's depth c_z.  Both branches have exact gradients.
//   * A screen-space translation of a surfel (the autograd handle `means2d`)
//     needs no code here: the Python side folds it into M and the centre.
#pragma once

#include <cmath>
#include <cstdint>

#include "raster_args.h"

#if defined(__CUDACC__)
#define SPLAT_HD __host__ __device__ __forceinline__
#else
#define SPLAT_HD inline
#endif

namespace splat {

// ---- constants: the single C++ home (mirrors splat/conventions.py) ---------
constexpr double kAlphaMax = 0.99;
constexpr double kAlphaMin = 1.0 / 255.0;
constexpr double kTransmittanceMin = 1e-4;
constexpr double kMedianTransmittance = 0.5;
constexpr double kLowpassInvVariance = 2.0;
// Beyond rho = 2 ln(255) even an opaque surfel has alpha < kAlphaMin, so the
// exponential can be skipped there (a cheap exact reject; the margin covers
// rounding of exp).
constexpr double kRhoCutoff = 11.1;  // > 2 ln(255) = 11.0825
constexpr int kTileSize = 16;
constexpr int kChannels = 3;

// Number of scalars in the per-surfel gradient record written by the backward
// pass, in this order: Tu(3) Tv(3) Tw(3) centre(2) normal(3) colour(3) opacity(1).
constexpr int kGradTu = 0, kGradTv = 3, kGradTw = 6, kGradCenter = 9,
              kGradNormal = 11, kGradColor = 14, kGradOpacity = 17, kGradSize = 18;

// Per-surfel inputs of the pixel loop, read from flat arrays.
//   Tuvw   [N, 9]  rows Tu, Tv, Tw of M
//   center [N, 2]  projected centre in pixels
//   normal [N, 3]  world-space normal facing the camera
//   color  [N, 3]
//   opacity[N]
template <typename T>
struct SurfelParams {
  T Tu[3], Tv[3], Tw[3];
  T center[2];
  T opacity;
};

template <typename T>
SPLAT_HD void load_surfel(const T* Tuvw, const T* center, const T* opacity,
                          int64_t id, SurfelParams<T>& s) {
  for (int k = 0; k < 3; ++k) {
    s.Tu[k] = Tuvw[id * 9 + k];
    s.Tv[k] = Tuvw[id * 9 + 3 + k];
    s.Tw[k] = Tuvw[id * 9 + 6 + k];
  }
  s.center[0] = center[id * 2];
  s.center[1] = center[id * 2 + 1];
  s.opacity = opacity[id];
}

// exp in the scalar's own precision on host and device alike (an unqualified
// exp(float) would resolve to the double version on the host).
SPLAT_HD float exp_of(float x) { return expf(x); }
SPLAT_HD double exp_of(double x) { return exp(x); }

// A surfel's pixel rectangle [x0, x1) x [y0, y1) (conservative: every pixel
// it can draw lies inside) and the tiles that rectangle touches.
struct PixelRect {
  int32_t x0, y0, x1, y1;
};

SPLAT_HD PixelRect load_pixel_rect(const int32_t* rects, int64_t id) {
  const int32_t* r = rects + 4 * id;
  return PixelRect{r[0], r[1], r[2], r[3]};
}

SPLAT_HD PixelRect tiles_of(const PixelRect& r) {
  if (r.x1 <= r.x0 || r.y1 <= r.y0) return PixelRect{0, 0, 0, 0};
  return PixelRect{r.x0 / kTileSize, r.y0 / kTileSize, (r.x1 + kTileSize - 1) / kTileSize,
                   (r.y1 + kTileSize - 1) / kTileSize};
}

template <typename T>
SPLAT_HD void cross3(const T* a, const T* b, T* out) {
  out[0] = a[1] * b[2] - a[2] * b[1];
  out[1] = a[2] * b[0] - a[0] * b[2];
  out[2] = a[0] * b[1] - a[1] * b[0];
}

template <typename T>
SPLAT_HD T normalized_depth(T z, T near, T far) {
  return far / (far - near) * (T(1) - near / z);
}

template <typename T>
SPLAT_HD T normalized_depth_dz(T z, T near, T far) {
  return far / (far - near) * near / (z * z);
}

// ---- the ray-surfel intersection -------------------------------------------
// Everything the backward pass needs to differentiate one pixel-surfel pair.
template <typename T>
struct Hit {
  T hx[3], hy[3];  // screen planes in surfel coordinates
  T q[3];          // hx x hy
  T u, v;          // local coordinates (3D branch only)
  T d[2];          // centre - pixel (2D branch)
  T G;             // exp(-rho / 2)
  T alpha;         // min(kAlphaMax, opacity * G)
  T z;             // camera depth of the sample
  bool lowpass;    // true when the screen-space fallback won
  bool contributes;  // alpha >= kAlphaMin and z > near
};

// Evaluates surfel `s` at pixel centre (px, py).
template <typename T>
SPLAT_HD void intersect(const SurfelParams<T>& s, T px, T py, T near, Hit<T>& h) {
  for (int k = 0; k < 3; ++k) {
    h.hx[k] = s.Tu[k] - px * s.Tw[k];
    h.hy[k] = s.Tv[k] - py * s.Tw[k];
  }
  cross3(h.hx, h.hy, h.q);
  h.d[0] = s.center[0] - px;
  h.d[1] = s.center[1] - py;
  const T rho2d = T(kLowpassInvVariance) * (h.d[0] * h.d[0] + h.d[1] * h.d[1]);
  // rho3d < rho2d, written without dividing by q2: an edge-on or zero-area
  // surfel (q2 == 0) falls to the fallback instead of producing inf/NaN.
  const T qq = h.q[0] * h.q[0] + h.q[1] * h.q[1];
  const T q2q2 = h.q[2] * h.q[2];
  h.lowpass = !(qq < rho2d * q2q2);
  // Cheap exact reject before any division: past kRhoCutoff alpha < kAlphaMin.
  const bool near_enough = h.lowpass ? rho2d < T(kRhoCutoff) : qq < T(kRhoCutoff) * q2q2;
  if (!near_enough) {
    h.G = T(0);
    h.alpha = T(0);
    h.contributes = false;
    return;
  }
  T rho;
  if (h.lowpass) {
    h.u = T(0);
    h.v = T(0);
    rho = rho2d;
    h.z = s.Tw[2];
  } else {
    h.u = h.q[0] / h.q[2];
    h.v = h.q[1] / h.q[2];
    rho = h.u * h.u + h.v * h.v;
    h.z = s.Tw[0] * h.u + s.Tw[1] * h.v + s.Tw[2];
  }
  h.G = exp_of(T(-0.5) * rho);
  const T raw_alpha = s.opacity * h.G;
  h.alpha = raw_alpha < T(kAlphaMax) ? raw_alpha : T(kAlphaMax);
  h.contributes = h.alpha >= T(kAlphaMin) && h.z > near;
}

// ---- front-to-back blending ------------------------------------------------
// Running per-pixel state of the forward pass.  A, D, D2 are the sums of w,
// w*m' and w*m'^2 over the surfels blended so far; the distortion
// sum_i sum_{j<i} w_i w_j (m_i - m_j)^2 is accumulated from them.
// m' = m - m_shift, with m_shift the first blended surfel's m: the distortion
// only sees differences of m, so the shift changes nothing exactly (its
// derivative is identically zero), but it keeps the sums small and removes
// most of the float32 cancellation in m^2 A + D2 - 2 m D.
template <typename T>
struct PixelState {
  T transmittance;
  T color[kChannels];
  T depth_sum;
  T normal[3];
  T A, D, D2;
  T m_shift;
  T distortion;
  T median_depth;
  int32_t median_index;  // list position of the median surfel, -1 if none
  int32_t end;           // one past the list position of the last blended surfel
};

template <typename T>
SPLAT_HD void init_pixel(PixelState<T>& p) {
  p.transmittance = T(1);
  for (int c = 0; c < kChannels; ++c) p.color[c] = T(0);
  p.depth_sum = T(0);
  for (int k = 0; k < 3; ++k) p.normal[k] = T(0);
  p.A = p.D = p.D2 = p.distortion = p.m_shift = T(0);
  p.median_depth = T(0);
  p.median_index = -1;
  p.end = 0;
}

// Blends one contributing sample into the pixel.  Returns false (and leaves
// the pixel unchanged) when the transmittance would fall below
// kTransmittanceMin: the pixel is then finished.
template <typename T>
SPLAT_HD bool blend(PixelState<T>& p, const Hit<T>& h, const T* color,
                    const T* normal, T near, T far, int32_t list_pos) {
  const T next_T = p.transmittance * (T(1) - h.alpha);
  if (next_T < T(kTransmittanceMin)) return false;
  const T w = h.alpha * p.transmittance;
  if (p.end == 0) p.m_shift = normalized_depth(h.z, near, far);
  const T m = normalized_depth(h.z, near, far) - p.m_shift;
  for (int c = 0; c < kChannels; ++c) p.color[c] += w * color[c];
  p.depth_sum += w * h.z;
  for (int k = 0; k < 3; ++k) p.normal[k] += w * normal[k];
  p.distortion += w * (m * m * p.A + p.D2 - T(2) * m * p.D);
  p.A += w;
  p.D += w * m;
  p.D2 += w * m * m;
  if (p.transmittance > T(kMedianTransmittance)) {
    p.median_depth = h.z;
    p.median_index = list_pos;
  }
  p.transmittance = next_T;
  p.end = list_pos + 1;
  return true;
}

// ---- back-to-front gradients -----------------------------------------------
// Upstream gradients of one pixel and the final totals of its forward pass.
template <typename T>
struct PixelGrad {
  T v_color[kChannels];
  T v_depth_sum;
  T v_normal[3];
  T v_distortion;
  T v_median;
  T A, D, D2, m_shift;  // final totals (the distortion gradient needs only these)
};

// Per-pixel totals saved by the forward pass for the backward pass.
constexpr int kTotalsSize = 4;

// Writes a finished pixel's outputs and the state its backward pass needs.
template <typename T>
SPLAT_HD void store_pixel(const PixelState<T>& p, int64_t pix, const ForwardOutputs<T>& out) {
  for (int c = 0; c < kChannels; ++c) out.color_sum[pix * kChannels + c] = p.color[c];
  out.transmittance[pix] = p.transmittance;
  out.depth_sum[pix] = p.depth_sum;
  for (int k = 0; k < 3; ++k) out.normal_sum[pix * 3 + k] = p.normal[k];
  out.distortion[pix] = p.distortion;
  out.median_depth[pix] = p.median_depth;
  out.end[pix] = p.end;
  out.median_index[pix] = p.median_index;
  T* totals = out.totals + pix * kTotalsSize;
  totals[0] = p.A;
  totals[1] = p.D;
  totals[2] = p.D2;
  totals[3] = p.m_shift;
}

// Reads a pixel's upstream gradients and forward totals.
template <typename T>
SPLAT_HD void load_pixel_grad(const UpstreamGrads<T>& up, const T* all_totals, int64_t pix,
                              PixelGrad<T>& g) {
  for (int c = 0; c < kChannels; ++c) g.v_color[c] = up.v_color_sum[pix * kChannels + c];
  g.v_depth_sum = up.v_depth_sum[pix];
  for (int k = 0; k < 3; ++k) g.v_normal[k] = up.v_normal_sum[pix * 3 + k];
  g.v_distortion = up.v_distortion[pix];
  g.v_median = up.v_median_depth[pix];
  const T* totals = all_totals + pix * kTotalsSize;
  g.A = totals[0];
  g.D = totals[1];
  g.D2 = totals[2];
  g.m_shift = totals[3];
}

// State of the back-to-front walk.  `transmittance` is T_{i+1}, the
// transmittance behind the surfel about to be visited; `last_dL_dT` is
// dL/dT_{i+1}, the total derivative of the loss w.r.t. that transmittance.
// It starts as dL/dT_final and obeys
//     dL/dT_i = alpha_i s_i + (1 - alpha_i) dL/dT_{i+1},
// where s_i is the value the loss assigns to one unit of weight w_i.  Then
//     dL/dalpha_i = T_i (s_i - dL/dT_{i+1}).
template <typename T>
struct BackwardState {
  T transmittance;
  T last_dL_dT;
};

// Differentiates one contributing sample (list position `list_pos`) and adds
// its gradients to `grad` (a kGradSize record for this surfel).
template <typename T>
SPLAT_HD void backward_step(BackwardState<T>& st, const PixelGrad<T>& g,
                            const SurfelParams<T>& s, const Hit<T>& h,
                            const T* color, const T* normal, T px, T py,
                            T near, T far, bool is_median, T* grad) {
  const T one_minus_alpha = T(1) - h.alpha;
  const T T_i = st.transmittance / one_minus_alpha;
  const T w = h.alpha * T_i;
  const T m = normalized_depth(h.z, near, far) - g.m_shift;

  // s_i: dL/dw_i with the distortion term taken from the final totals,
  // distortion = A D2 - D^2  =>  d/dw_i = D2 + m_i^2 A - 2 m_i D.
  T s_i = g.v_depth_sum * h.z + g.v_distortion * (g.D2 + m * m * g.A - T(2) * m * g.D);
  for (int c = 0; c < kChannels; ++c) s_i += g.v_color[c] * color[c];
  for (int k = 0; k < 3; ++k) s_i += g.v_normal[k] * normal[k];

  const T v_alpha = T_i * (s_i - st.last_dL_dT);
  st.last_dL_dT = h.alpha * s_i + one_minus_alpha * st.last_dL_dT;
  st.transmittance = T_i;

  for (int c = 0; c < kChannels; ++c) grad[kGradColor + c] += w * g.v_color[c];
  for (int k = 0; k < 3; ++k) grad[kGradNormal + k] += w * g.v_normal[k];

  // d distortion / d m_i = w_i (2 m_i A - 2 D)
  T v_z = w * g.v_depth_sum +
          g.v_distortion * w * (T(2) * m * g.A - T(2) * g.D) *
              normalized_depth_dz(h.z, near, far);
  if (is_median) v_z += g.v_median;

  // alpha = min(kAlphaMax, o G): the clamp has zero gradient.
  T v_G = T(0);
  if (s.opacity * h.G < T(kAlphaMax)) {
    grad[kGradOpacity] += h.G * v_alpha;
    v_G = s.opacity * v_alpha;
  }
  const T v_rho = T(-0.5) * h.G * v_G;

  if (h.lowpass) {
    // rho = k |d|^2, d = centre - pixel, z = c_z = Tw[2]
    const T scale = T(2) * T(kLowpassInvVariance) * v_rho;
    for (int k = 0; k < 2; ++k) grad[kGradCenter + k] += scale * h.d[k];
    grad[kGradTw + 2] += v_z;
    return;
  }
  // rho = u^2 + v^2, z = Tw . (u, v, 1)
  const T v_u = T(2) * h.u * v_rho + s.Tw[0] * v_z;
  const T v_v = T(2) * h.v * v_rho + s.Tw[1] * v_z;
  grad[kGradTw + 0] += h.u * v_z;
  grad[kGradTw + 1] += h.v * v_z;
  grad[kGradTw + 2] += v_z;
  // (u, v) = (q0, q1) / q2
  const T inv_q2 = T(1) / h.q[2];
  T v_q[3];
  v_q[0] = v_u * inv_q2;
  v_q[1] = v_v * inv_q2;
  v_q[2] = -(v_u * h.u + v_v * h.v) * inv_q2;
  // q = hx x hy
  T v_hx[3], v_hy[3];
  cross3(h.hy, v_q, v_hx);
  cross3(v_q, h.hx, v_hy);
  // hx = Tu - x Tw, hy = Tv - y Tw
  for (int k = 0; k < 3; ++k) {
    grad[kGradTu + k] += v_hx[k];
    grad[kGradTv + k] += v_hy[k];
    grad[kGradTw + k] -= px * v_hx[k] + py * v_hy[k];
  }
}

}  // namespace splat
