// The CPU tile loops, written once for both primitives and templated over a
// policy P (SurfelTiles in rasterize_cpu.cpp, GaussianTiles in
// gaussians_cpu.cpp), as the CUDA kernels are over surfel_batch.cuh and
// gaussian_batch.cuh.  The loops own the tiles, the list walk, the stopping
// rule and the per-pixel state; the policy owns the primitive: its packed
// record, its candidate pixels and its per-pixel maths (core.h).
//
// Two loops per direction:
//   scalar  one pixel at a time (float64, and the float32 reference modes),
//           over each primitive's rectangle, each row clipped by the policy's
//           Rows when `spans` is set;
//   SIMD    float32, 8 pixels at a time (cpu/simd.h): two windows of 4 over a
//           primitive's candidate pixels (P::candidate_rows, a superset of the
//           pixels it contributes to).
// Every lane computes exactly the scalar operations of core.h in the same
// order, and the pixels a loop skips are pixels the primitive cannot
// contribute to, so the forward outputs are bitwise equal across loops.  How
// the backward adds one primitive's per-pixel gradients into its record is
// the policy's (P::Accumulator).
//
// The policy provides:
//   Arrays, Params, Hit<V>, Packed, kRecord
//   count(a), load(a, id, params), pack(a, packed), rect(packed)
//   Rows(params).clip_row(py, x0, x1)                 (scalar row spans)
//   blend(pixel, params, a, id, x, y, k) -> finished    (scalar forward)
//   backward(state, grad, params, a, id, x, y, median, record)  (scalar)
//   candidate_rows(packed, rect, win, rows)             (SIMD)
//   intersect(packed, x, y, near, hit), normal(packed, hit)       (SIMD)
//   Accumulator: begin(), visit(...), finish(record)    (SIMD backward)
#pragma once

#include <algorithm>
#include <cstdint>

#include "../core.h"
#include "rasterize_cpu.h"
#include "simd.h"
#include "tiles.h"

