// The EWA projection of one 3D Gaussian and its exact backward, as plain
// per-Gaussian maths (no loops over Gaussians, no allocation), templated on the
// scalar type and marked SPLAT_HD so that a CUDA kernel could call it as the
// CPU loops (cpu/project_gaussians_cpu.cpp) do.
//
// Each line mirrors one step of the PyTorch path it replaces on the CPU,
// splat/reference_3dgs.py project_gaussians and splat/rasterize_3dgs.py
// gaussian_kernel_inputs (that path stays the reference and the torch
// backend's): the same expressions in the same precision, so the two differ
// only by the rounding of sums taken in another order (torch's batched
// matmuls).  The backward recomputes the forward and applies the chain rule
// to every input torch differentiates: means, quats, scales, opacities, and
// per camera viewmat (W, t), K's fx, fy, cx, cy (directly and through the
// frustum limits of the affine approximation) and K^-1 (whose own backward,
// through torch.linalg.inv, stays in Python).
#pragma once

#include <cfloat>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core.h"

// Every loop over a small fixed range is unrolled, so that the loops over
// Gaussians around these functions (cpu/project_gaussians_cpu.cpp) have a
// straight-line body that the compiler vectorises.
#if defined(__CUDACC__)
#define SPLAT_UNROLL _Pragma("unroll")
#elif defined(__GNUC__) && !defined(__clang__)
#define SPLAT_UNROLL _Pragma("GCC unroll 32")
#else
#define SPLAT_UNROLL
#endif

