// CPU backend: the same tile algorithm as the CUDA backend, with OpenMP over
// tiles.  The per-pixel maths comes from core.h.
//
// Determinism: the backward pass never adds two threads' results into one
// place.  Each (tile, surfel) pair owns one gradient record, filled by the one
// thread that renders that tile, in a fixed pixel order; records are then
// reduced into surfels serially in tile order.  Gradients are therefore
// bitwise identical across runs and thread counts.
#include "rasterize_cpu.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "../core.h"

namespace splat {

template <typename T>
void bin_tiles_cpu(const SurfelArrays<T>& s, int tiles_x, int tiles_y,
                   std::vector<int64_t>& tile_offsets, std::vector<int32_t>& point_list) {
  const int64_t n = s.num_surfels;
  std::vector<int32_t> order;
  order.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* r = s.tile_rect + 4 * i;
    if (r[2] > r[0] && r[3] > r[1]) order.push_back(static_cast<int32_t>(i));
  }
  // Front to back; equal depths keep index order (the CUDA radix sort is stable too).
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return s.depth[a] < s.depth[b]; });
  const int num_tiles = tiles_x * tiles_y;
  tile_offsets.assign(num_tiles + 1, 0);
  for (int32_t id : order) {
    const int32_t* r = s.tile_rect + 4 * id;
    for (int ty = r[1]; ty < r[3]; ++ty)
      for (int tx = r[0]; tx < r[2]; ++tx) tile_offsets[ty * tiles_x + tx + 1]++;
  }
  std::partial_sum(tile_offsets.begin(), tile_offsets.end(), tile_offsets.begin());
  point_list.resize(tile_offsets[num_tiles]);
  std::vector<int64_t> cursor(tile_offsets.begin(), tile_offsets.end() - 1);
  for (int32_t id : order) {
    const int32_t* r = s.tile_rect + 4 * id;
    for (int ty = r[1]; ty < r[3]; ++ty)
      for (int tx = r[0]; tx < r[2]; ++tx) point_list[cursor[ty * tiles_x + tx]++] = id;
  }
}

template <typename T>
void forward_cpu(const SurfelArrays<T>& s, const TileBins& bins, const ForwardOutputs<T>& out) {
  const int W = s.width, H = s.height;
  const int num_tiles = bins.tiles_x * bins.tiles_y;
#pragma omp parallel for schedule(dynamic, 1)
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int tx = tile % bins.tiles_x, ty = tile / bins.tiles_x;
    const int64_t begin = bins.tile_offsets[tile];
    const int32_t count = static_cast<int32_t>(bins.tile_offsets[tile + 1] - begin);
    const int32_t* list = bins.point_list + begin;
    for (int py = ty * kTileSize; py < std::min(H, (ty + 1) * kTileSize); ++py) {
      for (int px = tx * kTileSize; px < std::min(W, (tx + 1) * kTileSize); ++px) {
        const T x = T(px) + T(0.5), y = T(py) + T(0.5);
        PixelState<T> p;
        init_pixel(p);
        SurfelParams<T> sp;
        Hit<T> h;
        for (int32_t k = 0; k < count; ++k) {
          const int32_t id = list[k];
          load_surfel(s.Tuvw, s.center, s.opacity, id, sp);
          intersect(sp, x, y, s.near, h);
          if (!h.contributes) continue;
          if (!blend(p, h, s.color + 3 * id, s.normal + 3 * id, s.near, s.far, k)) break;
        }
        const int64_t pix = int64_t(py) * W + px;
        for (int c = 0; c < kChannels; ++c) out.color_sum[pix * 3 + c] = p.color[c];
        out.transmittance[pix] = p.transmittance;
        out.depth_sum[pix] = p.depth_sum;
        for (int k = 0; k < 3; ++k) out.normal_sum[pix * 3 + k] = p.normal[k];
        out.distortion[pix] = p.distortion;
        out.median_depth[pix] = p.median_depth;
        out.end[pix] = p.end;
        out.median_index[pix] = p.median_index;
        store_totals(p, out.totals + pix * kTotalsSize);
      }
    }
  }
}