namespace splat {
namespace tiles {

#define SPLAT_ALWAYS_INLINE inline __attribute__((always_inline))

// ---- one pixel at a time -------------------------------------------------
template <typename P, typename T>
void forward_tile_scalar(const typename P::template Arrays<T>& a, const TileBins& bins, int tile,
                         const ForwardOutputs<T>& out, bool spans) {
  const TileWindow win(tile, bins.tiles_x, a.width, a.height);
  const int64_t begin = bins.tile_offsets[tile];
  const int32_t count = static_cast<int32_t>(bins.tile_offsets[tile + 1] - begin);
  const int32_t* list = bins.point_list + begin;
  PixelState<T> pixels[kPixels];
  bool done[kPixels] = {};
  int active = (win.x1 - win.x0) * (win.y1 - win.y0);
  for (auto& p : pixels) init_pixel(p);
  typename P::template Params<T> prm;
  for (int32_t k = 0; k < count && active > 0; ++k) {
    const int32_t id = list[k];
    const PixelRect r = win.clip(load_pixel_rect(a.pixel_rect, id));
    if (r.x1 <= r.x0 || r.y1 <= r.y0) continue;
    P::load(a, id, prm);
    const typename P::template Rows<T> rows(prm);
    for (int py = r.y0; py < r.y1; ++py) {
      int x0 = r.x0, x1 = r.x1;
      if (spans) rows.clip_row(py, x0, x1);
      for (int px = x0; px < x1; ++px) {
        const int i = win.local(px, py);
        if (done[i]) continue;
        if (P::blend(pixels[i], prm, a, id, T(px) + T(0.5), T(py) + T(0.5), k)) {
          done[i] = true;
          --active;
        }
      }
    }
  }
  for (int py = win.y0; py < win.y1; ++py)
    for (int px = win.x0; px < win.x1; ++px)
      store_pixel(pixels[win.local(px, py)], int64_t(py) * a.width + px, out);
}

// Each contributing pixel adds to the record of list position k in pixel
// order (rows top to bottom, each left to right).
template <typename P, typename T>
void backward_tile_scalar(const typename P::template Arrays<T>& a, const TileBins& bins, int tile,
                          const int32_t* end, const int32_t* median_index, const T* transmittance,
                          const T* totals, const UpstreamGrads<T>& up, T* records, bool spans) {
  const TileWindow win(tile, bins.tiles_x, a.width, a.height);
  const int32_t* list = bins.point_list + bins.tile_offsets[tile];
  PixelGrad<T> grads[kPixels];
  BackwardState<T> states[kPixels];
  int32_t ends[kPixels], medians[kPixels];
  const int32_t max_end = load_tile_grads(a.width, win, end, median_index, transmittance, totals,
                                          up, grads, states, ends, medians);
  typename P::template Params<T> prm;
  for (int32_t k = max_end - 1; k >= 0; --k) {
    const int32_t id = list[k];
    const PixelRect r = win.clip(load_pixel_rect(a.pixel_rect, id));
    if (r.x1 <= r.x0 || r.y1 <= r.y0) continue;
    P::load(a, id, prm);
    const typename P::template Rows<T> rows(prm);
    T* record = records + int64_t(k) * P::kRecord;
    for (int py = r.y0; py < r.y1; ++py) {
      int x0 = r.x0, x1 = r.x1;
      if (spans) rows.clip_row(py, x0, x1);
      for (int px = x0; px < x1; ++px) {
        const int i = win.local(px, py);
        if (k >= ends[i]) continue;
        P::backward(states[i], grads[i], prm, a, id, T(px) + T(0.5), T(py) + T(0.5),
                    k == medians[i], record);
      }
    }
  }
}

// ---- 8 pixels at a time (float32) -------------------------------------------
// A visit evaluates one primitive at 8 pixels of the tile, given as two
// windows of 4 consecutive pixels of a row (lanes 0-3 and 4-7; the two
// windows may lie in one row or in two).  For each primitive the loops first
// find its candidate pixels, cover each row's candidates with windows, and
// pair the windows up, so that small footprints (a few pixels wide, the
// common case in trained scenes) fill the lanes instead of leaving most of a
// fixed 8-pixel half-row idle.  Windows come in pixel order (rows top to
// bottom, each left to right) and lane i precedes lane i + 1 in that order.
//
// Tile state is stored row by row with kRowStride >= kTileSize + kWindow - 1,
// so that a window starting at any pixel of a row stays inside that row's
// storage; the extra row kTileSize is a spare, the partner of an unpaired
// window (its lanes are masked off, and whatever they hold is never selected).
constexpr int kWindow = 4;
constexpr int kRowStride = kTileSize + kWindow;
constexpr int kSpareRow = kTileSize;
constexpr int kStatePixels = ((kTileSize + 1) * kRowStride + kLanes - 1) / kLanes * kLanes;
static_assert(2 * kWindow == kLanes, "a visit is two windows");

inline int state_index(int local_x, int local_y) { return local_y * kRowStride + local_x; }

// 4 pixels of a tile row: tile-local start x, row y, and which of them to evaluate.
struct Window {
  int8_t x, y;
  uint8_t bits;
};

// Covers the set bits of row masks rows[y0 .. y1) (bit x = tile-local column
// x) with windows of kWindow pixels, each starting at its row's first
// uncovered bit.  Returns the number written (at most kTileSize^2 / kWindow).
inline int cover_rows(const uint32_t* rows, int y0, int y1, Window* out) {
  int n = 0;
  for (int y = y0; y < y1; ++y) {
    for (uint32_t m = rows[y]; m;) {
      const int x = __builtin_ctz(m);
      out[n++] = Window{int8_t(x), int8_t(y), uint8_t((m >> x) & 0xFu)};
      m &= ~(0xFu << x);
    }
  }
  return n;
}

const VInt kLaneIndex(i32x8{0, 1, 2, 3, 4, 5, 6, 7});

// A pair of windows as lanes: pixel-centre coordinates, state indices, and the
// lanes to evaluate.
struct WindowPair {
  int ia, ib;  // state indices of lanes 0 and 4
  VFloat x, y;
  VMask lanes;

