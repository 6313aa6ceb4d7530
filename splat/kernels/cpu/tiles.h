// The tile machinery of the CPU backend shared by both primitives (surfels in
// rasterize_cpu.cpp, 3D Gaussians in gaussians_cpu.cpp): thread chunks, a
// tile's pixels, the order tiles are rendered in, the per-pixel backward state
// of a tile, and the deterministic record-based backward driver.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "../core.h"
#include "../raster_args.h"
#include "scratch.h"

namespace splat {
namespace tiles {

// This thread's share [lo, hi) of n items inside an OpenMP parallel region:
// fixed contiguous chunks in thread order, so that work done chunk by chunk
// and then combined in chunk order gives the same result for any number of
// threads.
struct ThreadChunk {
  int part = 0, parts = 1;
  int64_t lo, hi;
  explicit ThreadChunk(int64_t n) {
#ifdef _OPENMP
    part = omp_get_thread_num();
    parts = omp_get_num_threads();
#endif
    lo = n * part / parts;
    hi = n * (part + 1) / parts;
  }
};

inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

constexpr int kPixels = kTileSize * kTileSize;

// The pixels of one tile, and the part of a primitive's rectangle inside it.
struct TileWindow {
  int x0, y0, x1, y1;  // the tile's pixels, clipped to the image

  TileWindow(int tile, int tiles_x, int width, int height) {
    x0 = (tile % tiles_x) * kTileSize;
    y0 = (tile / tiles_x) * kTileSize;
    x1 = std::min(width, x0 + kTileSize);
    y1 = std::min(height, y0 + kTileSize);
  }
  PixelRect clip(const PixelRect& r) const {
    return PixelRect{std::max(r.x0, x0), std::max(r.y0, y0), std::min(r.x1, x1),
                     std::min(r.y1, y1)};
  }
  int local(int px, int py) const { return (py - y0) * kTileSize + (px - x0); }
};

// Tiles with the longest lists first, so that the dynamic schedule does not
// end on one expensive tile.
inline std::vector<int> tiles_by_cost(const TileBins& bins) {
  const int num_tiles = bins.tiles_x * bins.tiles_y;
  std::vector<int> order(num_tiles);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return bins.tile_offsets[a + 1] - bins.tile_offsets[a] >
           bins.tile_offsets[b + 1] - bins.tile_offsets[b];
  });
  return order;
}

// Backward state of a tile's pixels, loaded from the forward's outputs.
// Returns the largest `end` of the tile.
template <typename T>
int32_t load_tile_grads(int width, const TileWindow& win, const int32_t* end,
                        const int32_t* median_index, const T* transmittance, const T* totals,
                        const UpstreamGrads<T>& up, PixelGrad<T>* grads, BackwardState<T>* states,
                        int32_t* ends, int32_t* medians) {
  int32_t max_end = 0;
  for (int i = 0; i < kPixels; ++i) ends[i] = 0, medians[i] = -1;
  for (int py = win.y0; py < win.y1; ++py) {
    for (int px = win.x0; px < win.x1; ++px) {
      const int i = win.local(px, py);
      const int64_t pix = int64_t(py) * width + px;
      load_pixel_grad(up, totals, pix, grads[i]);
      states[i] = initial_backward_state(transmittance, up, pix);
      ends[i] = end[pix];
      medians[i] = median_index[pix];
      max_end = std::max(max_end, ends[i]);
    }
  }
  return max_end;
}

// The deterministic backward: each tile owns one gradient record of
// `record_size` scalars per list position it blended (below the tile's
// largest `end`), zeroed and then filled by tile_fn(tile, records) on the one
// thread that renders the tile; the records are then reduced into the
// primitives' rows of `out` [n, record_size] in tile order, each thread
// owning a range of primitives.  So gradients are bitwise identical across
// runs and thread counts, and the memory is bounded by the blended work.
template <int record_size, typename T, typename TileFn>
void backward_over_tiles(const TileBins& bins, int width, int height, const int32_t* end, int64_t n,
                         const TileFn& tile_fn, T* out) {
  const int num_tiles = bins.tiles_x * bins.tiles_y;
  std::vector<int32_t> tile_end(num_tiles, 0);
#pragma omp parallel for schedule(static)
  for (int tile = 0; tile < num_tiles; ++tile) {
    const TileWindow win(tile, bins.tiles_x, width, height);
    int32_t m = 0;
    for (int py = win.y0; py < win.y1; ++py)
      for (int px = win.x0; px < win.x1; ++px) m = std::max(m, end[int64_t(py) * width + px]);
    tile_end[tile] = m;
  }
  std::vector<int64_t> record_offset(num_tiles + 1, 0);
  for (int tile = 0; tile < num_tiles; ++tile)
    record_offset[tile + 1] = record_offset[tile] + tile_end[tile];
  // Left uninitialised here: each tile's thread zeroes its own records just
  // before filling them (one pass over memory that is then in cache, and the
  // pages are first touched by the thread that uses them).
  ScratchArray<T> records(static_cast<size_t>(record_offset[num_tiles]) * record_size);

  const std::vector<int> order = tiles_by_cost(bins);
#pragma omp parallel for schedule(dynamic, 1)
  for (int t = 0; t < num_tiles; ++t) {
    const int tile = order[t];
    if (tile_end[tile] == 0) continue;
    T* tile_records = records.data() + record_offset[tile] * record_size;
    std::fill(tile_records, tile_records + int64_t(tile_end[tile]) * record_size, T(0));
    tile_fn(tile, tile_records);
  }

  constexpr int32_t kReducePrefetchAhead = 8;
#pragma omp parallel
  {
    const ThreadChunk c(n);
    const int64_t lo = c.lo, hi = c.hi;
    std::fill(out + lo * record_size, out + hi * record_size, T(0));
    for (int tile = 0; tile < num_tiles; ++tile) {
      const int32_t* list = bins.point_list + bins.tile_offsets[tile];
      const T* src = records.data() + record_offset[tile] * record_size;
      for (int32_t k = 0; k < tile_end[tile]; ++k, src += record_size) {
        // The primitives are at random addresses: fetch a few records ahead.
        if (k + kReducePrefetchAhead < tile_end[tile]) {
          const int64_t ahead = list[k + kReducePrefetchAhead];
          if (ahead >= lo && ahead < hi) {
            __builtin_prefetch(out + ahead * record_size, 1);
            __builtin_prefetch(out + ahead * record_size + record_size - 1, 1);
          }
        }
        const int64_t id = list[k];
        if (id < lo || id >= hi) continue;
        T* dst = out + id * record_size;
        for (int j = 0; j < record_size; ++j) dst[j] += src[j];
      }
    }
  }
}

}  // namespace tiles
}  // namespace splat
