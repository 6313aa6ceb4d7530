// The fused EWA projection of 3D Gaussians (see project_gaussians_cpu.h):
// ../project_gaussians.h per Gaussian (the maths, in the dtype, and the screen
// bounds of rasterize_3dgs.py _screen_bounds in float64), run over blocks here.
#include "project_gaussians_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "../core.h"
#include "../project_gaussians.h"
#include "dispatch.h"

namespace splat {

namespace {

constexpr int kCameraGradSize = kGaussCameraGradSize;

template <typename T>
GaussCamera<T> camera_of(const GaussProjectArgs<T>& in) {
  return gauss_camera(in.viewmat, in.K, in.K_inv, in.width, in.height, in.antialiased);
}

}  // namespace

template <typename T>
int64_t cull_gaussians_cpu(const GaussProjectArgs<T>& in, double near, double far,
                           const std::function<int64_t*(int64_t)>& alloc_ids) {
  // Two passes over fixed blocks: count the kept per block, then write their
  // indices at the blocks' running offsets (index order, any thread count).
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (in.n + kBlock - 1) / kBlock;
  std::vector<int64_t> offsets(size_t(blocks) + 1, 0);
  auto kept = [&](int64_t i) {
    return gauss_kept(in.means + 3 * i, in.opacities[i], in.viewmat, near, far);
  };
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t count = 0;
    const int64_t end = std::min(in.n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < end; ++i) count += kept(i) ? 1 : 0;
    offsets[size_t(b) + 1] = count;
  }
  for (int64_t b = 0; b < blocks; ++b) offsets[size_t(b) + 1] += offsets[size_t(b)];
  const int64_t m = offsets[size_t(blocks)];
  int64_t* ids = alloc_ids(m);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t at = offsets[size_t(b)];
    const int64_t end = std::min(in.n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < end; ++i)
      if (kept(i)) ids[at++] = i;
  }
  return m;
}