  WindowPair(const Window& a, const Window& b, const TileWindow& win) {
    ia = state_index(a.x, a.y);
    ib = state_index(b.x, b.y);
    // exactly the scalar path's float(px) + 0.5f and float(py) + 0.5f
    const i32x8 upper = {0, 0, 0, 0, -1, -1, -1, -1};
    const i32x8 xs = ((i32x8{} + (win.x0 + a.x)) & ~upper) | ((i32x8{} + (win.x0 + b.x)) & upper);
    x = to_float(VInt(xs + i32x8{0, 1, 2, 3, 0, 1, 2, 3})) + 0.5f;
    y = to_float(
            VInt(((i32x8{} + (win.y0 + a.y)) & ~upper) | ((i32x8{} + (win.y0 + b.y)) & upper))) +
        0.5f;
    lanes = mask_from_bits(uint32_t(a.bits) | uint32_t(b.bits) << kWindow);
  }
};

inline Window spare_window() { return Window{0, int8_t(kSpareRow), 0}; }

// Lanes of half-row pixels x_start .. x_start + 7 inside [x0, x1).
inline VMask span_lanes(int x_start, int x0, int x1) {
  const VInt x = VInt(kLaneIndex.v + x_start);
  return mask_and(mask_not(x < VInt(x0)), x < VInt(x1));
}

// A tile's pixel state as structures of arrays, so that a window of 4 pixels
// loads as one 128-bit half of a vector.
struct alignas(32) ForwardTileState {
  float T[kStatePixels], color[3][kStatePixels], depth[kStatePixels], normal[3][kStatePixels];
  float A[kStatePixels], D[kStatePixels], D2[kStatePixels], shift[kStatePixels], dist[kStatePixels],
      median[kStatePixels];
  int32_t median_index[kStatePixels], end[kStatePixels];

  void load(int a, int b, PixelState<VFloat>& p) const {
    p.transmittance = load_halves(T + a, T + b);
    for (int c = 0; c < 3; ++c) p.color[c] = load_halves(color[c] + a, color[c] + b);
    p.depth_sum = load_halves(depth + a, depth + b);
    for (int c = 0; c < 3; ++c) p.normal[c] = load_halves(normal[c] + a, normal[c] + b);
    p.A = load_halves(A + a, A + b);
    p.D = load_halves(D + a, D + b);
    p.D2 = load_halves(D2 + a, D2 + b);
    p.m_shift = load_halves(shift + a, shift + b);
    p.distortion = load_halves(dist + a, dist + b);
    p.median_depth = load_halves(median + a, median + b);
    p.median_index = load_halves(median_index + a, median_index + b);
    p.end = load_halves(end + a, end + b);
  }
  void store(int a, int b, const PixelState<VFloat>& p) {
    store_halves(T + a, T + b, p.transmittance);
    for (int c = 0; c < 3; ++c) store_halves(color[c] + a, color[c] + b, p.color[c]);
    store_halves(depth + a, depth + b, p.depth_sum);
    for (int c = 0; c < 3; ++c) store_halves(normal[c] + a, normal[c] + b, p.normal[c]);
    store_halves(A + a, A + b, p.A);
    store_halves(D + a, D + b, p.D);
    store_halves(D2 + a, D2 + b, p.D2);
    store_halves(shift + a, shift + b, p.m_shift);
    store_halves(dist + a, dist + b, p.distortion);
    store_halves(median + a, median + b, p.median_depth);
    store_halves(median_index + a, median_index + b, p.median_index);
    store_halves(end + a, end + b, p.end);
  }
  void init() {
    PixelState<VFloat> p;
    init_pixel(p);
    for (int i = 0; i < kStatePixels; i += kLanes) store(i, i + kWindow, p);
  }
  PixelState<float> pixel(int i) const {
    PixelState<float> p;
    p.transmittance = T[i];
    for (int c = 0; c < 3; ++c) p.color[c] = color[c][i], p.normal[c] = normal[c][i];
    p.depth_sum = depth[i];
    p.A = A[i];
    p.D = D[i];
    p.D2 = D2[i];
    p.m_shift = shift[i];
    p.distortion = dist[i];
    p.median_depth = median[i];
    p.median_index = median_index[i];
    p.end = end[i];
    return p;
  }
};

struct alignas(32) BackwardTileState {
  float v_color[3][kStatePixels], v_depth[kStatePixels], v_normal[3][kStatePixels],
      v_dist[kStatePixels], v_median[kStatePixels], A[kStatePixels], D[kStatePixels],
      D2[kStatePixels], shift[kStatePixels];
  float T[kStatePixels], dL_dT[kStatePixels];
  int32_t end[kStatePixels], median_index[kStatePixels];

