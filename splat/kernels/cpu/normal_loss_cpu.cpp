// Fused depth-normal consistency loss on the CPU: the maths is in
// normal_loss_cpu.h.
#include "normal_loss_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "../core.h"  // cross3

namespace splat {

namespace {

constexpr double kNormEps = 1e-12;  // losses.depth_to_normal's clamp of |c|

// The camera ray through pixel (r, c), scaled to z = 1: pixel centres at
// (c + 0.5, r + 0.5), splat/conventions.py.
template <typename T>
void pixel_ray(const NormalLossArgs<T>& a, int64_t r, int64_t c, T& x, T& y) {
  x = (T(c) + T(0.5) - T(a.cx)) / T(a.fx);
  y = (T(r) + T(0.5) - T(a.cy)) / T(a.fy);
}

// The depth-derived normal at one interior pixel and what its gradient needs.
template <typename T>
struct PixelNormal {
  T di[3], dj[3];  // P(i+1, j) - P(i-1, j), P(i, j+1) - P(i, j-1)
  T len;           // |di x dj|
  T unit[3];       // (di x dj) / max(len, eps)
  T sign;          // +-1: the normal faces the camera
  bool valid;      // depth > 0
  T world[3];      // R^T (sign unit), or 0 where invalid

  PixelNormal(const NormalLossArgs<T>& a, int64_t i, int64_t j) {
    const auto point = [&](int64_t r, int64_t c, T* p) {
      const T z = a.depth[r * a.width + c];
      T x, y;
      pixel_ray(a, r, c, x, y);
      p[0] = x * z;
      p[1] = y * z;
      p[2] = z;
    };
    T up[3], down[3], left[3], right[3], here[3];
    point(i - 1, j, up);
    point(i + 1, j, down);
    point(i, j - 1, left);
    point(i, j + 1, right);
    point(i, j, here);
    for (int k = 0; k < 3; ++k) di[k] = down[k] - up[k], dj[k] = right[k] - left[k];
    T c[3];
    cross3(di, dj, c);
    len = std::sqrt(c[0] * c[0] + c[1] * c[1] + c[2] * c[2]);
    const T denom = std::max(len, T(kNormEps));
    for (int k = 0; k < 3; ++k) unit[k] = c[k] / denom;
    sign = (unit[0] * here[0] + unit[1] * here[1] + unit[2] * here[2]) > T(0) ? T(-1) : T(1);
    valid = here[2] > T(0);
    for (int k = 0; k < 3; ++k) {
      T s = T(0);
      for (int m = 0; m < 3; ++m) s += (valid ? sign * unit[m] : T(0)) * T(a.R[3 * m + k]);
      world[k] = s;
    }
  }
};

template <typename T>
bool interior(const NormalLossArgs<T>& a, int64_t i, int64_t j) {
  return i >= 1 && j >= 1 && i + 1 < a.height && j + 1 < a.width;
}

}  // namespace

template <typename T>
double normal_loss_forward_cpu(const NormalLossArgs<T>& a) {
  const int64_t H = a.height, W = a.width;
  std::vector<double> row_sums(H, 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < H; ++i) {
    double sum = 0.0;
    for (int64_t j = 0; j < W; ++j) {
      const T* N = a.normal + 3 * (i * W + j);
      T dot = T(0);
      if (interior(a, i, j)) {
        const PixelNormal<T> n(a, i, j);
        dot = N[0] * n.world[0] + N[1] * n.world[1] + N[2] * n.world[2];
      }
      sum += double(a.alpha[i * W + j] * (T(1) - dot));
    }
    row_sums[i] = sum;
  }
  double total = 0.0;
  for (double s : row_sums) total += s;
  return total / double(H * W);
}

template <typename T>
void normal_loss_backward_cpu(const NormalLossArgs<T>& a, double scale, T* v_depth, T* v_normal) {
  const int64_t H = a.height, W = a.width;
  const T per_pixel = T(scale / double(H * W));
  // dL/ddi and dL/ddj of every pixel (zero on the border and where invalid).
  std::vector<T> g(static_cast<size_t>(H * W) * 6, T(0));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < H; ++i) {
    for (int64_t j = 0; j < W; ++j) {
      const int64_t pix = i * W + j;
      const T w = -per_pixel * a.alpha[pix];
      T* vn = v_normal + 3 * pix;
      if (!interior(a, i, j)) {
        for (int k = 0; k < 3; ++k) vn[k] = T(0);
        continue;
      }
      const PixelNormal<T> n(a, i, j);
      for (int k = 0; k < 3; ++k) vn[k] = w * n.world[k];
      if (!n.valid) continue;
      const T* N = a.normal + 3 * pix;
      T g_unit[3];  // dL/dunit = sign R (w N)
      for (int m = 0; m < 3; ++m) {
        T s = T(0);
        for (int k = 0; k < 3; ++k) s += T(a.R[3 * m + k]) * (w * N[k]);
        g_unit[m] = n.sign * s;
      }
      T g_c[3];
      if (n.len > T(kNormEps)) {
        const T along = n.unit[0] * g_unit[0] + n.unit[1] * g_unit[1] + n.unit[2] * g_unit[2];
        for (int k = 0; k < 3; ++k) g_c[k] = (g_unit[k] - n.unit[k] * along) / n.len;
      } else {
        for (int k = 0; k < 3; ++k) g_c[k] = g_unit[k] / T(kNormEps);
      }
      T* gp = g.data() + 6 * pix;
      cross3(n.dj, g_c, gp);      // dL/ddi
      cross3(g_c, n.di, gp + 3);  // dL/ddj
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < H; ++i) {
    for (int64_t j = 0; j < W; ++j) {
      // P(i, j) is the + end of di(i-1, j) and dj(i, j-1), the - end of di(i+1, j) and dj(i, j+1).
      T gP[3] = {T(0), T(0), T(0)};
      const auto add = [&](int64_t r, int64_t c, int offset, T sign) {
        if (r < 0 || r >= H || c < 0 || c >= W) return;
        const T* src = g.data() + 6 * (r * W + c) + offset;
        for (int k = 0; k < 3; ++k) gP[k] += sign * src[k];
      };
      add(i - 1, j, 0, T(1));
      add(i + 1, j, 0, T(-1));
      add(i, j - 1, 3, T(1));
      add(i, j + 1, 3, T(-1));
      T x, y;
      pixel_ray(a, i, j, x, y);
      v_depth[i * W + j] = gP[0] * x + gP[1] * y + gP[2];
    }
  }
}

template double normal_loss_forward_cpu<float>(const NormalLossArgs<float>&);
template double normal_loss_forward_cpu<double>(const NormalLossArgs<double>&);
template void normal_loss_backward_cpu<float>(const NormalLossArgs<float>&, double, float*, float*);
template void normal_loss_backward_cpu<double>(const NormalLossArgs<double>&, double, double*,
                                               double*);

}  // namespace splat