namespace splat {

// 2^e where x = m 2^e, 0.5 <= m < 1 (frexp's e), and 1 where x is 0, negative
// or not finite: reference_3dgs.py _power_of_two_near.  From the bits, so that
// loops over Gaussians vectorise (frexp and ldexp are library calls).  x is S's
// largest entry, >= 0.3 px^2 (the dilation) up to rounding, so never subnormal,
// where this would differ from frexp.
template <typename T>
SPLAT_HD T power_of_two_near(T x) {
  using U = typename std::conditional<sizeof(T) == 4, uint32_t, uint64_t>::type;
  constexpr int kMantissa = sizeof(T) == 4 ? 23 : 52;
  constexpr U kExponentMask = sizeof(T) == 4 ? 0xff : 0x7ff;
  U bits;
  std::memcpy(&bits, &x, sizeof(T));
  const U e = (bits >> kMantissa) & kExponentMask;
  const U up = (e + 1) << kMantissa;  // 2^(e + 1 - bias); inf where that overflows, as ldexp
  T r;
  std::memcpy(&r, &up, sizeof(T));
  return (x > T(0) && e != kExponentMask) ? r : T(1);
}

// 1 where x is finite, else 0 (an int32_t compare: std::isfinite keeps GCC 12
// from vectorising the loops around it).
template <typename T>
SPLAT_HD int32_t finite_flag(T x) {
  // FLT_MAX / DBL_MAX, exact in T (numeric_limits is host-only for nvcc)
  return int32_t(std::abs(x) <= T(sizeof(T) == 4 ? double(FLT_MAX) : DBL_MAX));
}

// The camera of one projection, per call.
template <typename T>
struct GaussCamera {
  T W[3][3], t[3];        // viewmat = [W | t], world -> camera
  T fx, fy, cx, cy;       // K
  T Kinv[3][3];           // torch.linalg.inv(K), computed by the caller
  T lo[2], hi[2];         // frustum limits of x/z and y/z (gsplat's)
  int width, height;
  int antialiased;
};

// Fills the frustum limits from K and the image size, as project_gaussians:
// lo = -(c / f + 0.3 tan), hi = (size - c) / f + 0.3 tan, tan = 0.5 size / f.
template <typename T>
SPLAT_HD void gauss_camera_limits(GaussCamera<T>& cam) {
  const T f[2] = {cam.fx, cam.fy}, c[2] = {cam.cx, cam.cy};
  const T size[2] = {T(cam.width), T(cam.height)};
  SPLAT_UNROLL
  for (int a = 0; a < 2; ++a) {
    const T tan_a = T(0.5 * double(a == 0 ? cam.width : cam.height)) / f[a];
    cam.lo[a] = -(c[a] / f[a] + T(0.3) * tan_a);
    cam.hi[a] = (size[a] - c[a]) / f[a] + T(0.3) * tan_a;
  }
}

// The forward quantities of one Gaussian that its backward needs again.
template <typename T>
struct GaussProjected {
  T qn[4];            // unit quaternion
  T qdiv;             // what quats was divided by first (1, or max |q| for tiny/huge rows)
  T qlen;             // clamp_min(|q / qdiv|, 1e-12)
  int32_t qclamped;   // |q / qdiv| < 1e-12: the clamp holds the length
  T R[3][3];          // world rotation
  T Rc[3][3];         // camera rotation W R
  T mu[3];            // camera-space mean
  T s2[3];            // scales^2
  T pw[3];            // (s_min / s)^2: the normalised precision's eigenvalues
  T cov[3][3];        // Sigma_c = Rc diag(s2) Rc^T
  T P[3][3];          // Rc diag(pw) Rc^T (Sigma_c^-1 up to a positive factor)
  T uv[2];            // x / z, y / z
  T tuv[2];           // z clamp(x / z), z clamp(y / z)
  T J0[2];            // fx / z, fy / z
  T J2[2];            // -fx tx / z^2, -fy ty / z^2
  T JC[2][3];         // J Sigma_c
  T C2[2][2];         // J Sigma_c J^T
  T sc;               // power of two near max |S|
  T Sn[2][2];         // S / sc
  T det;              // det S / sc^2
  T cn[2][2];         // C2 / sc
  T det_orig;         // det C2 / sc^2
  T factor;           // antialiasing compensation, or 1
  T centre[2];        // px
  T A[3][3];          // [K^-1 e_x, K^-1 e_y, K^-1 (centre, 1)] as columns
  T PA[3][3];         // P A
  T Pmu[3];           // P mu
};

// Forward of one Gaussian: fills p, and the kGaussParams row `params` (core.h
// layout).  means, quats, scales: this Gaussian's rows; o its opacity.
template <typename T>
SPLAT_HD void gauss_project_forward(const GaussCamera<T>& cam, const T* m, const T* q, const T* s,
                                    T o, GaussProjected<T>& p, T* params) {
  // quat_to_rotmat (geometry.py): rows whose |q| is not a normal number are
  // first divided by their largest component (held constant), then q / |q|.
  const T amax =
      hd_max(hd_max(std::abs(q[0]), std::abs(q[1])), hd_max(std::abs(q[2]), std::abs(q[3])));
  const T norm0 = std::sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3]);
  // int32_t flags, not bool: a 1-byte type would set the vector width of the
  // loops around this to 16 or 32 lanes
  const int32_t plain = (finite_flag(norm0) & int32_t(norm0 >= T(1e-12))) | int32_t(amax == T(0));
  p.qdiv = plain ? T(1) : amax;
  T qs[4];
  SPLAT_UNROLL
  for (int k = 0; k < 4; ++k) qs[k] = q[k] / p.qdiv;
  const T len = std::sqrt(qs[0] * qs[0] + qs[1] * qs[1] + qs[2] * qs[2] + qs[3] * qs[3]);
  p.qclamped = !(len >= T(1e-12));
  p.qlen = p.qclamped ? T(1e-12) : len;
  SPLAT_UNROLL
  for (int k = 0; k < 4; ++k) p.qn[k] = qs[k] / p.qlen;
  unit_quat_to_rotmat(p.qn, p.R);
  SPLAT_UNROLL
  for (int r = 0; r < 3; ++r) {
    SPLAT_UNROLL
    for (int c = 0; c < 3; ++c)
      p.Rc[r][c] = cam.W[r][0] * p.R[0][c] + cam.W[r][1] * p.R[1][c] + cam.W[r][2] * p.R[2][c];
    p.mu[r] = (m[0] * cam.W[r][0] + m[1] * cam.W[r][1] + m[2] * cam.W[r][2]) + cam.t[r];
  }
  // Sigma_c, and the precision normalised to largest eigenvalue 1 (the factor
  // s_min^2 is held constant: the exact gradient through it is zero).
  const T s_min = hd_min(hd_min(s[0], s[1]), s[2]);
  SPLAT_UNROLL
  for (int k = 0; k < 3; ++k) {
    p.s2[k] = s[k] * s[k];
    const T r = s_min / s[k];
    p.pw[k] = r * r;
  }
  SPLAT_UNROLL
  for (int r = 0; r < 3; ++r) SPLAT_UNROLL
  for (int c = 0; c < 3; ++c) {
    p.cov[r][c] = (p.Rc[r][0] * p.s2[0]) * p.Rc[c][0] + (p.Rc[r][1] * p.s2[1]) * p.Rc[c][1] +
                  (p.Rc[r][2] * p.s2[2]) * p.Rc[c][2];
    p.P[r][c] = (p.Rc[r][0] * p.pw[0]) * p.Rc[c][0] + (p.Rc[r][1] * p.pw[1]) * p.Rc[c][1] +
                (p.Rc[r][2] * p.pw[2]) * p.Rc[c][2];
  }
  // The affine approximation at the centre clamped to the widened frustum.
  const T zc = p.mu[2];
  const T f[2] = {cam.fx, cam.fy};
  SPLAT_UNROLL
  for (int a = 0; a < 2; ++a) {
    p.uv[a] = p.mu[a] / zc;
    p.tuv[a] = zc * hd_min(hd_max(p.uv[a], cam.lo[a]), cam.hi[a]);
    p.J0[a] = f[a] / zc;
    p.J2[a] = -f[a] * p.tuv[a] / (zc * zc);
  }
  // J = [[J0x, 0, J2x], [0, J0y, J2y]]; C2 = (J Sigma) J^T
  SPLAT_UNROLL
  for (int a = 0; a < 2; ++a) SPLAT_UNROLL
  for (int k = 0; k < 3; ++k) p.JC[a][k] = p.J0[a] * p.cov[a][k] + p.J2[a] * p.cov[2][k];
  SPLAT_UNROLL
  for (int a = 0; a < 2; ++a) SPLAT_UNROLL
  for (int b = 0; b < 2; ++b) p.C2[a][b] = p.JC[a][b] * p.J0[b] + p.JC[a][2] * p.J2[b];
  // S = C2 + dilation I, and the determinants of S / sc and C2 / sc, sc a power
  // of two near max |S| (exact scaling: no overflow of det S in float32).
  T S[2][2];
  SPLAT_UNROLL
  for (int a = 0; a < 2; ++a) SPLAT_UNROLL
  for (int b = 0; b < 2; ++b) S[a][b] = a == b ? p.C2[a][b] + T(kEwaDilation) : p.C2[a][b];
  const T smax = hd_max(hd_max(std::abs(S[0][0]), std::abs(S[0][1])),
                        hd_max(std::abs(S[1][0]), std::abs(S[1][1])));
  p.sc = power_of_two_near(smax);
  SPLAT_UNROLL
  for (int a = 0; a < 2; ++a) SPLAT_UNROLL
  for (int b = 0; b < 2; ++b) {
    p.Sn[a][b] = S[a][b] / p.sc;
    p.cn[a][b] = p.C2[a][b] / p.sc;
  }
  p.det = p.Sn[0][0] * p.Sn[1][1] - p.Sn[0][1] * p.Sn[1][0];
  p.det_orig = p.cn[0][0] * p.cn[1][1] - p.cn[0][1] * p.cn[1][0];
  p.factor = cam.antialiased ? std::sqrt(hd_max(p.det_orig / p.det, T(0))) : T(1);
  const T c[2] = {cam.cx, cam.cy};
  SPLAT_UNROLL
  for (int a = 0; a < 2; ++a) p.centre[a] = f[a] * p.mu[a] / zc + c[a];
  // The ray of pixel centre + delta is A (delta, 1).
  SPLAT_UNROLL
  for (int r = 0; r < 3; ++r) {
    p.A[r][0] = cam.Kinv[r][0];
    p.A[r][1] = cam.Kinv[r][1];
    p.A[r][2] = p.centre[0] * cam.Kinv[r][0] + p.centre[1] * cam.Kinv[r][1] + cam.Kinv[r][2];
  }
  SPLAT_UNROLL
  for (int r = 0; r < 3; ++r) {
    SPLAT_UNROLL
    for (int c2 = 0; c2 < 3; ++c2)
      p.PA[r][c2] = p.P[r][0] * p.A[0][c2] + p.P[r][1] * p.A[1][c2] + p.P[r][2] * p.A[2][c2];
    p.Pmu[r] = p.P[r][0] * p.mu[0] + p.P[r][1] * p.mu[1] + p.P[r][2] * p.mu[2];
  }
  params[kGaussConic + 0] = p.Sn[1][1] / p.det / p.sc;
  params[kGaussConic + 1] = -p.Sn[0][1] / p.det / p.sc;
  params[kGaussConic + 2] = p.Sn[0][0] / p.det / p.sc;
  params[kGaussCenter + 0] = p.centre[0];
  params[kGaussCenter + 1] = p.centre[1];
  params[kGaussOpacity] = o * p.factor;
  SPLAT_UNROLL
  for (int j = 0; j < 3; ++j)
    params[kGaussPeakNum + j] = p.A[0][j] * p.Pmu[0] + p.A[1][j] * p.Pmu[1] + p.A[2][j] * p.Pmu[2];
  SPLAT_UNROLL
  for (int i = 0; i < 3; ++i) SPLAT_UNROLL
  for (int j = i; j < 3; ++j)
    params[kGaussPeakDen + sym3_index(i, j)] =
        p.A[0][i] * p.PA[0][j] + p.A[1][i] * p.PA[1][j] + p.A[2][i] * p.PA[2][j];
  SPLAT_UNROLL
  for (int r = 0; r < 3; ++r) SPLAT_UNROLL
  for (int c2 = 0; c2 < 3; ++c2)
    params[kGaussNormalSlope + 3 * r + c2] =
        cam.W[0][r] * p.PA[0][c2] + cam.W[1][r] * p.PA[1][c2] + cam.W[2][r] * p.PA[2][c2];
  SPLAT_UNROLL
  for (int c2 = 0; c2 < 3; ++c2)
    params[kGaussNormalBase + c2] =
        p.Pmu[0] * cam.W[0][c2] + p.Pmu[1] * cam.W[1][c2] + p.Pmu[2] * cam.W[2][c2];
}

