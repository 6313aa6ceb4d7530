// CPU kernels for 3D Gaussians: one pixel at a time over each Gaussian's
// pixel rectangle (the surfels' kModeReference loop; no SIMD path yet), in
// float32 or float64.  Same tiles, list order, stopping rule and saved state
// as the surfel kernels, so the forward outputs and the backward walk mean
// the same thing for both primitives.
#include "gaussians_cpu.h"

#include "../core.h"
#include "tiles.h"

namespace splat {
namespace {

using tiles::kPixels;
using tiles::TileWindow;

template <typename T>
void forward_tile(const GaussianArrays<T>& g, const TileBins& bins, int tile,
                  const ForwardOutputs<T>& out) {
  const TileWindow win(tile, bins.tiles_x, g.width, g.height);
  const int64_t begin = bins.tile_offsets[tile];
  const int32_t count = static_cast<int32_t>(bins.tile_offsets[tile + 1] - begin);
  const int32_t* list = bins.point_list + begin;
  PixelState<T> pixels[kPixels];
  bool done[kPixels] = {};
  int active = (win.x1 - win.x0) * (win.y1 - win.y0);
  for (auto& p : pixels) init_pixel(p);
  GaussianParams<T> gp;
  GaussianHit<T> h;
  for (int32_t k = 0; k < count && active > 0; ++k) {
    const int32_t id = list[k];
    const PixelRect r = win.clip(load_pixel_rect(g.pixel_rect, id));
    if (r.x1 <= r.x0 || r.y1 <= r.y0) continue;
    load_gaussian(g.params, id, gp);
    for (int py = r.y0; py < r.y1; ++py) {
      for (int px = r.x0; px < r.x1; ++px) {
        const int i = win.local(px, py);
        if (done[i]) continue;
        intersect_gaussian(gp, T(px) + T(0.5), T(py) + T(0.5), g.near, h);
        if (!h.contributes) continue;
        if (blend_lanes<T>(pixels[i], h, true, g.color + 3 * id, h.normal, g.near, g.far, k)) {
          done[i] = true;
          --active;
        }
      }
    }
  }
  for (int py = win.y0; py < win.y1; ++py)
    for (int px = win.x0; px < win.x1; ++px)
      store_pixel(pixels[win.local(px, py)], int64_t(py) * g.width + px, out);
}

template <typename T>
void backward_tile(const GaussianArrays<T>& g, const TileBins& bins, int tile, const int32_t* end,
                   const int32_t* median_index, const T* transmittance, const T* totals,
                   const UpstreamGrads<T>& up, T* records) {
  const TileWindow win(tile, bins.tiles_x, g.width, g.height);
  const int32_t* list = bins.point_list + bins.tile_offsets[tile];
  PixelGrad<T> grads[kPixels];
  BackwardState<T> states[kPixels];
  int32_t ends[kPixels], medians[kPixels];
  const int32_t max_end = tiles::load_tile_grads(g.width, win, end, median_index, transmittance,
                                                 totals, up, grads, states, ends, medians);
  GaussianParams<T> gp;
  GaussianHit<T> h;
  for (int32_t k = max_end - 1; k >= 0; --k) {
    const int32_t id = list[k];
    const PixelRect r = win.clip(load_pixel_rect(g.pixel_rect, id));
    if (r.x1 <= r.x0 || r.y1 <= r.y0) continue;
    load_gaussian(g.params, id, gp);
    T* record = records + int64_t(k) * kGaussGradSize;
    for (int py = r.y0; py < r.y1; ++py) {
      for (int px = r.x0; px < r.x1; ++px) {
        const int i = win.local(px, py);
        if (k >= ends[i]) continue;
        intersect_gaussian(gp, T(px) + T(0.5), T(py) + T(0.5), g.near, h);
        if (!h.contributes) continue;
        backward_gaussian_step(states[i], grads[i], gp, h, g.color + 3 * id, g.near, g.far,
                               k == medians[i], record);
      }
    }
  }
}

}  // namespace

template <typename T>
void forward_gaussians_cpu(const GaussianArrays<T>& g, const TileBins& bins,
                           const ForwardOutputs<T>& out) {
  const std::vector<int> order = tiles::tiles_by_cost(bins);
  const int num_tiles = static_cast<int>(order.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int t = 0; t < num_tiles; ++t) forward_tile(g, bins, order[t], out);
}

template <typename T>
void backward_gaussians_cpu(const GaussianArrays<T>& g, const TileBins& bins, const int32_t* end,
                            const int32_t* median_index, const T* transmittance, const T* totals,
                            const UpstreamGrads<T>& up, T* v_gaussians) {
  tiles::backward_over_tiles<kGaussGradSize>(
      bins, g.width, g.height, end, g.num_gaussians,
      [&](int tile, T* records) {
        backward_tile(g, bins, tile, end, median_index, transmittance, totals, up, records);
      },
      v_gaussians);
}

#define SPLAT_INSTANTIATE(T)                                                                  \
  template void forward_gaussians_cpu<T>(const GaussianArrays<T>&, const TileBins&,           \
                                         const ForwardOutputs<T>&);                           \
  template void backward_gaussians_cpu<T>(const GaussianArrays<T>&, const TileBins&,          \
                                          const int32_t*, const int32_t*, const T*, const T*, \
                                          const UpstreamGrads<T>&, T*);
SPLAT_INSTANTIATE(float)
SPLAT_INSTANTIATE(double)
#undef SPLAT_INSTANTIATE

}  // namespace splat
