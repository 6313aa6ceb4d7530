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
#include <cstring>

#include "raster_args.h"

// Always inlined, on the host as on the device: the CPU's SIMD tile loops
// (cpu/tile_loop.h) run these functions on 8-float vectors inside functions
// compiled for AVX2 / AVX-512, and an out-of-line copy would be compiled for
// baseline x86-64, where a 32-byte vector argument is passed another way
// (wrong values, not just slow code).
#if defined(__CUDACC__)
#define SPLAT_HD __host__ __device__ __forceinline__
#else
#define SPLAT_HD inline __attribute__((always_inline))
#endif

namespace splat {

// std::max and std::min, spelt out: nvcc does not let device code call them
// (constexpr host functions) without --expt-relaxed-constexpr.  The same
// expressions as libstdc++'s (NaN handling included), so the CPU build
// compiles the same code.
template <typename V>
SPLAT_HD V hd_max(V a, V b) {
  return (a < b) ? b : a;
}
template <typename V>
SPLAT_HD V hd_min(V a, V b) {
  return (b < a) ? b : a;
}

// The rotation matrix of a unit quaternion qn = (w, x, y, z), row major
// (reference.quat_to_rotmat after its normalisation): the one copy of these
// expressions for the surfels' and the 3D Gaussians' projections.
template <typename T>
SPLAT_HD void unit_quat_to_rotmat(const T qn[4], T R[3][3]) {
  const T w = qn[0], x = qn[1], y = qn[2], z = qn[3];
  R[0][0] = 1 - 2 * (y * y + z * z);
  R[0][1] = 2 * (x * y - w * z);
  R[0][2] = 2 * (x * z + w * y);
  R[1][0] = 2 * (x * y + w * z);
  R[1][1] = 1 - 2 * (x * x + z * z);
  R[1][2] = 2 * (y * z - w * x);
  R[2][0] = 2 * (x * z - w * y);
  R[2][1] = 2 * (y * z + w * x);
  R[2][2] = 1 - 2 * (x * x + y * y);
}

// ---- constants: the single C++ home (mirrors splat/conventions.py) ---------
constexpr double kAlphaMax = 0.99;
constexpr double kAlphaMin = 1.0 / 255.0;
constexpr double kTransmittanceMin = 1e-4;
constexpr double kMedianTransmittance = 0.5;
constexpr double kLowpassInvVariance = 2.0;
// 3D Gaussians: the screen-space dilation of 3DGS's EWA projection, px^2
// (conventions.EWA_DILATION; project_gaussians.h).
constexpr double kEwaDilation = 0.3;
// Beyond rho = 2 ln(255) even an opaque surfel has alpha < kAlphaMin, so the
// exponential can be skipped there (a cheap exact reject; the margin covers
// rounding of exp).
constexpr double kRhoCutoff = 11.1;  // > 2 ln(255) = 11.0825
constexpr int kTileSize = 16;
// Largest screen radius reported, 2^30 px (conventions.RADIUS_MAX): radii are
// int32 and carry no gradient, so a footprint larger than any image is
// reported as this instead of overflowing.
constexpr double kRadiusMax = 1073741824.0;
constexpr int kChannels = 3;

// Number of scalars in the per-surfel gradient record written by the backward
// pass, in this order: Tu(3) Tv(3) Tw(3) centre(2) normal(3) colour(3) opacity(1).
constexpr int kGradTu = 0, kGradTv = 3, kGradTw = 6, kGradCenter = 9, kGradNormal = 11,
              kGradColor = 14, kGradOpacity = 17, kGradSize = 18;

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
SPLAT_HD void load_surfel(const T* Tuvw, const T* center, const T* opacity, int64_t id,
                          SurfelParams<T>& s) {
  for (int k = 0; k < 3; ++k) {
    s.Tu[k] = Tuvw[id * 9 + k];
    s.Tv[k] = Tuvw[id * 9 + 3 + k];
    s.Tw[k] = Tuvw[id * 9 + 6 + k];
  }
  s.center[0] = center[id * 2];
  s.center[1] = center[id * 2 + 1];
  s.opacity = opacity[id];
}

// ---- lanes ------------------------------------------------------------------
// The per-pixel functions below are written once for a "lane" type V: a
// scalar (float/double, on the host and the device) or, on the CPU, a vector
// of 8 float32 pixels (cpu/simd.h).  Branches that depend on the pixel are
// written as selects on a mask, so every lane performs exactly the scalar's
// operations in the scalar's order (no FMA contraction: -ffp-contract=off on
// the host, --fmad=false on the device), and the vector path is bitwise the
// scalar path.  Masked-out lanes may compute garbage (inf, NaN); it is never
// selected.  For scalars the mask is bool and these helpers are trivial.
template <typename V>
struct Lanes {
  using Mask = bool;
  using Int = int32_t;
};
template <typename V>
using MaskOf = typename Lanes<V>::Mask;
template <typename V>
using IntOf = typename Lanes<V>::Int;

SPLAT_HD bool mask_and(bool a, bool b) { return a && b; }
SPLAT_HD bool mask_not(bool a) { return !a; }
SPLAT_HD bool any_lane(bool a) { return a; }
SPLAT_HD float select(bool m, float a, float b) { return m ? a : b; }
SPLAT_HD double select(bool m, double a, double b) { return m ? a : b; }
SPLAT_HD int32_t select(bool m, int32_t a, int32_t b) { return m ? a : b; }
SPLAT_HD bool select(bool m, bool a, bool b) { return m ? a : b; }

// ---- exp ---------------------------------------------------------------------
// float32 exp written out (Cephes' expf: range reduction by ln 2 split in two
// parts, degree-5 polynomial, exponent by bit construction; ~1 ulp), so that
// the scalar CPU path, the SIMD lanes and the CUDA device compute the very
// same bits (library expf differs between glibc, SIMD and CUDA).  Generic over
// the lane type; needs trunc_to_int, to_float and pow2i for it.
SPLAT_HD int32_t trunc_to_int(float x) { return static_cast<int32_t>(x); }
SPLAT_HD float to_float(int32_t n) { return static_cast<float>(n); }
// 2^n for n in [-126, 127], exactly.
SPLAT_HD float pow2i(int32_t n) {
  const int32_t bits = (n + 127) << 23;
#if defined(__CUDA_ARCH__)
  return __int_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

template <typename V>
SPLAT_HD V exp_float(V x) {
  const auto underflow = x < -87.0f;  // exp < 1.7e-38: returns 0 (no denormals)
  x = select(x > 88.0f, V(88.0f), x);
  x = select(underflow, V(-87.0f), x);
  // n = floor(x / ln 2 + 1/2)
  const V fx = x * 1.44269504088896341f + 0.5f;
  V fn = to_float(trunc_to_int(fx));
  fn = select(fn > fx, fn - 1.0f, fn);
  x = x - fn * 0.693359375f;
  x = x - fn * -2.12194440e-4f;
  const V z = x * x;
  V y = V(1.9875691500e-4f);
  y = y * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * z + x + 1.0f;
  return select(underflow, V(0.0f), y * pow2i(trunc_to_int(fn)));
}

// exp in the scalar's own precision: the portable float32 exp above, and the
// library exp for float64 (the finite-difference precision).
SPLAT_HD float exp_of(float x) { return exp_float(x); }
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

// The tiles surfel `id` is listed in: tiles_of its pixel rectangle, clamped to
// the grid (an out-of-grid rectangle must not alias into the neighbouring
// row).  Empty (x1 <= x0 or y1 <= y0) for a culled surfel.
SPLAT_HD PixelRect listed_tiles(const int32_t* rects, int64_t id, int tiles_x, int tiles_y) {
  PixelRect t = tiles_of(load_pixel_rect(rects, id));
  t.x0 = t.x0 > 0 ? t.x0 : 0;
  t.y0 = t.y0 > 0 ? t.y0 : 0;
  t.x1 = t.x1 < tiles_x ? t.x1 : tiles_x;
  t.y1 = t.y1 < tiles_y ? t.y1 : tiles_y;
  return t;
}

SPLAT_HD int64_t tile_count(const PixelRect& t) {
  return (t.x1 > t.x0 && t.y1 > t.y0) ? int64_t(t.x1 - t.x0) * (t.y1 - t.y0) : 0;
}

// Radix-sortable key of a depth: an unsigned integer whose order is the float
// order (negative values flipped, positive ones with the sign bit set), so
// the order is right for any non-NaN depth.  -0 is folded into +0 so that the
// two compare equal, as they do for `<`.  Both backends sort surfels by this
// key, stably (ties keep index order).
SPLAT_HD uint32_t depth_sort_key(float d) {
  d = d == 0.0f ? 0.0f : d;
#if defined(__CUDA_ARCH__)
  const uint32_t b = __float_as_uint(d);
#else
  uint32_t b;
  std::memcpy(&b, &d, sizeof b);
#endif
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
SPLAT_HD uint64_t depth_sort_key(double d) {
  d = d == 0.0 ? 0.0 : d;
#if defined(__CUDA_ARCH__)
  const uint64_t b = static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t b;
  std::memcpy(&b, &d, sizeof b);
#endif
  return (b & 0x8000000000000000ull) ? ~b : (b | 0x8000000000000000ull);
}

template <typename T>
SPLAT_HD void cross3(const T* a, const T* b, T* out) {
  out[0] = a[1] * b[2] - a[2] * b[1];
  out[1] = a[2] * b[0] - a[0] * b[2];
  out[2] = a[0] * b[1] - a[1] * b[0];
}

template <typename V, typename T>
SPLAT_HD V normalized_depth(V z, T near, T far) {
  return far / (far - near) * (T(1) - near / z);
}

template <typename V, typename T>
SPLAT_HD V normalized_depth_dz(V z, T near, T far) {
  return far / (far - near) * near / (z * z);
}

// ---- the ray-surfel intersection -------------------------------------------
// Everything the backward pass needs to differentiate one pixel-surfel pair.
template <typename V>
struct Hit {
  V hx[3], hy[3];  // screen planes in surfel coordinates
  V q[3];          // hx x hy
  V u, v;          // local coordinates (3D branch only)
  V d[2];          // centre - pixel (2D branch)
  V G;             // exp(-rho / 2)
  V alpha;         // min(kAlphaMax, opacity * G)
  V z;             // camera depth of the sample
  MaskOf<V> lowpass;      // true when the screen-space fallback won
  MaskOf<V> contributes;  // alpha >= kAlphaMin and z > near
};

// The division-free first half of intersect(): the screen planes, q, the
// low-pass choice and the operands of the rho tests, at pixel centres
// (px, py).  Returns the lanes whose rho (of the chosen branch) is below
// `cut`, tested without dividing by q2.
template <typename V>
struct Footprint {
  V rho2d;  // kLowpassInvVariance |centre - pixel|^2
  V qq;     // q0^2 + q1^2
  V q2q2;   // q2^2; the 3D rho is qq / q2q2
};

// The screen plane of pixel column px (hx, and d[0] of the centre offset)
// and of pixel row py (hy, d[1]): each depends on one coordinate only, so a
// sweep over a block of pixels can compute them once per column or row.
template <typename T, typename V>
SPLAT_HD void column_plane(const SurfelParams<T>& s, V px, Hit<V>& h) {
  for (int k = 0; k < 3; ++k) h.hx[k] = s.Tu[k] - px * s.Tw[k];
  h.d[0] = s.center[0] - px;
}
template <typename T, typename V>
SPLAT_HD void row_plane(const SurfelParams<T>& s, V py, Hit<V>& h) {
  for (int k = 0; k < 3; ++k) h.hy[k] = s.Tv[k] - py * s.Tw[k];
  h.d[1] = s.center[1] - py;
}

// footprint() of the planes already in h.
template <typename T, typename V>
SPLAT_HD MaskOf<V> plane_footprint(T cut, Hit<V>& h, Footprint<V>& f) {
  cross3(h.hx, h.hy, h.q);
  f.rho2d = T(kLowpassInvVariance) * (h.d[0] * h.d[0] + h.d[1] * h.d[1]);
  // rho3d < rho2d, written without dividing by q2: an edge-on or zero-area
  // surfel (q2 == 0) falls to the fallback instead of producing inf/NaN.
  f.qq = h.q[0] * h.q[0] + h.q[1] * h.q[1];
  f.q2q2 = h.q[2] * h.q[2];
  h.lowpass = mask_not(f.qq < f.rho2d * f.q2q2);
  return select(h.lowpass, MaskOf<V>(f.rho2d < cut), MaskOf<V>(f.qq < cut * f.q2q2));
}

template <typename T, typename V>
SPLAT_HD MaskOf<V> footprint(const SurfelParams<T>& s, V px, V py, T cut, Hit<V>& h,
                             Footprint<V>& f) {
  column_plane(s, px, h);
  row_plane(s, py, h);
  return plane_footprint(cut, h, f);
}

// Evaluates surfel `s` at pixel centres (px, py) (one per lane).
template <typename T, typename V>
SPLAT_HD void intersect(const SurfelParams<T>& s, V px, V py, T near, Hit<V>& h) {
  Footprint<V> f;
  // Cheap exact reject before any division: past kRhoCutoff alpha < kAlphaMin.
  const MaskOf<V> near_enough = footprint(s, px, py, T(kRhoCutoff), h, f);
  const V rho2d = f.rho2d;
  h.contributes = near_enough;
  h.G = h.alpha = h.u = h.v = h.z = V(T(0));
  if (!any_lane(near_enough)) return;
  // The 3D branch's division is selected away in fallback lanes (q2 may be 0).
  h.u = select(h.lowpass, V(T(0)), h.q[0] / h.q[2]);
  h.v = select(h.lowpass, V(T(0)), h.q[1] / h.q[2]);
  const V rho = select(h.lowpass, rho2d, h.u * h.u + h.v * h.v);
  // In the fallback the surfel is a sub-pixel blob at its centre's depth.
  h.z = select(h.lowpass, V(s.Tw[2]), s.Tw[0] * h.u + s.Tw[1] * h.v + s.Tw[2]);
  h.G = select(near_enough, exp_of(T(-0.5) * rho), V(T(0)));
  const V raw_alpha = s.opacity * h.G;
  h.alpha = select(raw_alpha < T(kAlphaMax), raw_alpha, V(T(kAlphaMax)));
  h.contributes = mask_and(near_enough, mask_and(h.alpha >= T(kAlphaMin), h.z > near));
}

// ---- front-to-back blending ------------------------------------------------
// Running per-pixel state of the forward pass.  A, D, D2 are the sums of w,
// w*m' and w*m'^2 over the surfels blended so far; the distortion
// sum_i sum_{j<i} w_i w_j (m_i - m_j)^2 is accumulated from them.
// m' = m - m_shift, with m_shift the first blended surfel's m: the distortion
// only sees differences of m, so the shift changes nothing exactly (its
// derivative is identically zero), but it keeps the sums small and removes
// most of the float32 cancellation in m^2 A + D2 - 2 m D.
template <typename V>
struct PixelState {
  V transmittance;
  V color[kChannels];
  V depth_sum;
  V normal[3];
  V A, D, D2;
  V m_shift;
  V distortion;
  V median_depth;
  IntOf<V> median_index;  // list position of the median surfel, -1 if none
  IntOf<V> end;           // one past the list position of the last blended surfel
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

// Blends one contributing sample into the pixels of the lanes in `active`.
// A lane whose transmittance would fall below kTransmittanceMin is left
// unchanged and reported in the returned mask: that pixel is then finished.
// HitT: any sample with `alpha` and `z` (Hit, GaussianHit); NormalT: T for a
// normal per surfel, V for one per lane (a 3D Gaussian's normal varies over
// its footprint).
template <typename V, typename T, typename HitT, typename NormalT>
SPLAT_HD MaskOf<V> blend_lanes(PixelState<V>& p, const HitT& h, MaskOf<V> active, const T* color,
                               const NormalT* normal, T near, T far, int32_t list_pos) {
  const V next_T = p.transmittance * (T(1) - h.alpha);
  const MaskOf<V> stop = next_T < T(kTransmittanceMin);
  const MaskOf<V> go = mask_and(active, mask_not(stop));
  if (!any_lane(go)) return mask_and(active, stop);
  const V w = h.alpha * p.transmittance;
  const V nd = normalized_depth(h.z, near, far);
  p.m_shift = select(mask_and(go, MaskOf<V>(p.end == 0)), nd, p.m_shift);
  const V m = nd - p.m_shift;
  for (int c = 0; c < kChannels; ++c)
    p.color[c] = select(go, p.color[c] + w * color[c], p.color[c]);
  p.depth_sum = select(go, p.depth_sum + w * h.z, p.depth_sum);
  for (int k = 0; k < 3; ++k) p.normal[k] = select(go, p.normal[k] + w * normal[k], p.normal[k]);
  p.distortion = select(go, p.distortion + w * (m * m * p.A + p.D2 - T(2) * m * p.D), p.distortion);
  p.A = select(go, p.A + w, p.A);
  p.D = select(go, p.D + w * m, p.D);
  p.D2 = select(go, p.D2 + w * m * m, p.D2);
  const MaskOf<V> median = mask_and(go, MaskOf<V>(p.transmittance > T(kMedianTransmittance)));
  p.median_depth = select(median, h.z, p.median_depth);
  p.median_index = select(median, IntOf<V>(list_pos), p.median_index);
  p.transmittance = select(go, next_T, p.transmittance);
  p.end = select(go, IntOf<V>(list_pos + 1), p.end);
  return mask_and(active, stop);
}

// The scalar form: returns false (pixel unchanged) when the pixel is finished.
template <typename T, typename HitT>
SPLAT_HD bool blend(PixelState<T>& p, const HitT& h, const T* color, const T* normal, T near, T far,
                    int32_t list_pos) {
  return !blend_lanes<T>(p, h, true, color, normal, near, far, list_pos);
}

// ---- back-to-front gradients -----------------------------------------------
// Upstream gradients of one pixel and the final totals of its forward pass.
template <typename V>
struct PixelGrad {
  V v_color[kChannels];
  V v_depth_sum;
  V v_normal[3];
  V v_distortion;
  V v_median;
  V A, D, D2, m_shift;  // final totals (the distortion gradient needs only these)
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
  for (int c = 0; c < kChannels; ++c)
    g.v_color[c] = up.v_color_sum[pix * up.pixel_stride[0] + c * up.color_channel_stride];
  g.v_depth_sum = up.v_depth_sum[pix * up.pixel_stride[2]];
  for (int k = 0; k < 3; ++k)
    g.v_normal[k] = up.v_normal_sum[pix * up.pixel_stride[3] + k * up.normal_channel_stride];
  g.v_distortion = up.v_distortion[pix * up.pixel_stride[4]];
  g.v_median = up.v_median_depth[pix * up.pixel_stride[5]];
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
template <typename V>
struct BackwardState {
  V transmittance;
  V last_dL_dT;
};

// The walk's start at pixel `pix`: the final transmittance and the upstream
// dL/d(final transmittance).
template <typename T>
SPLAT_HD BackwardState<T> initial_backward_state(const T* transmittance, const UpstreamGrads<T>& up,
                                                 int64_t pix) {
  return BackwardState<T>{transmittance[pix], up.v_transmittance[pix * up.pixel_stride[1]]};
}

// Differentiates the samples of the lanes in `active` (list position
// `list_pos`) and adds their gradients to `grad` (kGradSize accumulators, one
// lane each).  `is_median`: lanes whose median surfel this is.
// What one blended sample (alpha, z, colour, normal) contributes to the
// gradient before the primitive's own maths: its weight w_i and dL/dalpha_i,
// dL/dz_i.  Advances the walk `st` past the sample (lanes in `active`).
template <typename V>
struct SampleGrad {
  V w, v_alpha, v_z;
};

template <typename T, typename V, typename NormalT>
SPLAT_HD SampleGrad<V> blend_backward(BackwardState<V>& st, const PixelGrad<V>& g, V alpha, V z,
                                      MaskOf<V> active, const T* color, const NormalT* normal,
                                      T near, T far, MaskOf<V> is_median) {
  const V one_minus_alpha = T(1) - alpha;
  const V T_i = st.transmittance / one_minus_alpha;
  SampleGrad<V> r;
  r.w = alpha * T_i;
  const V m = normalized_depth(z, near, far) - g.m_shift;

  // s_i: dL/dw_i with the distortion term taken from the final totals,
  // distortion = A D2 - D^2  =>  d/dw_i = D2 + m_i^2 A - 2 m_i D.
  V s_i = g.v_depth_sum * z + g.v_distortion * (g.D2 + m * m * g.A - T(2) * m * g.D);
  for (int c = 0; c < kChannels; ++c) s_i += g.v_color[c] * color[c];
  for (int k = 0; k < 3; ++k) s_i += g.v_normal[k] * normal[k];

  r.v_alpha = T_i * (s_i - st.last_dL_dT);
  st.last_dL_dT = select(active, alpha * s_i + one_minus_alpha * st.last_dL_dT, st.last_dL_dT);
  st.transmittance = select(active, T_i, st.transmittance);

  // d distortion / d m_i = w_i (2 m_i A - 2 D)
  const V v_z = r.w * g.v_depth_sum + g.v_distortion * r.w * (T(2) * m * g.A - T(2) * g.D) *
                                          normalized_depth_dz(z, near, far);
  r.v_z = select(is_median, v_z + g.v_median, v_z);
  return r;
}

template <typename T, typename V>
SPLAT_HD void backward_lanes(BackwardState<V>& st, const PixelGrad<V>& g, const SurfelParams<T>& s,
                             const Hit<V>& h, MaskOf<V> active, const T* color, const T* normal,
                             V px, V py, T near, T far, MaskOf<V> is_median, V* grad) {
  const V zero = V(T(0));
  const SampleGrad<V> sg =
      blend_backward(st, g, h.alpha, h.z, active, color, normal, near, far, is_median);
  const V w = sg.w, v_alpha = sg.v_alpha, v_z = sg.v_z;

  for (int c = 0; c < kChannels; ++c)
    grad[kGradColor + c] += select(active, w * g.v_color[c], zero);
  for (int k = 0; k < 3; ++k) grad[kGradNormal + k] += select(active, w * g.v_normal[k], zero);

  // alpha = min(kAlphaMax, o G): the clamp has zero gradient.
  const MaskOf<V> unclamped = mask_and(active, MaskOf<V>(s.opacity * h.G < T(kAlphaMax)));
  grad[kGradOpacity] += select(unclamped, h.G * v_alpha, zero);
  const V v_G = select(unclamped, s.opacity * v_alpha, zero);
  const V v_rho = T(-0.5) * h.G * v_G;

  // Fallback lanes: rho = k |d|^2, d = centre - pixel, z = c_z = Tw[2].
  const MaskOf<V> flat = mask_and(active, h.lowpass);
  const V scale = T(2) * T(kLowpassInvVariance) * v_rho;
  for (int k = 0; k < 2; ++k) grad[kGradCenter + k] += select(flat, scale * h.d[k], zero);

  // 3D lanes: rho = u^2 + v^2, z = Tw . (u, v, 1)
  const MaskOf<V> solid = mask_and(active, mask_not(h.lowpass));
  const V v_u = T(2) * h.u * v_rho + s.Tw[0] * v_z;
  const V v_v = T(2) * h.v * v_rho + s.Tw[1] * v_z;
  grad[kGradTw + 0] += select(solid, h.u * v_z, zero);
  grad[kGradTw + 1] += select(solid, h.v * v_z, zero);
  grad[kGradTw + 2] += select(active, v_z, zero);  // both branches
  // (u, v) = (q0, q1) / q2
  const V inv_q2 = T(1) / h.q[2];
  V v_q[3];
  v_q[0] = v_u * inv_q2;
  v_q[1] = v_v * inv_q2;
  v_q[2] = -(v_u * h.u + v_v * h.v) * inv_q2;
  // q = hx x hy
  V v_hx[3], v_hy[3];
  cross3(h.hy, v_q, v_hx);
  cross3(v_q, h.hx, v_hy);
  // hx = Tu - x Tw, hy = Tv - y Tw
  for (int k = 0; k < 3; ++k) {
    grad[kGradTu + k] += select(solid, v_hx[k], zero);
    grad[kGradTv + k] += select(solid, v_hy[k], zero);
    grad[kGradTw + k] -= select(solid, px * v_hx[k] + py * v_hy[k], zero);
  }
}

// The scalar form, for one contributing sample.
template <typename T>
SPLAT_HD void backward_step(BackwardState<T>& st, const PixelGrad<T>& g, const SurfelParams<T>& s,
                            const Hit<T>& h, const T* color, const T* normal, T px, T py, T near,
                            T far, bool is_median, T* grad) {
  backward_lanes(st, g, s, h, true, color, normal, px, py, near, far, is_median, grad);
}

// ---- 3D Gaussians -------------------------------------------------------------
// A 3D Gaussian reaches the pixel loop as kGaussParams scalars in pixel space,
// built (with autograd) by splat/rasterize_3dgs.py; splat/reference_3dgs.py
// is the oracle and derives them.  At pixel centre p, with
// delta = p - m (m the footprint's centre) and d~ = (delta_x, delta_y, 1):
//
//   rho    = delta^T C delta                       C = S^-1, the EWA conic
//   alpha  = min(kAlphaMax, o exp(-rho / 2))       o includes the antialiasing factor
//   z      = (b . d~) / (d~^T Q d~)                where the density peaks along the ray
//   n      = n0 - 2 z N d~,  normal = n / |n|      world space, facing the camera
//
// For the camera-space mean mu and precision P = Sigma_c^-1, the world ->
// camera rotation W, and the ray of the pixel d = A d~ (d_z = 1) with
// A = K^-1 [[1, 0, m_x], [0, 1, m_y], [0, 0, 1]]:
//   b = A^T P mu,   Q = A^T P A,   N = W^T P A,   n0 = W^T P mu,
// i.e. z = t* = d^T P mu / d^T P d maximises exp(-(t d - mu)^T P (t d - mu) / 2),
// and n = W^T P (mu - 2 x*) at the peak x* = t* d is the normal of the
// surface the peaks sweep (it always faces the camera: x*^T P (2 x* - mu) =
// t*^2 d^T P d >= 0).  Both z and the normal are unchanged when P is scaled,
// so P comes normalised to largest eigenvalue 1.  A sample counts where
// alpha >= kAlphaMin, z > near, d~^T Q d~ > 0 and |n|^2 is positive and
// finite (true, up to rounding, for any positive-definite P and a scene
// whose coordinates' squares fit the float type).
//
// Row layout of the parameters [N, kGaussParams]; the gradient record
// [N, kGaussGradSize] is the same followed by the colour.
constexpr int kGaussConic = 0;         // C_xx, C_xy, C_yy
constexpr int kGaussCenter = 3;        // m_x, m_y
constexpr int kGaussOpacity = 5;       // o
constexpr int kGaussPeakNum = 6;       // b (3)
constexpr int kGaussPeakDen = 9;       // Q_00, Q_01, Q_02, Q_11, Q_12, Q_22
constexpr int kGaussNormalSlope = 15;  // N, row-major 3 x 3
constexpr int kGaussNormalBase = 24;   // n0 (3)
constexpr int kGaussParams = 27;
constexpr int kGaussGradColor = kGaussParams, kGaussGradSize = kGaussParams + kChannels;

// Q_rc's place among the six stored entries of a symmetric 3 x 3.
SPLAT_HD int sym3_index(int r, int c) {
  const int lo = r < c ? r : c, hi = r < c ? c : r;
  return lo == 0 ? hi : (lo == 1 ? 2 + hi : 5);
}

template <typename T>
struct GaussianParams {
  T p[kGaussParams];
};

template <typename T>
SPLAT_HD void load_gaussian(const T* params, int64_t id, GaussianParams<T>& g) {
  for (int k = 0; k < kGaussParams; ++k) g.p[k] = params[id * kGaussParams + k];
}

SPLAT_HD float sqrt_of(float x) { return sqrtf(x); }
SPLAT_HD double sqrt_of(double x) { return sqrt(x); }

// Everything the backward pass needs of one pixel-Gaussian pair.
template <typename V>
struct GaussianHit {
  V d[3];        // d~ = (delta_x, delta_y, 1)
  V G, alpha;    // exp(-rho / 2), min(kAlphaMax, o G)
  V Qd[3];       // Q d~
  V num, den;    // b . d~, d~^T Q d~
  V z;           // num / den
  V Nd[3];       // N d~
  V inv_len;     // 1 / |n|
  V normal[3];   // n / |n|
  MaskOf<V> contributes;
};

template <typename T, typename V>
SPLAT_HD void intersect_gaussian(const GaussianParams<T>& g, V px, V py, T near,
                                 GaussianHit<V>& h) {
  const T* q = g.p;
  h.d[0] = px - q[kGaussCenter];
  h.d[1] = py - q[kGaussCenter + 1];
  h.d[2] = V(T(1));
  const V rho = q[kGaussConic] * h.d[0] * h.d[0] + T(2) * q[kGaussConic + 1] * h.d[0] * h.d[1] +
                q[kGaussConic + 2] * h.d[1] * h.d[1];
  // Past kRhoCutoff even o = 1 gives alpha < kAlphaMin (a cheap exact reject).
  const MaskOf<V> near_enough = rho < T(kRhoCutoff);
  h.contributes = near_enough;
  h.G = h.alpha = h.z = V(T(0));
  if (!any_lane(near_enough)) return;
  h.G = select(near_enough, exp_of(T(-0.5) * rho), V(T(0)));
  const V raw_alpha = q[kGaussOpacity] * h.G;
  h.alpha = select(raw_alpha < T(kAlphaMax), raw_alpha, V(T(kAlphaMax)));
  for (int r = 0; r < 3; ++r)
    h.Qd[r] = q[kGaussPeakDen + sym3_index(r, 0)] * h.d[0] +
              q[kGaussPeakDen + sym3_index(r, 1)] * h.d[1] + q[kGaussPeakDen + sym3_index(r, 2)];
  h.num = q[kGaussPeakNum] * h.d[0] + q[kGaussPeakNum + 1] * h.d[1] + q[kGaussPeakNum + 2];
  h.den = h.d[0] * h.Qd[0] + h.d[1] * h.Qd[1] + h.Qd[2];
  const MaskOf<V> ray_ok = h.den > T(0);
  h.z = select(ray_ok, h.num / h.den, V(T(0)));
  V n[3];
  for (int k = 0; k < 3; ++k) {
    h.Nd[k] = q[kGaussNormalSlope + 3 * k] * h.d[0] + q[kGaussNormalSlope + 3 * k + 1] * h.d[1] +
              q[kGaussNormalSlope + 3 * k + 2];
    n[k] = q[kGaussNormalBase + k] - T(2) * h.z * h.Nd[k];
  }
  const V len2 = n[0] * n[0] + n[1] * n[1] + n[2] * n[2];
  // Positive and finite (len2 * 0 is NaN for inf): a normal that overflows is no normal.
  const MaskOf<V> normal_ok = mask_and(len2 > T(0), len2 * T(0) == T(0));
  h.inv_len = select(normal_ok, T(1) / sqrt_of(len2), V(T(0)));
  for (int k = 0; k < 3; ++k) h.normal[k] = n[k] * h.inv_len;
  h.contributes = mask_and(mask_and(near_enough, h.alpha >= T(kAlphaMin)),
                           mask_and(mask_and(ray_ok, normal_ok), h.z > near));
}

// Differentiates the Gaussian samples of the lanes in `active` (the maths
// above, backwards), advancing the walk `st`, and writes what each lane adds
// to the gradient record into c[kGaussGradSize]: a record takes
// `record[j] += c[j]` per sample.  Entries a sample leaves alone (the
// clamped alpha's) are +0, which leaves a record unchanged: records start at
// +0 and a round-to-nearest sum is -0 only when both terms are.
template <typename T, typename V>
SPLAT_HD void gaussian_grad_lanes(BackwardState<V>& st, const PixelGrad<V>& g,
                                  const GaussianParams<T>& gp, const GaussianHit<V>& h,
                                  MaskOf<V> active, const T* color, T near, T far,
                                  MaskOf<V> is_median, V* c) {
  const T* q = gp.p;
  const V zero = V(T(0));
  const SampleGrad<V> sg =
      blend_backward(st, g, h.alpha, h.z, active, color, h.normal, near, far, is_median);
  const V w = sg.w;
  V v_z = sg.v_z;
  for (int ch = 0; ch < kChannels; ++ch) c[kGaussGradColor + ch] = w * g.v_color[ch];
  V v_d[2] = {zero, zero};

  // normal = n / |n|:  dL/dn = (v - normal (normal . v)) / |n|, v = w dL/d(normal sum)
  V v_normal[3], dot = zero;
  for (int k = 0; k < 3; ++k) {
    v_normal[k] = w * g.v_normal[k];
    dot += h.normal[k] * v_normal[k];
  }
  for (int k = 0; k < 3; ++k) {
    const V v_n = (v_normal[k] - h.normal[k] * dot) * h.inv_len;
    // n = n0 - 2 z N d~
    c[kGaussNormalBase + k] = v_n;
    v_z -= T(2) * v_n * h.Nd[k];
    const V v_Nd = T(-2) * h.z * v_n;
    for (int j = 0; j < 3; ++j) c[kGaussNormalSlope + 3 * k + j] = v_Nd * h.d[j];
    for (int j = 0; j < 2; ++j) v_d[j] += v_Nd * q[kGaussNormalSlope + 3 * k + j];
  }

  // z = num / den, num = b . d~, den = d~^T Q d~
  const V v_num = v_z / h.den;
  const V v_den = -v_z * h.z / h.den;
  for (int j = 0; j < 3; ++j) c[kGaussPeakNum + j] = v_num * h.d[j];
  for (int r = 0; r < 3; ++r)
    for (int k = r; k < 3; ++k)  // an off-diagonal entry stands for Q_rk and Q_kr
      c[kGaussPeakDen + sym3_index(r, k)] = (r == k ? T(1) : T(2)) * v_den * h.d[r] * h.d[k];
  for (int j = 0; j < 2; ++j) v_d[j] += v_num * q[kGaussPeakNum + j] + T(2) * v_den * h.Qd[j];

  // alpha = min(kAlphaMax, o G), G = exp(-rho / 2): the clamp has zero gradient.
  const MaskOf<V> unclamped = q[kGaussOpacity] * h.G < T(kAlphaMax);
  c[kGaussOpacity] = select(unclamped, h.G * sg.v_alpha, zero);
  const V v_rho = T(-0.5) * h.G * q[kGaussOpacity] * sg.v_alpha;
  c[kGaussConic] = select(unclamped, v_rho * h.d[0] * h.d[0], zero);
  c[kGaussConic + 1] = select(unclamped, T(2) * v_rho * h.d[0] * h.d[1], zero);
  c[kGaussConic + 2] = select(unclamped, v_rho * h.d[1] * h.d[1], zero);
  v_d[0] = select(unclamped,
                  v_d[0] + T(2) * v_rho * (q[kGaussConic] * h.d[0] + q[kGaussConic + 1] * h.d[1]),
                  v_d[0]);
  v_d[1] = select(
      unclamped,
      v_d[1] + T(2) * v_rho * (q[kGaussConic + 1] * h.d[0] + q[kGaussConic + 2] * h.d[1]), v_d[1]);
  // delta = p - m  (x - y is x + (-y) in IEEE arithmetic)
  c[kGaussCenter] = -v_d[0];
  c[kGaussCenter + 1] = -v_d[1];
}

// The scalar form: differentiates one contributing Gaussian sample and adds
// to `grad` (kGaussGradSize).
template <typename T>
SPLAT_HD void backward_gaussian_step(BackwardState<T>& st, const PixelGrad<T>& g,
                                     const GaussianParams<T>& gp, const GaussianHit<T>& h,
                                     const T* color, T near, T far, bool is_median, T* grad) {
  T c[kGaussGradSize];
  gaussian_grad_lanes(st, g, gp, h, true, color, near, far, is_median, c);
  for (int j = 0; j < kGaussGradSize; ++j) grad[j] += c[j];
}

}  // namespace splat