template <typename T>
void backward_cpu(const SurfelArrays<T>& s, const TileBins& bins, const int32_t* end,
                  const int32_t* median_index, const T* transmittance, const T* totals,
                  const UpstreamGrads<T>& up, T* v_surfels /* [N, kGradSize] */) {
  const int W = s.width, H = s.height;
  const int num_tiles = bins.tiles_x * bins.tiles_y;
  const int64_t num_pairs = bins.tile_offsets[num_tiles];
  std::vector<T> pair_grads(static_cast<size_t>(num_pairs) * kGradSize, T(0));

#pragma omp parallel for schedule(dynamic, 1)
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int tx = tile % bins.tiles_x, ty = tile / bins.tiles_x;
    const int64_t begin = bins.tile_offsets[tile];
    const int32_t* list = bins.point_list + begin;
    T* tile_grads = pair_grads.data() + begin * kGradSize;
    for (int py = ty * kTileSize; py < std::min(H, (ty + 1) * kTileSize); ++py) {
      for (int px = tx * kTileSize; px < std::min(W, (tx + 1) * kTileSize); ++px) {
        const int64_t pix = int64_t(py) * W + px;
        const T x = T(px) + T(0.5), y = T(py) + T(0.5);
        PixelGrad<T> g;
        for (int c = 0; c < kChannels; ++c) g.v_color[c] = up.v_color_sum[pix * 3 + c];
        g.v_depth_sum = up.v_depth_sum[pix];
        for (int k = 0; k < 3; ++k) g.v_normal[k] = up.v_normal_sum[pix * 3 + k];
        g.v_distortion = up.v_distortion[pix];
        g.v_median = up.v_median_depth[pix];
        load_totals(totals + pix * kTotalsSize, g);
        BackwardState<T> st{transmittance[pix], up.v_transmittance[pix]};
        const int32_t median_k = median_index[pix];
        SurfelParams<T> sp;
        Hit<T> h;
        for (int32_t k = end[pix] - 1; k >= 0; --k) {
          const int32_t id = list[k];
          load_surfel(s.Tuvw, s.center, s.opacity, id, sp);
          intersect(sp, x, y, s.near, h);
          if (!h.contributes) continue;
          backward_step(st, g, sp, h, s.color + 3 * id, s.normal + 3 * id, x, y, s.near,
                        s.far, k == median_k, tile_grads + int64_t(k) * kGradSize);
        }
      }
    }
  }
  // Serial, fixed-order reduction of the pair records into surfels.
  std::fill(v_surfels, v_surfels + s.num_surfels * kGradSize, T(0));
  for (int64_t pair = 0; pair < num_pairs; ++pair) {
    T* dst = v_surfels + int64_t(bins.point_list[pair]) * kGradSize;
    const T* src = pair_grads.data() + pair * kGradSize;
    for (int k = 0; k < kGradSize; ++k) dst[k] += src[k];
  }
}

#define SPLAT_INSTANTIATE(T)                                                                 \
  template void bin_tiles_cpu<T>(const SurfelArrays<T>&, int, int, std::vector<int64_t>&,   \
                                 std::vector<int32_t>&);                                    \
  template void forward_cpu<T>(const SurfelArrays<T>&, const TileBins&,                     \
                               const ForwardOutputs<T>&);                                   \
  template void backward_cpu<T>(const SurfelArrays<T>&, const TileBins&, const int32_t*,    \
                                const int32_t*, const T*, const T*, const UpstreamGrads<T>&, \
                                T*);
SPLAT_INSTANTIATE(float)
SPLAT_INSTANTIATE(double)
#undef SPLAT_INSTANTIATE

}  // namespace splat
