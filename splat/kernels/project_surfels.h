// The fused per-surfel projection of splat.rasterize and its exact backward,
// as plain per-surfel maths (no allocation, no threads), written once for the
// CPU (cpu/project_cpu.cpp: blocks of 64 surfels, each step a loop that GCC
// vectorises across the block) and CUDA (cuda/project.cu: one surfel per
// thread, a block of 1).  Every function is SPLAT_HD (core.h) and uses only
// operations both compilers round the same way (no FMA: -ffp-contract=off,
// nvcc --fmad=false), so the CUDA emulation's results are bitwise the CPU's.
//
// One pass per surfel computes what splat/rasterize.py's torch path
// (_project, _screen_bounds, _surfel_colors, facing_normals) computes with
// dozens of whole-array ops: the screen matrix M = K [a b c] (rows Tu, Tv,
// Tw), the centre, the camera-facing normal, the SH colour, the camera depth,
// the pixel rectangle and the radius.  The backward pass recomputes the
// forward quantities of a surfel and applies the exact chain rule (checked by
// float64 finite differences in tests/test_projection.py).  Each step mirrors
// one line of the torch path, in the same precision: M, centre, normal and
// colour in T, the culling test and the bounds in float64.
#pragma once

#include <cmath>
#include <cstdint>

#include "core.h"

// The loops over a block's surfels: vectorised across surfels on the CPU
// (omp simd needs -fopenmp-simd or -fopenmp; elsewhere it is ignored), plain
// (a block of one surfel) in a CUDA kernel.  The unrolled loops give the
// surfel loops a straight-line body, or GCC keeps them scalar.
#if defined(__CUDACC__)
#define SPLAT_SIMD
#define SPLAT_UNROLL16 _Pragma("unroll")
#define SPLAT_UNROLL2 _Pragma("unroll")
#else
#define SPLAT_SIMD _Pragma("omp simd")
#define SPLAT_UNROLL16 _Pragma("GCC unroll 16")
#define SPLAT_UNROLL2 _Pragma("GCC unroll 2")
#endif

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
  T viewmat[16];       // world -> camera, row major (CUDA: each thread loads it, project.cu)
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

// Real SH constants (splat/sh.py), as scalars: nvcc's device code may use a
// namespace-scope constexpr scalar, not an array (host memory to it).
constexpr double kSH_C0 = 0.28209479177387814;
constexpr double kSH_C1 = 0.4886025119029199;
constexpr double kSH_C2_0 = 1.0925484305920792, kSH_C2_1 = -1.0925484305920792,
                 kSH_C2_2 = 0.31539156525252005, kSH_C2_3 = -1.0925484305920792,
                 kSH_C2_4 = 0.5462742152960396;
constexpr double kSH_C3_0 = -0.5900435899266435, kSH_C3_1 = 2.890611442640554,
                 kSH_C3_2 = -0.4570457994644658, kSH_C3_3 = 0.3731763325901154,
                 kSH_C3_4 = -0.4570457994644658, kSH_C3_5 = 1.445305721320277,
                 kSH_C3_6 = -0.5900435899266435;

// Per-surfel quantities shared by the forward and the backward pass.
template <typename T>
struct Projected {
  T qn[4];       // unit quaternion
  T qnorm;       // |quats / max|quats||
  T qmax;        // max |quats|
  T R[3][3];     // world rotation
  T Rc[3][3];    // camera rotation V R
  T cam[3];      // camera-space centre
  int32_t in_range;  // near < z < far (flags are 32-bit, not bool: a 1-byte
                     // type would set the surfel loops' vector width to 32)
  T M[3][3];     // rows Tu, Tv, Tw; zero when culled
  T safe_depth;  // M[2][2], or 1 when culled
  T center[2];
  T sign;        // +1, or -1 when the normal is flipped towards the camera
  T dir[3];      // unit view direction (means - camera centre)
  T dnorm;       // clamp_min(|means - camera centre|, 1e-12)
  int32_t dir_clamped;
};

template <typename T>
SPLAT_HD void camera_centre(const ProjectInputs<T>& in, T campos[3]) {
  const T* V = in.viewmat;
  // -V[:3,:3]^T t
  for (int j = 0; j < 3; ++j)
    campos[j] = -(V[0 * 4 + j] * V[3] + V[1 * 4 + j] * V[7] + V[2 * 4 + j] * V[11]);
}