namespace {

// The per-Gaussian helpers are forced inline into the block loops below, and
// GCC vectorises those across Gaussians.  `GCC ivdep`, not `omp simd`: omp
// simd privatises the per-Gaussian structs into per-lane arrays before they
// are inlined, which GCC 12 then cannot vectorise ("no vectype").
#define SPLAT_INLINE __attribute__((always_inline)) inline

// Gaussians per block: the vector loops run over a block, reading and writing
// block arrays (unit-stride columns) that scalar loops gather and scatter by
// id.  Blocks are also the camera gradient's partial sums: fixed, so the sums
// do not depend on the thread count.
constexpr int kBlock = kGaussCameraBlock;

// The block's inputs gathered by id into columns (a gather inside the vector
// loop would keep it scalar).
template <typename T>
struct BlockInputs {
  T m[3][kBlock], q[4][kBlock], s[3][kBlock], o[kBlock];
};

template <typename T>
SPLAT_INLINE void gather_inputs(const GaussProjectArgs<T>& in, int64_t b0, int len,
                                BlockInputs<T>& b) {
  for (int l = 0; l < len; ++l) {
    const int64_t i = in.ids[b0 + l];
    for (int k = 0; k < 3; ++k) b.m[k][l] = in.means[3 * i + k];
    for (int k = 0; k < 4; ++k) b.q[k][l] = in.quats[4 * i + k];
    for (int k = 0; k < 3; ++k) b.s[k][l] = in.scales[3 * i + k];
    b.o[l] = in.opacities[i];
  }
}

// Forward of the kept Gaussians [b0, b0 + len): the projection vectorised
// across Gaussians, then (scalar: std::log) the rows' stores and the bounds.
// Returns the number of rows with a non-finite parameter.
template <typename T>
SPLAT_INLINE int64_t forward_block(const GaussProjectArgs<T>& in_ref, const GaussCamera<T>& cam_ref,
                                   const GaussProjectOutputs<T>& out_ref, int64_t b0, int len) {
  // Local copies: the stores cannot alias them, so their fields load once
  // rather than in every iteration (which would keep the loop scalar).
  const GaussProjectArgs<T> in = in_ref;
  const GaussCamera<T> cam = cam_ref;
  const GaussProjectOutputs<T> out = out_ref;
  BlockInputs<T> b;
  gather_inputs(in, b0, len, b);
  T rows[kGaussParams][kBlock], centre[2][kBlock], depth[kBlock];
  int32_t finite[kBlock];  // 32-bit flags: a 1-byte type would set the loop's vector width to 32
#pragma GCC ivdep
  for (int l = 0; l < len; ++l) {
    const T m[3] = {b.m[0][l], b.m[1][l], b.m[2][l]};
    const T q[4] = {b.q[0][l], b.q[1][l], b.q[2][l], b.q[3][l]};
    const T s[3] = {b.s[0][l], b.s[1][l], b.s[2][l]};
    GaussProjected<T> p;
    T row[kGaussParams];
    gauss_project_forward(cam, m, q, s, b.o[l], p, row);
    int32_t ok = 1;
    SPLAT_UNROLL
    for (int k = 0; k < kGaussParams; ++k) {
      rows[k][l] = row[k];
      ok &= finite_flag(row[k]);
    }
    finite[l] = ok;
    centre[0][l] = p.centre[0];
    centre[1][l] = p.centre[1];
    depth[l] = p.mu[2];
  }
  int64_t bad = 0;
  for (int l = 0; l < len; ++l) {
    const int64_t j = b0 + l;
    T* row = out.params + kGaussParams * j;
    for (int k = 0; k < kGaussParams; ++k) row[k] = rows[k][l];
    bad += finite[l] ? 0 : 1;
    out.centre[2 * j] = centre[0][l];
    out.centre[2 * j + 1] = centre[1][l];
    out.depth[j] = depth[l];
    gauss_screen_bounds(double(row[kGaussConic]), double(row[kGaussConic + 1]),
                        double(row[kGaussConic + 2]), double(row[kGaussCenter]),
                        double(row[kGaussCenter + 1]), double(row[kGaussOpacity]), in.width,
                        in.height, out.pixel_rect + 4 * j, out.radii[j]);
  }
  return bad;
}

// Backward of the kept Gaussians [b0, b0 + len): the gradients vectorised
// across Gaussians into block arrays, then (scalar) their stores by id and,
// when sum is given, the block's camera gradient summed in float64 in order.
template <typename T>
SPLAT_INLINE void backward_block(const GaussProjectArgs<T>& in_ref, const GaussCamera<T>& cam_ref,
                                 const GaussProjectGrads<T>& g_ref, int64_t b0, int len,
                                 double* sum) {
  const GaussProjectArgs<T> in = in_ref;
  const GaussCamera<T> cam = cam_ref;
  const GaussProjectGrads<T> g = g_ref;
  BlockInputs<T> b;
  gather_inputs(in, b0, len, b);
  T ub[kGaussParams][kBlock], cb[2][kBlock];  // the upstream rows, as columns
  for (int l = 0; l < len; ++l) {
    const int64_t j = b0 + l;
    for (int k = 0; k < kGaussParams; ++k) ub[k][l] = g.v_params[g.v_params_row_stride * j + k];
    cb[0][l] = g.v_centre ? g.v_centre[g.v_centre_row_stride * j] : T(0);
    cb[1][l] = g.v_centre ? g.v_centre[g.v_centre_row_stride * j + 1] : T(0);
  }
  T vm[3][kBlock], vq[4][kBlock], vs[3][kBlock], vo[kBlock], vcam[kCameraGradSize][kBlock];
#pragma GCC ivdep
  for (int l = 0; l < len; ++l) {
    const T m[3] = {b.m[0][l], b.m[1][l], b.m[2][l]};
    const T q[4] = {b.q[0][l], b.q[1][l], b.q[2][l], b.q[3][l]};
    const T s[3] = {b.s[0][l], b.s[1][l], b.s[2][l]};
    GaussProjected<T> p;
    T row[kGaussParams];
    gauss_project_forward(cam, m, q, s, b.o[l], p, row);
    T up[kGaussParams];
    SPLAT_UNROLL
    for (int k = 0; k < kGaussParams; ++k) up[k] = ub[k][l];
    const T vcen[2] = {cb[0][l], cb[1][l]};
    T v_m[3], v_q[4], v_s[3], v_o;
    GaussCameraGrad<T> vc;
    gauss_project_backward(cam, m, s, b.o[l], p, up, vcen, v_m, v_q, v_s, v_o, vc);
    SPLAT_UNROLL
    for (int k = 0; k < 3; ++k) vm[k][l] = v_m[k];
    SPLAT_UNROLL
    for (int k = 0; k < 4; ++k) vq[k][l] = v_q[k];
    SPLAT_UNROLL
    for (int k = 0; k < 3; ++k) vs[k][l] = v_s[k];
    vo[l] = v_o;
    T flat[kCameraGradSize];
    gauss_camera_grad_flat(vc, flat);
    SPLAT_UNROLL
    for (int k = 0; k < kCameraGradSize; ++k) vcam[k][l] = flat[k];
  }
  for (int l = 0; l < len; ++l) {
    const int64_t i = in.ids[b0 + l];
    for (int k = 0; k < 3; ++k) g.v_means[3 * i + k] = vm[k][l];
    for (int k = 0; k < 4; ++k) g.v_quats[4 * i + k] = vq[k][l];
    for (int k = 0; k < 3; ++k) g.v_scales[3 * i + k] = vs[k][l];
    g.v_opacities[i] = vo[l];
    // params' centre = centre + (means2d - means2d.detach()): identity
    g.v_means2d[2 * i] = ub[kGaussCenter][l];
    g.v_means2d[2 * i + 1] = ub[kGaussCenter + 1][l];
  }
  if (sum)
    for (int l = 0; l < len; ++l)
      for (int k = 0; k < kCameraGradSize; ++k) sum[k] += double(vcam[k][l]);
}

}  // namespace