// The camera's share of one Gaussian's gradient: added over Gaussians by the caller.
template <typename T>
struct GaussCameraGrad {
  T W[3][3], t[3];
  T fx, fy, cx, cy;
  T lo[2], hi[2];  // the frustum limits (chained to K once, gauss_camera_limits_backward)
  T Kinv[3][3];
};

// Backward of one Gaussian, given its forward p: v_params (kGaussParams) and
// v_centre (the centre output's own gradient, added to the params' centre
// entries).  Writes v_m[3], v_q[4], v_s[3], v_o, and this Gaussian's camera
// share into vc (overwritten).
template <typename T>
SPLAT_HD void gauss_project_backward(const GaussCamera<T>& cam, const T* m, const T* s, T o,
                                     const GaussProjected<T>& p, const T* g, const T v_centre[2],
                                     T* v_m, T* v_q, T* v_s, T& v_o, GaussCameraGrad<T>& vc) {
  const T zc = p.mu[2];
  T dA[3][3] = {}, dPA[3][3] = {}, dPmu[3] = {}, dP[3][3] = {}, dmu[3] = {}, dRc[3][3] = {};
  T dW[3][3] = {};
  // peak_den = (A^T P A) upper triangle: with G the upper-triangular upstream,
  // dA += PA G^T, dPA += A G.
  T G[3][3] = {};
  SPLAT_UNROLL
  for (int i = 0; i < 3; ++i) SPLAT_UNROLL
  for (int j = i; j < 3; ++j) G[i][j] = g[kGaussPeakDen + sym3_index(i, j)];
  SPLAT_UNROLL
  for (int k = 0; k < 3; ++k) SPLAT_UNROLL
  for (int i = 0; i < 3; ++i) {
    dA[k][i] += p.PA[k][0] * G[i][0] + p.PA[k][1] * G[i][1] + p.PA[k][2] * G[i][2];
    dPA[k][i] += p.A[k][0] * G[0][i] + p.A[k][1] * G[1][i] + p.A[k][2] * G[2][i];
  }
  // peak_num = A^T Pmu
  const T* gn = g + kGaussPeakNum;
  SPLAT_UNROLL
  for (int k = 0; k < 3; ++k) {
    SPLAT_UNROLL
    for (int j = 0; j < 3; ++j) dA[k][j] += p.Pmu[k] * gn[j];
    dPmu[k] += p.A[k][0] * gn[0] + p.A[k][1] * gn[1] + p.A[k][2] * gn[2];
  }
  // normal_slope = W^T PA, normal_base = W^T Pmu
  const T* gs = g + kGaussNormalSlope;
  const T* gb = g + kGaussNormalBase;
  SPLAT_UNROLL
  for (int k = 0; k < 3; ++k) {
    SPLAT_UNROLL
    for (int c = 0; c < 3; ++c)
      dPA[k][c] += cam.W[k][0] * gs[c] + cam.W[k][1] * gs[3 + c] + cam.W[k][2] * gs[6 + c];
    SPLAT_UNROLL
    for (int r = 0; r < 3; ++r)
      dW[k][r] += p.PA[k][0] * gs[3 * r] + p.PA[k][1] * gs[3 * r + 1] + p.PA[k][2] * gs[3 * r + 2];
    dPmu[k] += cam.W[k][0] * gb[0] + cam.W[k][1] * gb[1] + cam.W[k][2] * gb[2];
    SPLAT_UNROLL
    for (int c = 0; c < 3; ++c) dW[k][c] += p.Pmu[k] * gb[c];
  }
  // PA = P A, Pmu = P mu
  SPLAT_UNROLL
  for (int i = 0; i < 3; ++i) SPLAT_UNROLL
  for (int k = 0; k < 3; ++k) {
    dP[i][k] +=
        dPA[i][0] * p.A[k][0] + dPA[i][1] * p.A[k][1] + dPA[i][2] * p.A[k][2] + dPmu[i] * p.mu[k];
    dA[k][i] += p.P[0][k] * dPA[0][i] + p.P[1][k] * dPA[1][i] + p.P[2][k] * dPA[2][i];
  }
  SPLAT_UNROLL
  for (int k = 0; k < 3; ++k)
    dmu[k] += p.P[0][k] * dPmu[0] + p.P[1][k] * dPmu[1] + p.P[2][k] * dPmu[2];
  // A's columns: K^-1 e_x, K^-1 e_y, K^-1 (centre, 1)
  T dcentre[2] = {g[kGaussCenter] + v_centre[0], g[kGaussCenter + 1] + v_centre[1]};
  SPLAT_UNROLL
  for (int r = 0; r < 3; ++r) {
    vc.Kinv[r][0] = dA[r][0] + p.centre[0] * dA[r][2];
    vc.Kinv[r][1] = dA[r][1] + p.centre[1] * dA[r][2];
    vc.Kinv[r][2] = dA[r][2];
  }
  dcentre[0] += cam.Kinv[0][0] * dA[0][2] + cam.Kinv[1][0] * dA[1][2] + cam.Kinv[2][0] * dA[2][2];
  dcentre[1] += cam.Kinv[0][1] * dA[0][2] + cam.Kinv[1][1] * dA[1][2] + cam.Kinv[2][1] * dA[2][2];
  // opacity o * factor
  v_o = g[kGaussOpacity] * p.factor;
  const T dfactor = g[kGaussOpacity] * o;
  // conic = adj(Sn) / det / sc (entries xx, xy, yy)
  T dSn[2][2] = {}, dcn[2][2] = {};
  const T h[3] = {g[kGaussConic] / p.sc, g[kGaussConic + 1] / p.sc, g[kGaussConic + 2] / p.sc};
  const T adj[3] = {p.Sn[1][1], -p.Sn[0][1], p.Sn[0][0]};
  T ddet = -(h[0] * adj[0] + h[1] * adj[1] + h[2] * adj[2]) / (p.det * p.det);
  dSn[1][1] += h[0] / p.det;
  dSn[0][1] -= h[1] / p.det;
  dSn[0][0] += h[2] / p.det;
  {
    // factor = sqrt(clamp_min(det_orig / det, 0)): the clamp passes ratio >= 0.
    // Selects rather than a branch (the loops around this stay one vector
    // path), and on the results, so that the plain case adds no 0 * inf.
    const T ratio = p.det_orig / p.det;
    const int32_t pass = int32_t(cam.antialiased != 0) & int32_t(ratio >= T(0));
    const T dratio = pass ? dfactor / (T(2) * p.factor) : T(0);
    const T ddet_orig = dratio / p.det;
    const T ddet_aa = ddet - dratio * p.det_orig / (p.det * p.det);
    ddet = pass ? ddet_aa : ddet;
    dcn[0][0] = pass ? ddet_orig * p.cn[1][1] : T(0);
    dcn[1][1] = pass ? ddet_orig * p.cn[0][0] : T(0);
    dcn[0][1] = pass ? -(ddet_orig * p.cn[1][0]) : T(0);
    dcn[1][0] = pass ? -(ddet_orig * p.cn[0][1]) : T(0);
  }
  dSn[0][0] += ddet * p.Sn[1][1];
  dSn[1][1] += ddet * p.Sn[0][0];
  dSn[0][1] -= ddet * p.Sn[1][0];
  dSn[1][0] -= ddet * p.Sn[0][1];
  // S = C2 + dilation I; Sn = S / sc, cn = C2 / sc
  T dC2[2][2];
  SPLAT_UNROLL
  for (int a = 0; a < 2; ++a) SPLAT_UNROLL
  for (int b = 0; b < 2; ++b) dC2[a][b] = dSn[a][b] / p.sc + dcn[a][b] / p.sc;
  // C2 = J Sigma J^T (Sigma symmetric): dJ = (dC2 + dC2^T) J Sigma, dSigma = J^T dC2 J
  T dJ0[2], dJ2[2];
  SPLAT_UNROLL
  for (int a = 0; a < 2; ++a) {
    const T e0 = dC2[a][0] + dC2[0][a], e1 = dC2[a][1] + dC2[1][a];
    dJ0[a] = e0 * p.JC[0][a] + e1 * p.JC[1][a];
    dJ2[a] = e0 * p.JC[0][2] + e1 * p.JC[1][2];
  }
  // J's non-zero entries: column a (< 2) of row a is J0[a], column 2 is J2[a]
  T Jm[2][3] = {{p.J0[0], T(0), p.J2[0]}, {T(0), p.J0[1], p.J2[1]}};
  T dcov[3][3];
  SPLAT_UNROLL
  for (int j = 0; j < 3; ++j) SPLAT_UNROLL
  for (int k = 0; k < 3; ++k) {
    T v = T(0);
    SPLAT_UNROLL
    for (int a = 0; a < 2; ++a) SPLAT_UNROLL
    for (int b = 0; b < 2; ++b) v += Jm[a][j] * dC2[a][b] * Jm[b][k];
    dcov[j][k] = v;
  }
  // J0 = f / z, J2 = -f t / z^2, t = z clamp(x / z, lo, hi)
  const T f[2] = {cam.fx, cam.fy};
  T df[2] = {T(0), T(0)}, dcc[2] = {T(0), T(0)};
  T dz = T(0);
  SPLAT_UNROLL
  for (int a = 0; a < 2; ++a) {
    const T zz = zc * zc, nn = -f[a] * p.tuv[a];
    df[a] += dJ0[a] / zc;
    dz -= dJ0[a] * f[a] / zz;
    const T dnn = dJ2[a] / zz;
    dz -= T(2) * zc * (dJ2[a] * nn / (zz * zz));
    df[a] -= dnn * p.tuv[a];
    const T dt = -dnn * f[a];
    const T u = p.uv[a], uc = hd_min(hd_max(u, cam.lo[a]), cam.hi[a]);
    dz += dt * uc;
    const T duc = dt * zc;
    const T du = (int32_t(u >= cam.lo[a]) & int32_t(u <= cam.hi[a])) ? duc : T(0);
    vc.lo[a] = u < cam.lo[a] ? duc : T(0);
    vc.hi[a] = u > cam.hi[a] ? duc : T(0);
    dmu[a] += du / zc;
    dz -= du * p.mu[a] / zz;
    // centre = f x / z + c
    const T dq = dcentre[a] / zc;
    dz -= dcentre[a] * (f[a] * p.mu[a]) / zz;
    df[a] += dq * p.mu[a];
    dmu[a] += dq * f[a];
    dcc[a] += dcentre[a];
  }
  dmu[2] += dz;
  // Sigma = Rc diag(s2) Rc^T, P = Rc diag(pw) Rc^T
  T ds2[3], dpw[3];
  SPLAT_UNROLL
  for (int k = 0; k < 3; ++k) {
    T a = T(0), b = T(0);
    SPLAT_UNROLL
    for (int i = 0; i < 3; ++i) SPLAT_UNROLL
    for (int j = 0; j < 3; ++j) {
      a += p.Rc[i][k] * dcov[i][j] * p.Rc[j][k];
      b += p.Rc[i][k] * dP[i][j] * p.Rc[j][k];
    }
    ds2[k] = a;
    dpw[k] = b;
  }
  SPLAT_UNROLL
  for (int r = 0; r < 3; ++r) SPLAT_UNROLL
  for (int k = 0; k < 3; ++k) {
    T a = T(0), b = T(0);
    SPLAT_UNROLL
    for (int j = 0; j < 3; ++j) {
      a += (dcov[r][j] + dcov[j][r]) * p.Rc[j][k];
      b += (dP[r][j] + dP[j][r]) * p.Rc[j][k];
    }
    dRc[r][k] = a * p.s2[k] + b * p.pw[k];
  }
  const T s_min = hd_min(hd_min(s[0], s[1]), s[2]);
  SPLAT_UNROLL
  for (int k = 0; k < 3; ++k) {
    // s2 = s s; pw = (s_min / s)^2 with s_min constant
    const T r = s_min / s[k];
    v_s[k] = T(2) * s[k] * ds2[k] - T(2) * r * dpw[k] * s_min / (s[k] * s[k]);
  }
  // mu = W m + t; Rc = W R
  SPLAT_UNROLL
  for (int k = 0; k < 3; ++k)
    v_m[k] = cam.W[0][k] * dmu[0] + cam.W[1][k] * dmu[1] + cam.W[2][k] * dmu[2];
  SPLAT_UNROLL
  for (int r = 0; r < 3; ++r) {
    vc.t[r] = dmu[r];
    SPLAT_UNROLL
    for (int k = 0; k < 3; ++k)
      vc.W[r][k] = dW[r][k] + dmu[r] * m[k] + dRc[r][0] * p.R[k][0] + dRc[r][1] * p.R[k][1] +
                   dRc[r][2] * p.R[k][2];
  }
  T Gr[3][3];
  SPLAT_UNROLL
  for (int k = 0; k < 3; ++k) SPLAT_UNROLL
  for (int c = 0; c < 3; ++c)
    Gr[k][c] = cam.W[0][k] * dRc[0][c] + cam.W[1][k] * dRc[1][c] + cam.W[2][k] * dRc[2][c];
  // rotation matrix -> unit quaternion -> quats
  const T w = p.qn[0], x = p.qn[1], y = p.qn[2], z = p.qn[3];
  T vq[4];
  vq[0] = 2 * (-z * Gr[0][1] + y * Gr[0][2] + z * Gr[1][0] - x * Gr[1][2] - y * Gr[2][0] +
               x * Gr[2][1]);
  vq[1] = 2 * (y * Gr[0][1] + z * Gr[0][2] + y * Gr[1][0] - 2 * x * Gr[1][1] - w * Gr[1][2] +
               z * Gr[2][0] + w * Gr[2][1] - 2 * x * Gr[2][2]);
  vq[2] = 2 * (-2 * y * Gr[0][0] + x * Gr[0][1] + w * Gr[0][2] + x * Gr[1][0] + z * Gr[1][2] -
               w * Gr[2][0] + z * Gr[2][1] - 2 * y * Gr[2][2]);
  vq[3] = 2 * (-2 * z * Gr[0][0] - w * Gr[0][1] + x * Gr[0][2] + w * Gr[1][0] - 2 * z * Gr[1][1] +
               y * Gr[1][2] + x * Gr[2][0] + y * Gr[2][1]);
  // qn = qs / clamp_min(|qs|, 1e-12), qs = q / qdiv (qdiv constant)
  const T dot = p.qclamped ? T(0) : vq[0] * w + vq[1] * x + vq[2] * y + vq[3] * z;
  SPLAT_UNROLL
  for (int k = 0; k < 4; ++k) v_q[k] = (vq[k] - p.qn[k] * dot) / p.qlen / p.qdiv;
  vc.fx = df[0];
  vc.fy = df[1];
  vc.cx = dcc[0];
  vc.cy = dcc[1];
}