template <typename T>
SPLAT_HD void project_one(const ProjectInputs<T>& in, const T campos[3], int64_t i,
                          Projected<T>& p) {
  const T* V = in.viewmat;
  const T* K = in.K;
  const T* q = in.quats + 4 * i;
  const T* m = in.means + 3 * i;
  const T* s = in.scales + 2 * i;
  // quat_to_rotmat: divide by the largest |component|, then normalise.
  p.qmax = hd_max(hd_max(std::abs(q[0]), std::abs(q[1])), hd_max(std::abs(q[2]), std::abs(q[3])));
  T qs[4];
  for (int k = 0; k < 4; ++k) qs[k] = q[k] / p.qmax;
  p.qnorm = std::sqrt(qs[0] * qs[0] + qs[1] * qs[1] + qs[2] * qs[2] + qs[3] * qs[3]);
  for (int k = 0; k < 4; ++k) p.qn[k] = qs[k] / p.qnorm;
  unit_quat_to_rotmat(p.qn, p.R);
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c)
      p.Rc[r][c] = V[r * 4 + 0] * p.R[0][c] + V[r * 4 + 1] * p.R[1][c] + V[r * 4 + 2] * p.R[2][c];
  for (int r = 0; r < 3; ++r)
    p.cam[r] = (m[0] * V[r * 4 + 0] + m[1] * V[r * 4 + 1] + m[2] * V[r * 4 + 2]) + V[r * 4 + 3];
  const double cz = double(p.cam[2]);
  p.in_range = int32_t(cz > in.near) & int32_t(cz < in.far);  // both read: no branch
  // columns [a b c] = [Rc_0 s0, Rc_1 s1, cam], zero when culled; M = K columns.
  T col[3][3];
  for (int r = 0; r < 3; ++r) {
    // products first, then selects: an operation inside a conditional keeps
    // GCC from vectorising the surfel loop (it could raise an FP exception)
    const T a = p.Rc[r][0] * s[0], b = p.Rc[r][1] * s[1];
    col[r][0] = p.in_range ? a : T(0);
    col[r][1] = p.in_range ? b : T(0);
    col[r][2] = p.in_range ? p.cam[r] : T(0);
  }
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c)
      p.M[r][c] = K[r * 3 + 0] * col[0][c] + K[r * 3 + 1] * col[1][c] + K[r * 3 + 2] * col[2][c];
  p.safe_depth = p.in_range ? p.M[2][2] : T(1);
  p.center[0] = p.M[0][2] / p.safe_depth;
  p.center[1] = p.M[1][2] / p.safe_depth;
  // facing_normals: flip R[:, 2] when it points away from the camera.
  T d[3];
  for (int k = 0; k < 3; ++k) d[k] = m[k] - campos[k];
  const T facing = d[0] * p.R[0][2] + d[1] * p.R[1][2] + d[2] * p.R[2][2];
  p.sign = facing > 0 ? T(-1) : T(1);
  // SH direction: d / clamp_min(|d|, 1e-12)
  const T len = std::sqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2]);
  p.dir_clamped = !(len > T(1e-12));
  p.dnorm = p.dir_clamped ? T(1e-12) : len;
  for (int k = 0; k < 3; ++k) p.dir[k] = d[k] / p.dnorm;
}

// The degree is a template argument, so that the SH loops below are
// straight-line code that vectorises across surfels; b[j] is written to
// b[j * stride] (a column of a block's [16][B] array).
template <int degree, typename T>
SPLAT_HD int sh_basis(T x, T y, T z, T* b, int stride) {
  b[0 * stride] = T(kSH_C0);
  if constexpr (degree < 1) return 1;
  b[1 * stride] = T(-kSH_C1) * y;
  b[2 * stride] = T(kSH_C1) * z;
  b[3 * stride] = T(-kSH_C1) * x;
  if constexpr (degree < 2) return 4;
  const T xx = x * x, yy = y * y, zz = z * z, xy = x * y, yz = y * z, xz = x * z;
  b[4 * stride] = T(kSH_C2_0) * xy;
  b[5 * stride] = T(kSH_C2_1) * yz;
  b[6 * stride] = T(kSH_C2_2) * (2 * zz - xx - yy);
  b[7 * stride] = T(kSH_C2_3) * xz;
  b[8 * stride] = T(kSH_C2_4) * (xx - yy);
  if constexpr (degree < 3) return 9;
  b[9 * stride] = T(kSH_C3_0) * y * (3 * xx - yy);
  b[10 * stride] = T(kSH_C3_1) * xy * z;
  b[11 * stride] = T(kSH_C3_2) * y * (4 * zz - xx - yy);
  b[12 * stride] = T(kSH_C3_3) * z * (2 * zz - 3 * xx - 3 * yy);
  b[13 * stride] = T(kSH_C3_4) * x * (4 * zz - xx - yy);
  b[14 * stride] = T(kSH_C3_5) * z * (xx - yy);
  b[15 * stride] = T(kSH_C3_6) * x * (xx - 3 * yy);
  return 16;
}

