// Fused SSIM loss on the CPU (no torch headers; see bindings.cpp and
// splat/losses.py ssim(), which defines the window and constants and holds the
// plain-PyTorch form this op must match).
//
// For images x (prediction) and y (target), [H, W, C] channels-last, and a
// normalised 1D window g of odd length (zero padding at the border):
//     mu_x = G * x,  mu_y = G * y,  e_xx = G * x^2,  e_yy = G * y^2,  e_xy = G * xy
// with G * the separable 2D filter g g^T, and per pixel and channel
//     S = (2 mu_x mu_y + C1)(2 s_xy + C2) / ((mu_x^2 + mu_y^2 + C1)(s_xx + s_yy + C2)),
//     s_xx = e_xx - mu_x^2,  s_yy = e_yy - mu_y^2,  s_xy = e_xy - mu_x mu_y.
// The op returns mean(S).  Writing S = A1 A2 / (B1 B2), its gradient w.r.t.
// the five filtered maps is
//     dS/dmu_x = 2 mu_y (dS/dA1 - dS/dA2) + 2 mu_x (dS/dB1 - dS/dB2),
//     dS/de_xx = dS/dB2,  dS/de_xy = 2 dS/dA2,
//     dS/dA1 = A2 / (B1 B2),  dS/dA2 = A1 / (B1 B2),  dS/dB1 = -S / B1,  dS/dB2 = -S / B2,
// and because G is symmetric (its transpose is itself, with the same zero
// padding), with the three maps m_mu, m_xx, m_xy = those derivatives:
//     dmean(S)/dx = (G * m_mu + 2 x (G * m_xx) + y (G * m_xy)) / (H W C).
// The forward pass stores m_mu, m_xx, m_xy for the backward pass.
//
// Both passes stream over output rows: a vertical pass of the window into a
// zero-padded row buffer, then a horizontal pass, so no full-size filtered
// image is ever stored.  Every output element is a fixed-order sum, and the
// mean is summed per row and then over rows in order, so results are bitwise
// identical for any thread count.
#pragma once

#include <cstdint>

namespace splat {

template <typename T>
struct SsimArgs {
  const T* x;       // [H, W, C]
  const T* y;       // [H, W, C]
  const T* window;  // [window_size], normalised, symmetric
  int window_size;  // odd
  int64_t height, width, channels;
  double c1, c2;
};

// Returns mean(S); when grad_maps is not null also writes the three maps
// m_mu, m_xx, m_xy there ([3, H, W, C]).
double ssim_forward_cpu(const SsimArgs<float>& a, float* grad_maps);
double ssim_forward_cpu(const SsimArgs<double>& a, double* grad_maps);

// dx [H, W, C] = scale * (G * m_mu + 2 x (G * m_xx) + y (G * m_xy)); scale
// is the upstream gradient of the mean divided by H W C.
void ssim_backward_cpu(const SsimArgs<float>& a, const float* grad_maps, double scale, float* dx);
void ssim_backward_cpu(const SsimArgs<double>& a, const double* grad_maps, double scale,
                       double* dx);

}  // namespace splat