// The camera's gradient as a flat array: W (9), t (3), fx, fy, cx, cy, lo (2),
// hi (2), K^-1 (9).  Summed over the Gaussians in float64, per fixed block of
// kGaussCameraBlock Gaussians in order, then over the blocks in order (the CPU's
// blocks, cpu/project_gaussians_cpu.cpp; CUDA sums the same blocks the same way).
constexpr int kGaussCameraGradSize = 29;
constexpr int kGaussCameraBlock = 64;

template <typename T>
SPLAT_HD void gauss_camera_grad_flat(const GaussCameraGrad<T>& vc, T flat[kGaussCameraGradSize]) {
  SPLAT_UNROLL
  for (int r = 0; r < 3; ++r) {
    SPLAT_UNROLL
    for (int c = 0; c < 3; ++c) {
      flat[3 * r + c] = vc.W[r][c];
      flat[20 + 3 * r + c] = vc.Kinv[r][c];
    }
    flat[9 + r] = vc.t[r];
  }
  flat[12] = vc.fx;
  flat[13] = vc.fy;
  flat[14] = vc.cx;
  flat[15] = vc.cy;
  flat[16] = vc.lo[0];
  flat[17] = vc.lo[1];
  flat[18] = vc.hi[0];
  flat[19] = vc.hi[1];
}