// d(basis)/d(dir) contracted with gb (dL/d basis, gb[j * stride]): adds to (vx, vy, vz).
template <int degree, typename T>
SPLAT_HD void sh_basis_vjp(T x, T y, T z, const T* gb, int stride, T& vx, T& vy, T& vz) {
  if constexpr (degree < 1) return;
  vy += T(-kSH_C1) * gb[1 * stride];
  vz += T(kSH_C1) * gb[2 * stride];
  vx += T(-kSH_C1) * gb[3 * stride];
  if constexpr (degree < 2) return;
  const T xx = x * x, yy = y * y, zz = z * z;
  const T c0 = T(kSH_C2_0), c1 = T(kSH_C2_1), c2 = T(kSH_C2_2), c3 = T(kSH_C2_3), c4 = T(kSH_C2_4);
  vx += gb[4 * stride] * c0 * y + gb[6 * stride] * c2 * (-2 * x) + gb[7 * stride] * c3 * z +
        gb[8 * stride] * c4 * (2 * x);
  vy += gb[4 * stride] * c0 * x + gb[5 * stride] * c1 * z + gb[6 * stride] * c2 * (-2 * y) +
        gb[8 * stride] * c4 * (-2 * y);
  vz += gb[5 * stride] * c1 * y + gb[6 * stride] * c2 * (4 * z) + gb[7 * stride] * c3 * x;
  if constexpr (degree < 3) return;
  const T e0 = T(kSH_C3_0), e1 = T(kSH_C3_1), e2 = T(kSH_C3_2), e3 = T(kSH_C3_3), e4 = T(kSH_C3_4),
          e5 = T(kSH_C3_5), e6 = T(kSH_C3_6);
  vx += gb[9 * stride] * e0 * (6 * x * y) + gb[10 * stride] * e1 * (y * z) +
        gb[11 * stride] * e2 * (-2 * x * y) + gb[12 * stride] * e3 * (-6 * x * z) +
        gb[13 * stride] * e4 * (4 * zz - 3 * xx - yy) + gb[14 * stride] * e5 * (2 * x * z) +
        gb[15 * stride] * e6 * (3 * xx - 3 * yy);
  vy += gb[9 * stride] * e0 * (3 * xx - 3 * yy) + gb[10 * stride] * e1 * (x * z) +
        gb[11 * stride] * e2 * (4 * zz - xx - 3 * yy) + gb[12 * stride] * e3 * (-6 * y * z) +
        gb[13 * stride] * e4 * (-2 * x * y) + gb[14 * stride] * e5 * (-2 * y * z) +
        gb[15 * stride] * e6 * (-6 * x * y);
  vz += gb[10 * stride] * e1 * (x * y) + gb[11 * stride] * e2 * (8 * y * z) +
        gb[12 * stride] * e3 * (6 * zz - 3 * xx - 3 * yy) + gb[13 * stride] * e4 * (8 * x * z) +
        gb[14 * stride] * e5 * (xx - yy);
}

// rho cutoff of a surfel, 2 ln(255 opacity) (rasterize.py _screen_bounds), in
// float64: a pixel is drawn only where opacity exp(-rho / 2) >= 1/255.  Apart
// from screen_bounds because std::log is a library call, which keeps the loop
// around it scalar.
SPLAT_HD double cutoff_k2(double opacity) { return 2.0 * std::log(hd_max(opacity * 255.0, 1e-30)); }