  void load(int a, int b, PixelGrad<VFloat>& g, BackwardState<VFloat>& s) const {
    for (int c = 0; c < 3; ++c) g.v_color[c] = load_halves(v_color[c] + a, v_color[c] + b);
    g.v_depth_sum = load_halves(v_depth + a, v_depth + b);
    for (int c = 0; c < 3; ++c) g.v_normal[c] = load_halves(v_normal[c] + a, v_normal[c] + b);
    g.v_distortion = load_halves(v_dist + a, v_dist + b);
    g.v_median = load_halves(v_median + a, v_median + b);
    g.A = load_halves(A + a, A + b);
    g.D = load_halves(D + a, D + b);
    g.D2 = load_halves(D2 + a, D2 + b);
    g.m_shift = load_halves(shift + a, shift + b);
    s.transmittance = load_halves(T + a, T + b);
    s.last_dL_dT = load_halves(dL_dT + a, dL_dT + b);
  }
  // Loads the tile's pixels; every other state pixel (row padding, the spare
  // row, pixels outside the image) is neutral, so that the masked lanes of
  // windows over them compute on finite values.  Returns the largest `end`.
  int32_t load_tile(int width, const TileWindow& win, const int32_t* end_in,
                    const int32_t* median_in, const float* transmittance, const float* totals,
                    const UpstreamGrads<float>& up) {
    for (float* f : {v_color[0], v_color[1], v_color[2], v_depth, v_normal[0], v_normal[1],
                     v_normal[2], v_dist, v_median, A, D, D2, shift, dL_dT})
      std::fill(f, f + kStatePixels, 0.0f);
    std::fill(T, T + kStatePixels, 1.0f);
    std::fill(end, end + kStatePixels, 0);
    std::fill(median_index, median_index + kStatePixels, -1);
    int32_t max_end = 0;
    for (int py = win.y0; py < win.y1; ++py) {
      for (int px = win.x0; px < win.x1; ++px) {
        const int i = state_index(px - win.x0, py - win.y0);
        const int64_t pix = int64_t(py) * width + px;
        PixelGrad<float> g;
        load_pixel_grad(up, totals, pix, g);
        set(i, g, initial_backward_state(transmittance, up, pix));
        end[i] = end_in[pix];
        median_index[i] = median_in[pix];
        max_end = std::max(max_end, end[i]);
      }
    }
    return max_end;
  }
  void set(int i, const PixelGrad<float>& g, const BackwardState<float>& b) {
    for (int c = 0; c < 3; ++c) v_color[c][i] = g.v_color[c], v_normal[c][i] = g.v_normal[c];
    v_depth[i] = g.v_depth_sum;
    v_dist[i] = g.v_distortion;
    v_median[i] = g.v_median;
    A[i] = g.A;
    D[i] = g.D;
    D2[i] = g.D2;
    shift[i] = g.m_shift;
    T[i] = b.transmittance;
    dL_dT[i] = b.last_dL_dT;
  }
};

// The lists visit primitives in depth order, i.e. at random addresses: the
// loops prefetch the packed record a few list entries ahead.
constexpr int kPrefetchAhead = 4;

template <typename Packed>
SPLAT_ALWAYS_INLINE void prefetch_record(const Packed* p) {
  const char* c = reinterpret_cast<const char*>(p);
  for (size_t off = 0; off < sizeof(Packed); off += 64) __builtin_prefetch(c + off);
}

// Inlined into each primitive's target_clones entry point (rasterize_cpu.cpp,
// gaussians_cpu.cpp), so that it is compiled for every instruction set.
template <typename P>
SPLAT_ALWAYS_INLINE void forward_tile_simd(const typename P::template Arrays<float>& a,
                                           const typename P::Packed* packed, const TileBins& bins,
                                           int tile, const ForwardOutputs<float>& out) {
  const TileWindow win(tile, bins.tiles_x, a.width, a.height);
  const int64_t begin = bins.tile_offsets[tile];
  const int32_t count = static_cast<int32_t>(bins.tile_offsets[tile + 1] - begin);
  const int32_t* list = bins.point_list + begin;
  ForwardTileState st;
  st.init();
  uint32_t done[kTileSize + 1] = {};  // per row, bit x: that pixel is finished
  int active = (win.x1 - win.x0) * (win.y1 - win.y0);
  uint32_t rows[kTileSize];
  Window windows[kPixels / kWindow];
  typename P::template Hit<VFloat> h;
  PixelState<VFloat> p;
  for (int32_t k = 0; k < count && active > 0; ++k) {
    if (k + kPrefetchAhead < count) prefetch_record(packed + list[k + kPrefetchAhead]);
    const typename P::Packed& ps = packed[list[k]];
    const PixelRect r = win.clip(P::rect(ps));
    if (r.x1 <= r.x0 || r.y1 <= r.y0) continue;
    P::candidate_rows(ps, r, win, rows);
    const int ly0 = r.y0 - win.y0, ly1 = r.y1 - win.y0;
    for (int y = ly0; y < ly1; ++y) rows[y] &= ~done[y];
    const int n = cover_rows(rows, ly0, ly1, windows);
    for (int j = 0; j < n; j += 2) {
      const Window& wa = windows[j];
      const Window wb = j + 1 < n ? windows[j + 1] : spare_window();
      const WindowPair w(wa, wb, win);
      P::intersect(ps, w.x, w.y, a.near, h);
      const VMask go = mask_and(w.lanes, h.contributes);
      if (!any_lane(go)) continue;
      st.load(w.ia, w.ib, p);
      const VMask finished =
          blend_lanes(p, h, go, P::color(ps), P::normal(ps, h), a.near, a.far, k);
      st.store(w.ia, w.ib, p);
      if (any_lane(finished)) {
        const uint32_t f = lane_bits(finished);
        done[wa.y] |= (f & 0xFu) << wa.x;
        done[wb.y] |= (f >> kWindow) << wb.x;
        active -= __builtin_popcount(f);
      }
    }
  }
  for (int py = win.y0; py < win.y1; ++py)
    for (int px = win.x0; px < win.x1; ++px)
      store_pixel(st.pixel(state_index(px - win.x0, py - win.y0)), int64_t(py) * a.width + px, out);
}

template <typename P>
SPLAT_ALWAYS_INLINE void backward_tile_simd(const typename P::template Arrays<float>& a,
                                            const typename P::Packed* packed, const TileBins& bins,
                                            int tile, const int32_t* end,
                                            const int32_t* median_index, const float* transmittance,
                                            const float* totals, const UpstreamGrads<float>& up,
                                            float* records) {
  const TileWindow win(tile, bins.tiles_x, a.width, a.height);
  const int32_t* list = bins.point_list + bins.tile_offsets[tile];
  BackwardTileState st;
  const int32_t max_end = st.load_tile(a.width, win, end, median_index, transmittance, totals, up);
  uint32_t rows[kTileSize];
  Window windows[kPixels / kWindow];
  typename P::template Hit<VFloat> h;
  PixelGrad<VFloat> g;
  BackwardState<VFloat> b;
  typename P::Accumulator acc;
  for (int32_t k = max_end - 1; k >= 0; --k) {
    if (k >= kPrefetchAhead) __builtin_prefetch(packed + list[k - kPrefetchAhead]);
    const typename P::Packed& ps = packed[list[k]];
    const PixelRect r = win.clip(P::rect(ps));
    if (r.x1 <= r.x0 || r.y1 <= r.y0) continue;
    P::candidate_rows(ps, r, win, rows);
    // only the pixels that blended list position k (k < their end)
    const int ly0 = r.y0 - win.y0, ly1 = r.y1 - win.y0;
    for (int y = ly0; y < ly1; ++y) {
      if (!rows[y]) continue;
      const int32_t* e = st.end + state_index(0, y);
      rows[y] &= lane_bits(VInt(k) < load8(e)) | lane_bits(VInt(k) < load8(e + kLanes)) << kLanes;
    }
    const int n = cover_rows(rows, ly0, ly1, windows);
    float* record = records + int64_t(k) * P::kRecord;
    bool touched = false;
    for (int j = 0; j < n; j += 2) {
      const Window& wa = windows[j];
      const Window wb = j + 1 < n ? windows[j + 1] : spare_window();
      const WindowPair w(wa, wb, win);
      P::intersect(ps, w.x, w.y, a.near, h);
      const VMask go = mask_and(w.lanes, h.contributes);
      if (!any_lane(go)) continue;
      if (!touched) {
        acc.begin();
        touched = true;
      }
      st.load(w.ia, w.ib, g, b);
      const VMask is_median =
          mask_and(go, load_halves(st.median_index + w.ia, st.median_index + w.ib) == k);
      acc.visit(b, g, ps, h, go, w.x, w.y, a.near, a.far, is_median, record);
      store_halves(st.T + w.ia, st.T + w.ib, b.transmittance);
      store_halves(st.dL_dT + w.ia, st.dL_dT + w.ib, b.last_dL_dT);
    }
    if (touched) acc.finish(record);
  }
}

// ---- drivers -----------------------------------------------------------------
// inline: one definition across the translation units that include this
// header (clang gives the explicit specialization external linkage).
template <typename T>
inline constexpr bool kHasSimd = false;
template <>
inline constexpr bool kHasSimd<float> = true;

// Renders every tile (longest lists first) with the SIMD loop `simd_tile`
// (float32 in kModeSimd, given the packed records) or the scalar one.
template <typename P, typename T, typename SimdTile>
void forward_tiles(const typename P::template Arrays<T>& a, const TileBins& bins,
                   const ForwardOutputs<T>& out, int mode, const typename P::Packed* packed,
                   const SimdTile& simd_tile) {
  const std::vector<int> order = tiles_by_cost(bins);
  const int num_tiles = static_cast<int>(order.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int t = 0; t < num_tiles; ++t) {
    const int tile = order[t];
    if constexpr (kHasSimd<T>) {
      if (mode == kModeSimd) {
        simd_tile(packed, tile);
        continue;
      }
    }
    forward_tile_scalar<P>(a, bins, tile, out, mode != kModeReference);
  }
}

template <typename P, typename T, typename SimdTile>
void backward_tiles(const typename P::template Arrays<T>& a, const TileBins& bins,
                    const int32_t* end, const int32_t* median_index, const T* transmittance,
                    const T* totals, const UpstreamGrads<T>& up, T* v_out, int mode,
                    const typename P::Packed* packed, const SimdTile& simd_tile) {
  backward_over_tiles<P::kRecord>(
      bins, a.width, a.height, end, P::count(a),
      [&](int tile, T* tile_records) {
        if constexpr (kHasSimd<T>) {
          if (mode == kModeSimd) {
            simd_tile(packed, tile, tile_records);
            return;
          }
        }
        backward_tile_scalar<P>(a, bins, tile, end, median_index, transmittance, totals, up,
                                tile_records, mode != kModeReference);
      },
      v_out);
}

}  // namespace tiles
}  // namespace splat
