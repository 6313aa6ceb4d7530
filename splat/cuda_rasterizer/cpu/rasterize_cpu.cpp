// CPU backend: the same tiles, order and per-pixel maths as the CUDA backend,
// with OpenMP over tiles.  The per-pixel maths comes from core.h.
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
  std::vector<PixelRect> tiles(n);
  order.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    PixelRect t = tiles_of(load_pixel_rect(s.pixel_rect, i));
    t.x0 = std::max(t.x0, 0);
    t.y0 = std::max(t.y0, 0);
    t.x1 = std::min(t.x1, tiles_x);
    t.y1 = std::min(t.y1, tiles_y);
    tiles[i] = t;
    if (t.x1 > t.x0 && t.y1 > t.y0) order.push_back(static_cast<int32_t>(i));
  }
  // Front to back; equal depths keep index order (the CUDA sort is stable too).
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return s.depth[a] < s.depth[b]; });
  const int num_tiles = tiles_x * tiles_y;
  tile_offsets.assign(num_tiles + 1, 0);
  for (int32_t id : order)
    for (int ty = tiles[id].y0; ty < tiles[id].y1; ++ty)
      for (int tx = tiles[id].x0; tx < tiles[id].x1; ++tx) tile_offsets[ty * tiles_x + tx + 1]++;
  std::partial_sum(tile_offsets.begin(), tile_offsets.end(), tile_offsets.begin());
  point_list.resize(tile_offsets[num_tiles]);
  std::vector<int64_t> cursor(tile_offsets.begin(), tile_offsets.end() - 1);
  for (int32_t id : order)
    for (int ty = tiles[id].y0; ty < tiles[id].y1; ++ty)
      for (int tx = tiles[id].x0; tx < tiles[id].x1; ++tx)
        point_list[cursor[ty * tiles_x + tx]++] = id;
}

namespace {

// The pixels of one tile, and the part of a surfel's rectangle inside it.
struct TileWindow {
  int x0, y0, x1, y1;  // the tile's pixels, clipped to the image

  TileWindow(int tile, int tiles_x, int width, int height) {
    x0 = (tile % tiles_x) * kTileSize;
    y0 = (tile / tiles_x) * kTileSize;
    x1 = std::min(width, x0 + kTileSize);
    y1 = std::min(height, y0 + kTileSize);
  }
  PixelRect clip(const PixelRect& r) const {
    return PixelRect{std::max(r.x0, x0), std::max(r.y0, y0), std::min(r.x1, x1), std::min(r.y1, y1)};
  }
  int local(int px, int py) const { return (py - y0) * kTileSize + (px - x0); }
};

}  // namespace

// Within a tile the loop is surfel-major: each surfel visits only the pixels
// of its rectangle, and every pixel still sees its surfels front to back
// with exactly the per-pixel operations of core.h.
template <typename T>
void forward_cpu(const SurfelArrays<T>& s, const TileBins& bins, const ForwardOutputs<T>& out) {
  const int W = s.width, H = s.height;
  const int num_tiles = bins.tiles_x * bins.tiles_y;
#pragma omp parallel for schedule(dynamic, 1)
  for (int tile = 0; tile < num_tiles; ++tile) {
    const TileWindow win(tile, bins.tiles_x, W, H);
    const int64_t begin = bins.tile_offsets[tile];
    const int32_t count = static_cast<int32_t>(bins.tile_offsets[tile + 1] - begin);
    const int32_t* list = bins.point_list + begin;
    PixelState<T> pixels[kTileSize * kTileSize];
    bool done[kTileSize * kTileSize] = {};
    int active = (win.x1 - win.x0) * (win.y1 - win.y0);
    for (auto& p : pixels) init_pixel(p);
    SurfelParams<T> sp;
    Hit<T> h;
    for (int32_t k = 0; k < count && active > 0; ++k) {
      const int32_t id = list[k];
      const PixelRect r = win.clip(load_pixel_rect(s.pixel_rect, id));
      if (r.x1 <= r.x0 || r.y1 <= r.y0) continue;
      load_surfel(s.Tuvw, s.center, s.opacity, id, sp);
      for (int py = r.y0; py < r.y1; ++py) {
        for (int px = r.x0; px < r.x1; ++px) {
          const int i = win.local(px, py);
          if (done[i]) continue;
          intersect(sp, T(px) + T(0.5), T(py) + T(0.5), s.near, h);
          if (!h.contributes) continue;
          if (!blend(pixels[i], h, s.color + 3 * id, s.normal + 3 * id, s.near, s.far, k)) {
            done[i] = true;
            --active;
          }
        }
      }
    }
    for (int py = win.y0; py < win.y1; ++py) {
      for (int px = win.x0; px < win.x1; ++px) {
        const PixelState<T>& p = pixels[win.local(px, py)];
        const int64_t pix = int64_t(py) * W + px;
        store_pixel(p, pix, out);
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
    const TileWindow win(tile, bins.tiles_x, W, H);
    const int64_t begin = bins.tile_offsets[tile];
    const int32_t* list = bins.point_list + begin;
    T* tile_grads = pair_grads.data() + begin * kGradSize;
    constexpr int kPixels = kTileSize * kTileSize;
    PixelGrad<T> grads[kPixels];
    BackwardState<T> states[kPixels];
    int32_t ends[kPixels] = {}, medians[kPixels];
    int32_t max_end = 0;
    for (int py = win.y0; py < win.y1; ++py) {
      for (int px = win.x0; px < win.x1; ++px) {
        const int i = win.local(px, py);
        const int64_t pix = int64_t(py) * W + px;
        load_pixel_grad(up, totals, pix, grads[i]);
        states[i] = BackwardState<T>{transmittance[pix], up.v_transmittance[pix]};
        ends[i] = end[pix];
        medians[i] = median_index[pix];
        max_end = std::max(max_end, ends[i]);
      }
    }
    SurfelParams<T> sp;
    Hit<T> h;
    for (int32_t k = max_end - 1; k >= 0; --k) {
      const int32_t id = list[k];
      const PixelRect r = win.clip(load_pixel_rect(s.pixel_rect, id));
      if (r.x1 <= r.x0 || r.y1 <= r.y0) continue;
      load_surfel(s.Tuvw, s.center, s.opacity, id, sp);
      T* record = tile_grads + int64_t(k) * kGradSize;
      for (int py = r.y0; py < r.y1; ++py) {
        for (int px = r.x0; px < r.x1; ++px) {
          const int i = win.local(px, py);
          if (k >= ends[i]) continue;
          const T x = T(px) + T(0.5), y = T(py) + T(0.5);
          intersect(sp, x, y, s.near, h);
          if (!h.contributes) continue;
          backward_step(states[i], grads[i], sp, h, s.color + 3 * id, s.normal + 3 * id, x, y,
                        s.near, s.far, k == medians[i], record);
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