// _screen_bounds for one surfel, in float64: rect (x0, y0, x1, y1) and radius,
// given k2 = cutoff_k2(opacity).
template <typename T>
SPLAT_HD void screen_bounds(const ProjectInputs<T>& in, const Projected<T>& p, double opacity,
                            double k2, int32_t rect[4], int32_t& radius) {
  // Flags are int32_t and every branch is a select, so that the surfel loop
  // around this vectorises (see Projected).
  const int W = in.width, H = in.height, side = hd_max(W, H);
  int32_t visible = p.in_range & int32_t(opacity >= kAlphaMin) & int32_t(k2 > 1e-12);
  k2 = visible ? k2 : 1.0;
  const double wt[3] = {1.0, 1.0, -1.0 / k2};
  double M[3][3];
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c) M[r][c] = double(p.M[r][c]);
  double dual[3][3];
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c)
      dual[r][c] =
          M[r][0] * wt[0] * M[c][0] + M[r][1] * wt[1] * M[c][1] + M[r][2] * wt[2] * M[c][2];
  const int32_t bounded = int32_t(dual[2][2] < 0);
  const double c22 = bounded ? dual[2][2] : -1.0;
  const double disc = std::sqrt(k2 / kLowpassInvVariance);
  const double centre[2] = {double(p.center[0]), double(p.center[1])};
  const int32_t screen[2] = {W, H};
  double lo[2], hi[2];
  int32_t first[2], last[2];
  SPLAT_UNROLL2
  for (int a = 0; a < 2; ++a) {
    const double mid = dual[a][2] / c22;
    const double half = std::sqrt(hd_max(mid * mid - dual[a][a] / c22, 0.0));
    const double lo_a = hd_min(mid - half, centre[a] - disc);
    const double hi_a = hd_max(mid + half, centre[a] + disc);
    lo[a] = bounded ? lo_a : 0.0;
    hi[a] = bounded ? hi_a : double(screen[a]);
    // clamped to [-1, side + 1] first, so int32_t holds them
    const double f = hd_min(hd_max(std::ceil(lo[a] - 0.5 - 1.0), -1.0), double(side + 1));
    const double l = hd_min(hd_max(std::floor(hi[a] - 0.5 + 1.0), -1.0), double(side + 1));
    first[a] = hd_min(hd_max(int32_t(f), 0), screen[a]);
    last[a] = hd_min(hd_max(int32_t(l) + 1, 0), screen[a]);
    visible &= int32_t(last[a] > first[a]);
  }
  rect[0] = visible ? first[0] : 0;
  rect[1] = visible ? first[1] : 0;
  rect[2] = visible ? last[0] : 0;
  rect[3] = visible ? last[1] : 0;
  const double extent = hd_max(hd_max(hi[0] - centre[0], centre[0] - lo[0]),
                               hd_max(hi[1] - centre[1], centre[1] - lo[1]));
  const double r = visible ? hd_min(std::ceil(hd_max(extent, 0.0)), kRadiusMax) : 0.0;
  radius = int32_t((bounded | !visible) ? r : double(side));
}

// h = max(|Tu|, |Tv|) + max(W, H) |Tw| (rasterize.py _check_magnitude), in float64.
template <typename T>
SPLAT_HD double magnitude(const Projected<T>& p, int side) {
  double a = 0.0, b = 0.0;
  for (int c = 0; c < 3; ++c) {
    a = hd_max(a, hd_max(std::abs(double(p.M[0][c])), std::abs(double(p.M[1][c]))));
    b = hd_max(b, std::abs(double(p.M[2][c])));
  }
  return a + double(side) * b;
}

// The SH basis of one block's view directions, and per channel the sum
// sum_j b_j(dir) co_j that the colour max(sum + 0.5, 0) clamps.
template <int B, int degree, typename T>
SPLAT_HD void sh_sums_block(const ProjectInputs<T>& in, const T (&dir)[3][B], int64_t b0, int len,
                            T (&basis)[(degree + 1) * (degree + 1)][B], T (&sums)[3][B]) {
  const T* coeffs = in.coeffs;
  const int64_t stride = in.num_coeffs * 3;
  constexpr int nb = (degree + 1) * (degree + 1);
  // basis is a structure of arrays: every access below is a unit-stride column
  SPLAT_SIMD
  for (int l = 0; l < len; ++l) sh_basis<degree>(dir[0][l], dir[1][l], dir[2][l], &basis[0][l], B);
  for (int c = 0; c < 3; ++c) {
    SPLAT_SIMD
    for (int l = 0; l < len; ++l) {
      const T* co = coeffs + stride * (b0 + l);
      T v = basis[0][l] * co[c];
      SPLAT_UNROLL16  // straight-line code, or the surfel loop stays scalar
          for (int j = 1; j < nb; ++j) v = v + basis[j][l] * co[3 * j + c];
      sums[c][l] = v;
    }
  }
}