// Vector-ISA clones of the float32 blocks, chosen at load time as the
// surfels' projection's (project_cpu.cpp, which says why there is no AVX-512
// clone); float64 runs the baseline build.  Not in the anonymous namespace:
// target_clones needs external linkage.
SPLAT_CLONES_AVX2 int64_t gauss_forward_block_f32(const GaussProjectArgs<float>& in,
                                                  const GaussCamera<float>& cam,
                                                  const GaussProjectOutputs<float>& out, int64_t b0,
                                                  int len) {
  return forward_block(in, cam, out, b0, len);
}
SPLAT_CLONES_AVX2 void gauss_backward_block_f32(const GaussProjectArgs<float>& in,
                                                const GaussCamera<float>& cam,
                                                const GaussProjectGrads<float>& g, int64_t b0,
                                                int len, double* sum) {
  backward_block(in, cam, g, b0, len, sum);
}

namespace {

int64_t run_forward_block(const GaussProjectArgs<float>& in, const GaussCamera<float>& cam,
                          const GaussProjectOutputs<float>& out, int64_t b0, int len) {
  return gauss_forward_block_f32(in, cam, out, b0, len);
}
int64_t run_forward_block(const GaussProjectArgs<double>& in, const GaussCamera<double>& cam,
                          const GaussProjectOutputs<double>& out, int64_t b0, int len) {
  return forward_block(in, cam, out, b0, len);
}
void run_backward_block(const GaussProjectArgs<float>& in, const GaussCamera<float>& cam,
                        const GaussProjectGrads<float>& g, int64_t b0, int len, double* sum) {
  gauss_backward_block_f32(in, cam, g, b0, len, sum);
}
void run_backward_block(const GaussProjectArgs<double>& in, const GaussCamera<double>& cam,
                        const GaussProjectGrads<double>& g, int64_t b0, int len, double* sum) {
  backward_block(in, cam, g, b0, len, sum);
}

}  // namespace

template <typename T>
int64_t project_gaussians_forward_cpu(const GaussProjectArgs<T>& in,
                                      const GaussProjectOutputs<T>& out) {
  const GaussCamera<T> cam = camera_of(in);
  int64_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
  for (int64_t b0 = 0; b0 < in.m; b0 += kBlock)
    bad += run_forward_block(in, cam, out, b0, int(std::min<int64_t>(kBlock, in.m - b0)));
  return bad;
}

template <typename T>
void project_gaussians_backward_cpu(const GaussProjectArgs<T>& in, const GaussProjectGrads<T>& g) {
  const GaussCamera<T> cam = camera_of(in);
  // Gaussians not in ids (culled) get exactly zero.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < in.n; ++i) {
    for (int k = 0; k < 3; ++k) g.v_means[3 * i + k] = T(0);
    for (int k = 0; k < 4; ++k) g.v_quats[4 * i + k] = T(0);
    for (int k = 0; k < 3; ++k) g.v_scales[3 * i + k] = T(0);
    g.v_opacities[i] = T(0);
    g.v_means2d[2 * i] = T(0);
    g.v_means2d[2 * i + 1] = T(0);
  }
  const bool with_camera = g.v_viewmat != nullptr;
  const int64_t blocks = (in.m + kBlock - 1) / kBlock;
  std::vector<double> partial(with_camera ? size_t(blocks) * kCameraGradSize : 0, 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b)
    run_backward_block(in, cam, g, b * kBlock, int(std::min<int64_t>(kBlock, in.m - b * kBlock)),
                       with_camera ? partial.data() + size_t(b) * kCameraGradSize : nullptr);
  if (!with_camera) return;
  double v[kCameraGradSize] = {};
  for (int64_t b = 0; b < blocks; ++b)
    for (int k = 0; k < kCameraGradSize; ++k) v[k] += partial[size_t(b) * kCameraGradSize + k];
  gauss_camera_grad_finish(v, cam, g.v_viewmat, g.v_K, g.v_K_inv);
}

template int64_t cull_gaussians_cpu<float>(const GaussProjectArgs<float>&, double, double,
                                           const std::function<int64_t*(int64_t)>&);
template int64_t cull_gaussians_cpu<double>(const GaussProjectArgs<double>&, double, double,
                                            const std::function<int64_t*(int64_t)>&);
template int64_t project_gaussians_forward_cpu<float>(const GaussProjectArgs<float>&,
                                                      const GaussProjectOutputs<float>&);
template int64_t project_gaussians_forward_cpu<double>(const GaussProjectArgs<double>&,
                                                       const GaussProjectOutputs<double>&);
template void project_gaussians_backward_cpu<float>(const GaussProjectArgs<float>&,
                                                    const GaussProjectGrads<float>&);
template void project_gaussians_backward_cpu<double>(const GaussProjectArgs<double>&,
                                                     const GaussProjectGrads<double>&);

}  // namespace splat