// The summed flat gradient v to viewmat [4, 4], K and K^-1 [3, 3] (row major).
template <typename T>
SPLAT_HD void gauss_camera_grad_finish(const double v[kGaussCameraGradSize],
                                       const GaussCamera<T>& cam, T* v_viewmat, T* v_K,
                                       T* v_K_inv) {
  // viewmat = [W | t; 0 0 0 1]
  for (int k = 0; k < 16; ++k) v_viewmat[k] = T(0);
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) v_viewmat[4 * r + c] = T(v[3 * r + c]);
    v_viewmat[4 * r + 3] = T(v[9 + r]);
  }
  // The frustum limits (gauss_camera_limits) back to f and c, in float64:
  // lo = -(c / f + 0.3 tan), hi = (size - c) / f + 0.3 tan, tan = 0.5 size / f.
  double df[2] = {v[12], v[13]}, dc[2] = {v[14], v[15]};
  const double f[2] = {double(cam.fx), double(cam.fy)}, c[2] = {double(cam.cx), double(cam.cy)};
  const double size[2] = {double(cam.width), double(cam.height)};
  for (int a = 0; a < 2; ++a) {
    const double dlo = v[16 + a], dhi = v[18 + a];
    const double da = -dlo;  // lo = -a, a = c / f + 0.3 tan
    dc[a] += da / f[a] - dhi / f[a];
    df[a] += -da * c[a] / (f[a] * f[a]) - dhi * (size[a] - c[a]) / (f[a] * f[a]);
    const double dtan = 0.3 * da + 0.3 * dhi;
    df[a] += -dtan * (0.5 * size[a]) / (f[a] * f[a]);
  }
  for (int k = 0; k < 9; ++k) {
    v_K[k] = T(0);
    v_K_inv[k] = T(v[20 + k]);
  }
  v_K[0] = T(df[0]);
  v_K[4] = T(df[1]);
  v_K[2] = T(dc[0]);
  v_K[5] = T(dc[1]);
}