// Colours of one block: max(sum_j b_j(dir) co_j + 0.5, 0).
template <int B, int degree, typename T>
SPLAT_HD void sh_colors_block(const ProjectInputs<T>& in, T* color, const T (&dir)[3][B],
                              int64_t b0, int len) {
  T basis[(degree + 1) * (degree + 1)][B], sums[3][B];
  sh_sums_block<B, degree>(in, dir, b0, len, basis, sums);
  for (int c = 0; c < 3; ++c) {
    SPLAT_SIMD
    for (int l = 0; l < len; ++l) color[3 * (b0 + l) + c] = hd_max(sums[c][l] + T(0.5), T(0));
  }
}

// The SH part of the backward for one block: dL/dcoeffs, and the view
// direction's share of dL/dmeans, added to g.v_means (which holds the
// geometry's share) in the order of the scalar expression m + d.
template <int B, int degree, typename T>
SPLAT_HD void sh_backward_block(const ProjectInputs<T>& in, const ProjectGrads<T>& g,
                                const T (&dir)[3][B], const T (&dnorm)[B],
                                const int32_t (&dir_clamped)[B], int64_t b0, int len) {
  const T* coeffs = in.coeffs;
  const int64_t num_coeffs = in.num_coeffs, stride = in.num_coeffs * 3;
  const T* v_color = g.v_color;
  const int64_t v_color_row_stride = g.v_color_row_stride;
  T* v_coeffs = g.v_coeffs;
  T* v_means = g.v_means;
  constexpr int nb = (degree + 1) * (degree + 1);
  T basis[nb][B], gb[nb][B], vc[3][B];
  sh_sums_block<B, degree>(in, dir, b0, len, basis, vc);
  // colour = max(sum + 0.5, 0): gradient passes where the argument >= 0.
  for (int c = 0; c < 3; ++c) {
    SPLAT_SIMD
    for (int l = 0; l < len; ++l) {
      const T up = v_color[v_color_row_stride * (b0 + l) + c];
      vc[c][l] = vc[c][l] + T(0.5) >= T(0) ? up : T(0);
    }
  }
  SPLAT_SIMD
  for (int l = 0; l < len; ++l) {
    const T* co = coeffs + stride * (b0 + l);
    T* vco = v_coeffs + stride * (b0 + l);
    SPLAT_UNROLL16
    for (int j = 0; j < nb; ++j) {
      for (int c = 0; c < 3; ++c) vco[3 * j + c] = basis[j][l] * vc[c][l];
      gb[j][l] = co[3 * j] * vc[0][l] + co[3 * j + 1] * vc[1][l] + co[3 * j + 2] * vc[2][l];
    }
  }
  SPLAT_SIMD
  for (int l = 0; l < len; ++l) {
    const T x = dir[0][l], y = dir[1][l], z = dir[2][l];
    T vx = 0, vy = 0, vz = 0;  // dL/d(dir); scalars, not an array, so the loop vectorises
    sh_basis_vjp<degree>(x, y, z, &gb[0][l], B, vx, vy, vz);
    const T dd = vx * x + vy * y + vz * z;
    // clamped (|means - camera| < 1e-12): no projection onto the tangent plane
    const bool clamped = dir_clamped[l];
    T* vm = v_means + 3 * (b0 + l);
    vm[0] += clamped ? vx / dnorm[l] : (vx - x * dd) / dnorm[l];
    vm[1] += clamped ? vy / dnorm[l] : (vy - y * dd) / dnorm[l];
    vm[2] += clamped ? vz / dnorm[l] : (vz - z * dd) / dnorm[l];
  }
  // coefficients beyond the degree get no gradient
  for (int l = 0; l < len; ++l)
    for (int64_t j = nb; j < num_coeffs; ++j)
      for (int c = 0; c < 3; ++c) v_coeffs[stride * (b0 + l) + 3 * j + c] = T(0);
}

