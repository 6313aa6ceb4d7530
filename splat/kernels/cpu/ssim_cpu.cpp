// Fused SSIM on the CPU: the maths is in ssim_cpu.h.
#include "ssim_cpu.h"
#include "dispatch.h"

#include <algorithm>
#include <vector>

namespace splat {

namespace {

// Filters kMaps row streams with the separable window, one output row at a
// time.  A row is the W*C values of one image row, channels interleaved, so a
// horizontal tap at offset k is an offset of k*C in the row.
//   vertical(src_row, w, v): adds w times input row src_row (always inside
//                            the image: rows outside it are zero) to the kMaps
//                            rows v[m] (W*C values each);
//   row_out(i, f, n):        receives output row i, f[m * n + j] for map m.
template <typename T, int kMaps, typename Vertical, typename RowOut>
__attribute__((always_inline)) inline void filter_rows(const SsimArgs<T>& a, Vertical vertical,
                                                       RowOut row_out) {
  const int r = a.window_size / 2;
  const int64_t H = a.height, row = a.width * a.channels, pad = int64_t(r) * a.channels;
  const int64_t stride = row + 2 * pad;
  const T* g = a.window;
#pragma omp parallel
  {
    // the vertical pass's rows, zero-padded by r pixels on both sides
    std::vector<T> vert(static_cast<size_t>(kMaps) * stride, T(0));
    std::vector<T> out(static_cast<size_t>(kMaps) * row);
    T* v[kMaps];
    for (int m = 0; m < kMaps; ++m) v[m] = vert.data() + m * stride + pad;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < H; ++i) {
      for (int m = 0; m < kMaps; ++m) std::fill(v[m], v[m] + row, T(0));
      for (int k = -r; k <= r; ++k)
        if (i + k >= 0 && i + k < H) vertical(i + k, g[k + r], v);
      for (int m = 0; m < kMaps; ++m) {
        T* __restrict__ o = out.data() + m * row;
        const T* __restrict__ src = v[m] - pad;
        // o[j] = sum_k g[k] v[j + (k - r) C], summed in k order
        std::fill(o, o + row, T(0));
        for (int k = 0; k <= 2 * r; ++k) {
          const T w = g[k];
          const T* __restrict__ tap = src + int64_t(k) * a.channels;
          for (int64_t j = 0; j < row; ++j) o[j] += w * tap[j];
        }
      }
      row_out(i, out.data(), row);
    }
  }
}

}  // namespace

template <typename T>
__attribute__((always_inline)) inline double ssim_forward(const SsimArgs<T>& a, T* grad_maps) {
  const int64_t H = a.height, row = a.width * a.channels, plane = H * row;
  // mu_x, mu_y, e_xx, e_yy, e_xy: the products are formed as each input row is read.
  const auto vertical = [&](int64_t src, T w, T* const* v) {
    const T* __restrict__ x = a.x + src * row;
    const T* __restrict__ y = a.y + src * row;
    T* __restrict__ v0 = v[0], * __restrict__ v1 = v[1], * __restrict__ v2 = v[2], * __restrict__ v3 = v[3], * __restrict__ v4 = v[4];
    for (int64_t j = 0; j < row; ++j) {
      v0[j] += w * x[j];
      v1[j] += w * y[j];
      v2[j] += w * (x[j] * x[j]);
      v3[j] += w * (y[j] * y[j]);
      v4[j] += w * (x[j] * y[j]);
    }
  };
  std::vector<double> row_sums(H, 0.0);
  const T c1 = T(a.c1), c2 = T(a.c2);
  const auto row_out = [&](int64_t i, const T* f, int64_t n) {
    const T *mu_x = f, *mu_y = f + n, *e_xx = f + 2 * n, *e_yy = f + 3 * n, *e_xy = f + 4 * n;
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      const T mx = mu_x[j], my = mu_y[j];
      const T A1 = T(2) * mx * my + c1;
      const T A2 = T(2) * (e_xy[j] - mx * my) + c2;
      const T B1 = mx * mx + my * my + c1;
      const T B2 = (e_xx[j] - mx * mx) + (e_yy[j] - my * my) + c2;
      const T D = B1 * B2;
      const T S = A1 * A2 / D;
      sum += double(S);
      if (grad_maps) {
        const T dA1 = A2 / D, dA2 = A1 / D, dB1 = -S / B1, dB2 = -S / B2;
        const int64_t at = i * row + j;
        grad_maps[at] = T(2) * my * (dA1 - dA2) + T(2) * mx * (dB1 - dB2);
        grad_maps[plane + at] = dB2;
        grad_maps[2 * plane + at] = T(2) * dA2;
      }
    }
    row_sums[i] = sum;
  };
  filter_rows<T, 5>(a, vertical, row_out);
  double total = 0.0;
  for (double s : row_sums) total += s;
  return total / double(plane);
}

template <typename T>
__attribute__((always_inline)) inline void ssim_backward(const SsimArgs<T>& a, const T* grad_maps,
                                                         double scale, T* dx) {
  const int64_t H = a.height, row = a.width * a.channels, plane = H * row;
  const auto vertical = [&](int64_t src, T w, T* const* v) {
    for (int m = 0; m < 3; ++m) {
      const T* __restrict__ in = grad_maps + m * plane + src * row;
      T* __restrict__ acc = v[m];
      for (int64_t j = 0; j < row; ++j) acc[j] += w * in[j];
    }
  };
  const T s = T(scale);
  const auto row_out = [&](int64_t i, const T* f, int64_t n) {
    const T *f_mu = f, *f_xx = f + n, *f_xy = f + 2 * n;
    const T* x = a.x + i * row;
    const T* y = a.y + i * row;
    T* d = dx + i * row;
    for (int64_t j = 0; j < n; ++j) d[j] = s * (f_mu[j] + T(2) * x[j] * f_xx[j] + y[j] * f_xy[j]);
  };
  filter_rows<T, 3>(a, vertical, row_out);
}

// Compiled for AVX2 and for baseline x86-64, chosen at run time: the filter
// loops are plain loops the compiler vectorises to the target's width.
#define SPLAT_SSIM_ENTRY_POINTS(T)                                                                 \
  SPLAT_CLONES_AVX2 double ssim_forward_cpu(const SsimArgs<T>& a, T* grad_maps) {                  \
    return ssim_forward(a, grad_maps);                                                             \
  }                                                                                                \
  SPLAT_CLONES_AVX2 void ssim_backward_cpu(const SsimArgs<T>& a, const T* grad_maps, double scale, \
                                           T* dx) {                                                \
    ssim_backward(a, grad_maps, scale, dx);                                                        \
  }
SPLAT_SSIM_ENTRY_POINTS(float)
SPLAT_SSIM_ENTRY_POINTS(double)
#undef SPLAT_SSIM_ENTRY_POINTS

}  // namespace splat