// ---- per call and per Gaussian, outside the vector loops ----------------------------
// (shared with cuda/project.cu, whose threads each run them for one Gaussian)

// The camera of a call: viewmat [4, 4] row major, K and K^-1 [3, 3].
template <typename T>
SPLAT_HD GaussCamera<T> gauss_camera(const T* viewmat, const T* K, const T* K_inv, int width,
                                     int height, int antialiased) {
  GaussCamera<T> cam{};
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 3; ++c) {
      cam.W[r][c] = viewmat[4 * r + c];
      cam.Kinv[r][c] = K_inv[3 * r + c];
    }
    cam.t[r] = viewmat[4 * r + 3];
  }
  cam.fx = K[0];
  cam.fy = K[4];
  cam.cx = K[2];
  cam.cy = K[5];
  cam.width = width;
  cam.height = height;
  cam.antialiased = antialiased;
  gauss_camera_limits(cam);
  return cam;
}

// Whether gaussian_kernel_inputs keeps a Gaussian (mean m, opacity o): camera
// depth of the mean (W_z . m + t_z, in the dtype, summed in the order of
// torch's means @ viewmat[2, :3] + viewmat[2, 3]) strictly inside (near, far)
// and opacity >= kAlphaMin, both compared in float64.
template <typename T>
SPLAT_HD bool gauss_kept(const T* m, T o, const T* viewmat, double near, double far) {
  const T* V = viewmat;
  const double z = double((m[0] * V[8] + m[1] * V[9] + m[2] * V[10]) + V[11]);
  return z > near && z < far && double(o) >= kAlphaMin;
}