// One block of surfels [b0, b0 + len): the geometry and bounds, then the SH
// colours, each a loop vectorised across surfels.  Returns the number of
// surfels over the magnitude limits.
template <int B, typename T>
SPLAT_HD int64_t project_forward_block(const ProjectInputs<T>& in_ref,
                                       const ProjectOutputs<T>& out_ref, const T campos_ref[3],
                                       int64_t b0, int len) {
  // Local copies: the output stores cannot alias them, so their fields load
  // once rather than in every iteration (which would keep the loop scalar).
  const ProjectInputs<T> in = in_ref;
  const ProjectOutputs<T> out = out_ref;
  const T campos[3] = {campos_ref[0], campos_ref[1], campos_ref[2]};
  const int side = hd_max(in.width, in.height);
  double k2[B];
  for (int l = 0; l < len; ++l) k2[l] = cutoff_k2(double(in.opacities[b0 + l]));
  T dir[3][B];
  int32_t over_limit[B];  // per surfel, summed after the loop (no simd reduction)
  SPLAT_SIMD
  for (int l = 0; l < len; ++l) {
    const int64_t i = b0 + l;
    Projected<T> p;
    project_one(in, campos, i, p);
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 3; ++c) out.Tuvw[9 * i + 3 * r + c] = p.M[r][c];
    out.center[2 * i] = p.center[0];
    out.center[2 * i + 1] = p.center[1];
    for (int k = 0; k < 3; ++k) out.normal[3 * i + k] = p.sign * p.R[k][2];
    out.depth[i] = p.cam[2];
    for (int k = 0; k < 3; ++k) dir[k][l] = p.dir[k];
    int32_t* rect = out.pixel_rect + 4 * i;
    screen_bounds(in, p, double(in.opacities[i]), k2[l], rect, out.radii[i]);
    const int32_t drawn = int32_t(rect[2] > rect[0]) & int32_t(rect[3] > rect[1]);
    const double h = magnitude(p, side);
    over_limit[l] =
        (p.in_range & int32_t(!(h <= in.limit_finite))) | (drawn & int32_t(!(h <= in.limit_drawn)));
  }
  int64_t bad = 0;
  for (int l = 0; l < len; ++l) bad += over_limit[l];
  if (in.coeffs) {
    switch (in.sh_degree) {
      case 0:
        sh_colors_block<B, 0>(in, out.color, dir, b0, len);
        break;
      case 1:
        sh_colors_block<B, 1>(in, out.color, dir, b0, len);
        break;
      case 2:
        sh_colors_block<B, 2>(in, out.color, dir, b0, len);
        break;
      default:
        sh_colors_block<B, 3>(in, out.color, dir, b0, len);
        break;
    }
  }
  return bad;
}