// rasterize_3dgs.py _screen_bounds for one Gaussian, in float64: alpha >=
// 1/255 needs delta^T C delta <= k^2 = 2 ln(255 o), an ellipse whose extent
// along x is k sqrt(S_xx) (S = C^-1), with a one-pixel margin.  (c0, c1, c2):
// the conic, (mx, my) the centre, o the row's opacity.
SPLAT_HD void gauss_screen_bounds(double c0, double c1, double c2, double mx, double my, double o,
                                  int width, int height, int32_t rect[4], int32_t& radius) {
  const double k2 = 2.0 * std::log(hd_max(o * 255.0, 1e-30));
  const double det = c0 * c2 - c1 * c1;
  bool visible = o >= kAlphaMin && k2 > 1e-12 && det > 0;
  const double safe_det = visible ? det : 1.0;
  const double kk = hd_max(k2, 0.0);
  const double half[2] = {std::sqrt(kk * c2 / safe_det), std::sqrt(kk * c0 / safe_det)};
  // a NaN extent (a conic that is not positive definite) draws nothing
  visible = visible && half[0] == half[0] && half[1] == half[1];
  const double mid[2] = {mx, my};
  const int screen[2] = {width, height};
  const double side = double(hd_max(width, height));
  int64_t first[2] = {0, 0}, last[2] = {0, 0};
  for (int a = 0; a < 2 && visible; ++a) {
    const double f = hd_min(hd_max(std::ceil(mid[a] - half[a] - 0.5 - 1.0), -1.0), side + 1);
    const double l = hd_min(hd_max(std::floor(mid[a] + half[a] - 0.5 + 1.0), -1.0), side + 1);
    first[a] = hd_min<int64_t>(hd_max<int64_t>(int64_t(f), 0), screen[a]);
    last[a] = hd_min<int64_t>(hd_max<int64_t>(int64_t(l) + 1, 0), screen[a]);
    visible = last[a] > first[a];
  }
  rect[0] = visible ? int32_t(first[0]) : 0;
  rect[1] = visible ? int32_t(first[1]) : 0;
  rect[2] = visible ? int32_t(last[0]) : 0;
  rect[3] = visible ? int32_t(last[1]) : 0;
  const double r = visible ? std::ceil(hd_max(half[0], half[1])) : 0.0;
  radius = int32_t(hd_min(r, kRadiusMax));  // conventions.radii_int32
}

}  // namespace splat