// The gradients of one block, vectorised across surfels: the geometry's,
// then the SH part (colour coefficients, and its share of dL/dmeans, added to
// the means gradient in the order of the scalar expression).
template <int B, typename T>
SPLAT_HD void project_backward_block(const ProjectInputs<T>& in_ref, const ProjectGrads<T>& g_ref,
                                     const T campos_ref[3], int64_t b0, int len) {
  // Local copies, as in project_forward_block.
  const ProjectInputs<T> in = in_ref;
  const ProjectGrads<T> g = g_ref;
  const T campos[3] = {campos_ref[0], campos_ref[1], campos_ref[2]};
  const T* V = in.viewmat;
  const T* K = in.K;
  T dir[3][B], dnorm[B];
  int32_t dir_clamped[B];
  SPLAT_SIMD
  for (int l = 0; l < len; ++l) {
    const int64_t i = b0 + l;
    Projected<T> p;
    project_one(in, campos, i, p);
    for (int k = 0; k < 3; ++k) dir[k][l] = p.dir[k];
    dnorm[l] = p.dnorm;
    dir_clamped[l] = p.dir_clamped;
    const T* s = in.scales + 2 * i;
    // dL/dM: the Tuvw rows, plus the centre M[0:2, 2] / M[2, 2].
    T vM[3][3];
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 3; ++c) vM[r][c] = g.v_Tuvw[g.v_Tuvw_row_stride * i + 3 * r + c];
    const T vcx = g.v_center[g.v_center_row_stride * i],
            vcy = g.v_center[g.v_center_row_stride * i + 1];
    // means2d: Tu += dx Tw, Tv += dy Tw, centre += (dx, dy), at dx = dy = 0.
    g.v_means2d[2 * i] = (vM[0][0] * p.M[2][0] + vM[0][1] * p.M[2][1] + vM[0][2] * p.M[2][2]) + vcx;
    g.v_means2d[2 * i + 1] =
        (vM[1][0] * p.M[2][0] + vM[1][1] * p.M[2][1] + vM[1][2] * p.M[2][2]) + vcy;
    // Culled surfels (not in range) get zero geometry gradients: selects
    // below rather than a branch, so that the loop stays one vector path
    // (their safe_depth is 1, so the discarded values are finite).
    vM[0][2] += vcx / p.safe_depth;
    vM[1][2] += vcy / p.safe_depth;
    vM[2][2] -= (vcx * p.center[0] + vcy * p.center[1]) / p.safe_depth;
    // columns = K^T vM
    T vcol[3][3];
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 3; ++c)
        vcol[r][c] = K[0 * 3 + r] * vM[0][c] + K[1 * 3 + r] * vM[1][c] + K[2 * 3 + r] * vM[2][c];
    T v_m[3], v_s[2], v_R[3][3];
    // c = V m + t
    for (int k = 0; k < 3; ++k) {
      const T v = V[0 * 4 + k] * vcol[0][2] + V[1 * 4 + k] * vcol[1][2] + V[2 * 4 + k] * vcol[2][2];
      v_m[k] = p.in_range ? v : T(0);
    }
    // a = Rc_0 s0, b = Rc_1 s1
    for (int c = 0; c < 2; ++c) {
      const T v = vcol[0][c] * p.Rc[0][c] + vcol[1][c] * p.Rc[1][c] + vcol[2][c] * p.Rc[2][c];
      v_s[c] = p.in_range ? v : T(0);
    }
    // Rc = V R: v_R = V^T v_Rc (columns 0 and 1)
    for (int c = 0; c < 2; ++c) {
      T v_Rc[3];
      for (int r = 0; r < 3; ++r) v_Rc[r] = vcol[r][c] * s[c];
      for (int k = 0; k < 3; ++k) {
        const T v = V[0 * 4 + k] * v_Rc[0] + V[1 * 4 + k] * v_Rc[1] + V[2 * 4 + k] * v_Rc[2];
        v_R[k][c] = p.in_range ? v : T(0);
      }
    }
    // the normal's column, as the scalar 0 + sign n (so -0 becomes +0 alike)
    for (int k = 0; k < 3; ++k)
      v_R[k][2] = T(0) + p.sign * g.v_normal[g.v_normal_row_stride * i + k];
    // rotation matrix -> unit quaternion
    const T w = p.qn[0], x = p.qn[1], y = p.qn[2], z = p.qn[3];
    const T(&G)[3][3] = v_R;
    T vq[4];
    vq[0] =
        2 * (-z * G[0][1] + y * G[0][2] + z * G[1][0] - x * G[1][2] - y * G[2][0] + x * G[2][1]);
    vq[1] = 2 * (y * G[0][1] + z * G[0][2] + y * G[1][0] - 2 * x * G[1][1] - w * G[1][2] +
                 z * G[2][0] + w * G[2][1] - 2 * x * G[2][2]);
    vq[2] = 2 * (-2 * y * G[0][0] + x * G[0][1] + w * G[0][2] + x * G[1][0] + z * G[1][2] -
                 w * G[2][0] + z * G[2][1] - 2 * y * G[2][2]);
    vq[3] = 2 * (-2 * z * G[0][0] - w * G[0][1] + x * G[0][2] + w * G[1][0] - 2 * z * G[1][1] +
                 y * G[1][2] + x * G[2][0] + y * G[2][1]);
    // qn = qs / |qs|, qs = q / max|q| (the max held constant)
    const T dot = vq[0] * w + vq[1] * x + vq[2] * y + vq[3] * z;
    for (int k = 0; k < 4; ++k) g.v_quats[4 * i + k] = (vq[k] - p.qn[k] * dot) / p.qnorm / p.qmax;
    for (int k = 0; k < 3; ++k) g.v_means[3 * i + k] = v_m[k];
    g.v_scales[2 * i] = v_s[0];
    g.v_scales[2 * i + 1] = v_s[1];
  }
  if (!in.coeffs) return;
  switch (in.sh_degree) {
    case 0:
      sh_backward_block<B, 0>(in, g, dir, dnorm, dir_clamped, b0, len);
      break;
    case 1:
      sh_backward_block<B, 1>(in, g, dir, dnorm, dir_clamped, b0, len);
      break;
    case 2:
      sh_backward_block<B, 2>(in, g, dir, dnorm, dir_clamped, b0, len);
      break;
    default:
      sh_backward_block<B, 3>(in, g, dir, dnorm, dir_clamped, b0, len);
      break;
  }
}

}  // namespace splat
