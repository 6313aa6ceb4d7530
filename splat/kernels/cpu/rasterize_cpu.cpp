// CPU backend: the same tiles, order and per-pixel maths as the CUDA backend,
// with OpenMP over tiles.  The per-pixel maths comes from core.h.
//
// Three kernel modes (set_cpu_kernel_mode; the default is the fastest):
//   kModeReference  one pixel at a time over each surfel's whole pixel rectangle;
//   kModeScalar     one pixel at a time over the exact per-row spans of each
//                   surfel's footprint (RowSpans below);
//   kModeSimd       float32: 8 pixels at a time (cpu/simd.h), two windows of
//                   4 over each surfel's candidate pixels (candidate_rows),
//                   compiled for AVX-512, AVX2 and baseline x86-64 and chosen
//                   at run time; float64 falls back to kModeScalar.
// Every mode computes, for each pixel, exactly the operations of core.h in the
// same order, so the forward outputs are bitwise equal across modes.  Backward
// gradients are bitwise equal between the two scalar modes; the SIMD mode sums
// the eight lanes' contributions to a surfel in another order (float32 noise).
//
// Determinism: the backward pass never adds two threads' results into one
// place.  Each tile owns one gradient record per list position it blended
// (below the tile's largest `end`), filled by the one thread that renders the
// tile; records are then reduced into surfels in tile order, each thread
// owning a range of surfels.  Gradients are therefore bitwise identical across
// runs and thread counts, and the memory is bounded by the blended work.
#include "rasterize_cpu.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "../core.h"
#include "scratch.h"
#include "simd.h"
#include "tiles.h"

namespace splat {

using tiles::kPixels;
using tiles::load_tile_grads;
using tiles::max_threads;
using tiles::ThreadChunk;
using tiles::TileWindow;
using tiles::tiles_by_cost;

namespace {
int g_kernel_mode = kModeSimd;
}

void set_cpu_kernel_mode(int mode) { g_kernel_mode = mode; }
int cpu_kernel_mode() { return g_kernel_mode; }

namespace {

// Sorts values by keys, stably (equal keys keep their input order): a parallel
// LSD radix sort, 8 bits a pass, skipping passes whose digit all keys share.
// A stable sort's result is unique, so it does not depend on the thread count.
template <typename Key, typename Value>
void stable_radix_sort(ScratchArray<Key>& keys, ScratchArray<Value>& values) {
  constexpr int kBits = 8, kBuckets = 1 << kBits;
  const int64_t n = static_cast<int64_t>(keys.size());
  ScratchArray<Key> keys_tmp(n);
  ScratchArray<Value> values_tmp(n);
  std::vector<int64_t> hist(static_cast<size_t>(max_threads()) * kBuckets);
  for (int shift = 0; shift < int(8 * sizeof(Key)); shift += kBits) {
    bool skip = false;
#pragma omp parallel
    {
      const ThreadChunk c(n);
      int64_t* h = hist.data() + int64_t(c.part) * kBuckets;
      std::fill(h, h + kBuckets, 0);
      for (int64_t i = c.lo; i < c.hi; ++i) ++h[(keys[i] >> shift) & (kBuckets - 1)];
#pragma omp barrier
#pragma omp single
      {
        // bucket-major, then chunk order: each chunk's keys of one digit go
        // after those of the earlier chunks, which keeps the sort stable.
        int64_t start = 0;
        for (int d = 0; d < kBuckets; ++d)
          for (int t = 0; t < c.parts; ++t) {
            const int64_t count = hist[int64_t(t) * kBuckets + d];
            if (count == n) skip = true;
            hist[int64_t(t) * kBuckets + d] = start;
            start += count;
          }
      }  // implicit barrier
      if (!skip) {
        for (int64_t i = c.lo; i < c.hi; ++i) {
          const int64_t at = h[(keys[i] >> shift) & (kBuckets - 1)]++;
          keys_tmp[at] = keys[i];
          values_tmp[at] = values[i];
        }
      }
    }
    if (!skip) {
      keys.swap(keys_tmp);
      values.swap(values_tmp);
    }
  }
}

// A surfel and the tiles it is listed in (empty if culled).  Tile indices fit
// 16 bits: images are at most 2^16 pixels a side (rasterize.py MAX_IMAGE_SIDE).
struct ListedSurfel {
  int32_t id;
  uint16_t x0, y0, x1, y1;
};

}  // namespace

template <typename T>
void bin_tiles_cpu(int64_t n, const T* depth, const int32_t* pixel_rect, int tiles_x, int tiles_y,
                   std::vector<int64_t>& tile_offsets,
                   const std::function<int32_t*(int64_t)>& alloc_point_list) {
  const int num_tiles = tiles_x * tiles_y;
  // Front to back: every surfel sorted by depth, stably (equal depths keep
  // index order, as the CUDA sort); culled ones are skipped when listing.
  // Each carries its tile range through the sort, so that the listing below
  // reads it in sorted order instead of at random addresses.
  ScratchArray<decltype(depth_sort_key(T()))> keys(n);
  ScratchArray<ListedSurfel> order(n);
  int64_t pairs = 0;
#pragma omp parallel for schedule(static) reduction(+ : pairs)
  for (int64_t i = 0; i < n; ++i) {
    keys[i] = depth_sort_key(depth[i]);
    const PixelRect t = listed_tiles(pixel_rect, i, tiles_x, tiles_y);
    order[i] = ListedSurfel{static_cast<int32_t>(i), static_cast<uint16_t>(t.x0),
                            static_cast<uint16_t>(t.y0), static_cast<uint16_t>(t.x1),
                            static_cast<uint16_t>(t.y1)};
    pairs += tile_count(t);
  }
  stable_radix_sort(keys, order);
  // Per-tile lists: each thread counts, then writes, the pairs of its chunk of
  // the sorted order after those of the earlier chunks: the serial order.
  // Allocated here, outside the parallel region: an allocation failure then
  // reaches the caller as an exception.
  int32_t* point_list = alloc_point_list(pairs);
  const int threads = max_threads();
  std::vector<int64_t> cursor(static_cast<size_t>(threads) * num_tiles, 0);
  tile_offsets.assign(num_tiles + 1, 0);
#pragma omp parallel
  {
    const ThreadChunk c(n);
    int64_t* mine = cursor.data() + int64_t(c.part) * num_tiles;
    for (int64_t j = c.lo; j < c.hi; ++j) {
      const ListedSurfel& t = order[j];
      for (int ty = t.y0; ty < t.y1; ++ty)
        for (int tx = t.x0; tx < t.x1; ++tx) ++mine[ty * tiles_x + tx];
    }
#pragma omp barrier
#pragma omp single
    {
      int64_t start = 0;
      for (int tile = 0; tile < num_tiles; ++tile) {
        tile_offsets[tile] = start;
        for (int p = 0; p < c.parts; ++p) {
          const int64_t count = cursor[int64_t(p) * num_tiles + tile];
          cursor[int64_t(p) * num_tiles + tile] = start;
          start += count;
        }
      }
      tile_offsets[num_tiles] = start;
    }  // implicit barrier
    for (int64_t j = c.lo; j < c.hi; ++j) {
      const ListedSurfel& t = order[j];
      for (int ty = t.y0; ty < t.y1; ++ty)
        for (int tx = t.x0; tx < t.x1; ++tx) point_list[mine[ty * tiles_x + tx]++] = t.id;
    }
  }
}

namespace {

// The exact per-row span of a surfel's footprint: the pixels of row y whose
// centre can pass intersect()'s cutoff with alpha >= kAlphaMin.  With
// q = hx x hy = Tu x Tv - x (Tw x Tv) - y (Tu x Tw), affine in the pixel
// centre (x, y), the 3D condition |q01|^2 < c q2^2 is a quadratic inequality in
// x for each row, and the low-pass one a disc.  The span is the hull of both
// intervals, computed in float64 and widened by one pixel on each side, which
// covers float32 rounding of the kernel's own test many times over; when the
// quadratic is not a bounded interval (edge-on or camera-crossing surfels) the
// whole rectangle row is kept.  Skipping a pixel outside the span is exact:
// the kernel would have rejected it.
template <typename T>
struct RowSpans {
  double a0[3], ay[3], b[3];  // q(x, y) = a0 - y ay + x b
  double c;                   // rho cutoff for this opacity
  double cx, cy;
  bool never;                 // opacity too low to ever reach kAlphaMin

  RowSpans() = default;

  // alpha >= kAlphaMin needs o exp(-rho/2) >= 1/255: rho <= 2 ln(255 o); the
  // 0.05 margin covers float32 rounding of exp and of the product.
  static double rho_cut(double opacity) {
    return opacity > 0 ? std::min(kRhoCutoff, 2.0 * std::log(opacity / kAlphaMin) + 0.05) : -1.0;
  }

  explicit RowSpans(const SurfelParams<T>& s) : RowSpans(s, rho_cut(double(s.opacity))) {}

  RowSpans(const SurfelParams<T>& s, double cut) {
    double Tu[3], Tv[3], Tw[3];
    for (int k = 0; k < 3; ++k) Tu[k] = s.Tu[k], Tv[k] = s.Tv[k], Tw[k] = s.Tw[k];
    double wv[3];
    cross3(Tu, Tv, a0);
    cross3(Tu, Tw, ay);
    cross3(Tw, Tv, wv);
    for (int k = 0; k < 3; ++k) b[k] = -wv[k];
    c = cut;
    never = !(c > 0);
    cx = s.center[0];
    cy = s.center[1];
  }

  // Clips [x0, x1) to the pixels of row y (centre y + 0.5) the surfel can draw.
  void clip_row(int y, int& x0, int& x1) const {
    if (never) {
      x1 = x0;
      return;
    }
    const double py = y + 0.5;
    double lo = HUGE_VAL, hi = -HUGE_VAL;  // hull of the two intervals of x centres
    // low-pass disc: 2 |centre - p|^2 < c
    const double dy = cy - py, rem = 0.5 * c - dy * dy;
    if (rem > 0) {
      const double r = std::sqrt(rem);
      lo = cx - r;
      hi = cx + r;
    }
    // 3D: f(x) = |a01 + x b01|^2 - c (a2 + x b2)^2 < 0
    double a[3];
    for (int k = 0; k < 3; ++k) a[k] = a0[k] - py * ay[k];
    const double A = b[0] * b[0] + b[1] * b[1] - c * b[2] * b[2];
    const double B = 2.0 * (a[0] * b[0] + a[1] * b[1] - c * a[2] * b[2]);
    const double C = a[0] * a[0] + a[1] * a[1] - c * a[2] * a[2];
    const double scale = b[0] * b[0] + b[1] * b[1] + c * b[2] * b[2];
    if (!(A > 1e-9 * scale) || !std::isfinite(B) || !std::isfinite(C)) return;  // keep the row
    const double disc = B * B - 4.0 * A * C;
    if (disc >= 0) {
      const double qr = -0.5 * (B + std::copysign(std::sqrt(disc), B));
      double r1 = qr / A, r2 = qr != 0 ? C / qr : r1;
      if (r1 > r2) std::swap(r1, r2);
      lo = std::min(lo, r1);
      hi = std::max(hi, r2);
    }
    if (!(hi >= lo)) {
      x1 = x0;
      return;
    }
    // pixel x has centre x + 0.5: keep x in [floor(lo - 0.5) - 1, floor(hi - 0.5) + 1]
    const double flo = std::floor(lo - 0.5) - 1.0, fhi = std::floor(hi - 0.5) + 2.0;
    if (flo > x0) x0 = flo >= x1 ? x1 : static_cast<int>(flo);
    if (fhi < x1) x1 = fhi <= x0 ? x0 : static_cast<int>(fhi);
  }
};

// ---- one pixel at a time (float64, and the float32 reference modes) ------
template <typename T>
void forward_tile_scalar(const SurfelArrays<T>& s, const TileBins& bins, int tile,
                         const ForwardOutputs<T>& out, bool spans) {
  const TileWindow win(tile, bins.tiles_x, s.width, s.height);
  const int64_t begin = bins.tile_offsets[tile];
  const int32_t count = static_cast<int32_t>(bins.tile_offsets[tile + 1] - begin);
  const int32_t* list = bins.point_list + begin;
  PixelState<T> pixels[kPixels];
  bool done[kPixels] = {};
  int active = (win.x1 - win.x0) * (win.y1 - win.y0);
  for (auto& p : pixels) init_pixel(p);
  SurfelParams<T> sp;
  Hit<T> h;
  for (int32_t k = 0; k < count && active > 0; ++k) {
    const int32_t id = list[k];
    const PixelRect r = win.clip(load_pixel_rect(s.pixel_rect, id));
    if (r.x1 <= r.x0 || r.y1 <= r.y0) continue;
    load_surfel(s.Tuvw, s.center, s.opacity, id, sp);
    const RowSpans<T> rows(sp);
    for (int py = r.y0; py < r.y1; ++py) {
      int x0 = r.x0, x1 = r.x1;
      if (spans) rows.clip_row(py, x0, x1);
      for (int px = x0; px < x1; ++px) {
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
  for (int py = win.y0; py < win.y1; ++py)
    for (int px = win.x0; px < win.x1; ++px)
      store_pixel(pixels[win.local(px, py)], int64_t(py) * s.width + px, out);
}

template <typename T>
void backward_tile_scalar(const SurfelArrays<T>& s, const TileBins& bins, int tile,
                          const int32_t* end, const int32_t* median_index, const T* transmittance,
                          const T* totals, const UpstreamGrads<T>& up, T* records, bool spans) {
  const TileWindow win(tile, bins.tiles_x, s.width, s.height);
  const int32_t* list = bins.point_list + bins.tile_offsets[tile];
  PixelGrad<T> grads[kPixels];
  BackwardState<T> states[kPixels];
  int32_t ends[kPixels], medians[kPixels];
  const int32_t max_end = load_tile_grads(s.width, win, end, median_index, transmittance, totals,
                                          up, grads, states, ends, medians);
  SurfelParams<T> sp;
  Hit<T> h;
  for (int32_t k = max_end - 1; k >= 0; --k) {
    const int32_t id = list[k];
    const PixelRect r = win.clip(load_pixel_rect(s.pixel_rect, id));
    if (r.x1 <= r.x0 || r.y1 <= r.y0) continue;
    load_surfel(s.Tuvw, s.center, s.opacity, id, sp);
    const RowSpans<T> rows(sp);
    T* record = records + int64_t(k) * kGradSize;
    for (int py = r.y0; py < r.y1; ++py) {
      int x0 = r.x0, x1 = r.x1;
      if (spans) rows.clip_row(py, x0, x1);
      for (int px = x0; px < x1; ++px) {
        const int i = win.local(px, py);
        if (k >= ends[i]) continue;
        const T x = T(px) + T(0.5), y = T(py) + T(0.5);
        intersect(sp, x, y, s.near, h);
        if (!h.contributes) continue;
        backward_step(states[i], grads[i], sp, h, s.color + 3 * id, s.normal + 3 * id, x, y, s.near,
                      s.far, k == medians[i], record);
      }
    }
  }
}

// ---- 8 pixels at a time (float32) -------------------------------------------
// A visit evaluates one surfel at 8 pixels of the tile, given as two windows
// of 4 consecutive pixels of a row (lanes 0-3 and 4-7; the two windows may lie
// in one row or in two).  For each surfel the tile loops first find its
// candidate pixels (candidate_rows: a superset of those it contributes to),
// cover each row's candidates with windows, and pair the windows up, so that
// small footprints (a few pixels wide, the common case in trained scenes) fill
// the lanes instead of leaving most of a fixed 8-pixel half-row idle.
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

const VInt kLaneIndex(i32x8{0, 1, 2, 3, 4, 5, 6, 7});

// Everything the SIMD tile loops read about one surfel, packed in 96 bytes:
// the lists visit surfels in depth order, i.e. at random addresses, so one
// contiguous record (prefetched a few list entries ahead) replaces six
// scattered reads.
struct alignas(32) PackedSurfel {
  SurfelParams<float> params;
  PixelRect rect;
  float color[3], normal[3];
  float rho_cut;  // RowSpans::rho_cut(opacity)
  float pad;
};
static_assert(sizeof(PackedSurfel) == 96, "PackedSurfel layout");

void pack_surfels(const SurfelArrays<float>& s, PackedSurfel* packed) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < s.num_surfels; ++i) {
    PackedSurfel& p = packed[i];
    p.rect = load_pixel_rect(s.pixel_rect, i);
    if (p.rect.x1 <= p.rect.x0 || p.rect.y1 <= p.rect.y0) continue;  // never listed
    load_surfel(s.Tuvw, s.center, s.opacity, i, p.params);
    for (int k = 0; k < 3; ++k) p.color[k] = s.color[3 * i + k], p.normal[k] = s.normal[3 * i + k];
    p.rho_cut = float(RowSpans<float>::rho_cut(double(s.opacity[i])));
  }
}

constexpr int kPrefetchAhead = 4;

inline void prefetch_surfel(const PackedSurfel* packed, const int32_t* list, int32_t k,
                            int32_t count) {
  if (k + kPrefetchAhead < count) {
    const char* p = reinterpret_cast<const char*>(packed + list[k + kPrefetchAhead]);
    __builtin_prefetch(p);
    __builtin_prefetch(p + 64);
  }
}

// Lanes of half-row `gx` (pixels x_start .. x_start + 7) inside [x0, x1).
inline VMask span_lanes(int x_start, int x0, int x1) {
  const VInt x = VInt(kLaneIndex.v + x_start);
  return mask_and(mask_not(x < VInt(x0)), x < VInt(x1));
}

// Below this q2^2 (a normal float32) the 3D test's operands may be denormal,
// with too few bits for the candidate test's margin: such lanes are kept.
constexpr float kTinyQ2Q2 = 1e-36f;

// The candidate pixels of surfel `ps` in rectangle r (image pixels, inside the
// tile), as one bit mask per tile row: rows[y] bit x for tile-local (x, y).
// A candidate passes footprint()'s test with the surfel's own cutoff rho_cut
// = 2 ln(255 opacity) + 0.05 instead of kRhoCutoff.  footprint() computes the
// same bits as inside intersect(), and a contributing pixel has alpha >=
// kAlphaMin, i.e. rho <= 2 ln(255 opacity) (+ float32 rounding of exp, ~1e-7
// relative), while rho = u^2 + v^2 differs from qq / q2q2 by a few ulps; the
// 0.05 margin (>= 0.45 % of any cutoff) covers both.  So every pixel the
// surfel contributes to is a candidate, and skipping the others is exact.
inline void candidate_rows(const PackedSurfel& ps, const PixelRect& r, const TileWindow& win,
                           uint32_t* rows) {
  // footprint()'s planes, split: the columns' once per half-row position, the
  // row's once per row (in scalar float, the lanes' very operations)
  Hit<VFloat> columns[kTileSize / kLanes];
  VMask in_rect[kTileSize / kLanes];
  bool used[kTileSize / kLanes];
  for (int half = 0; half < kTileSize / kLanes; ++half) {
    const int xs = win.x0 + half * kLanes;
    used[half] = xs < r.x1 && xs + kLanes > r.x0;
    if (!used[half]) continue;
    column_plane(ps.params, to_float(VInt(kLaneIndex.v + xs)) + 0.5f, columns[half]);
    in_rect[half] = span_lanes(xs, r.x0, r.x1);
  }
  Hit<VFloat> h;
  Hit<float> row;
  Footprint<VFloat> f;
  for (int py = r.y0; py < r.y1; ++py) {
    row_plane(ps.params, float(py) + 0.5f, row);
    uint32_t bits = 0;
    for (int half = 0; half < kTileSize / kLanes; ++half) {
      if (!used[half]) continue;
      for (int k = 0; k < 3; ++k) h.hx[k] = columns[half].hx[k], h.hy[k] = VFloat(row.hy[k]);
      h.d[0] = columns[half].d[0];
      h.d[1] = VFloat(row.d[1]);
      VMask m = plane_footprint(ps.rho_cut, h, f);
      m = mask_or(m, mask_and(mask_not(h.lowpass), f.q2q2 < kTinyQ2Q2));
      bits |= lane_bits(mask_and(m, in_rect[half])) << (half * kLanes);
    }
    rows[py - win.y0] = bits;
  }
}

}  // namespace

// Not in the anonymous namespace: target_clones needs external linkage.
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void forward_tile_simd(
    const SurfelArrays<float>& s, const PackedSurfel* packed, const TileBins& bins, int tile,
    const ForwardOutputs<float>& out) {
  const TileWindow win(tile, bins.tiles_x, s.width, s.height);
  const int64_t begin = bins.tile_offsets[tile];
  const int32_t count = static_cast<int32_t>(bins.tile_offsets[tile + 1] - begin);
  const int32_t* list = bins.point_list + begin;
  ForwardTileState st;
  st.init();
  uint32_t done[kTileSize + 1] = {};  // per row, bit x: that pixel is finished
  int active = (win.x1 - win.x0) * (win.y1 - win.y0);
  uint32_t rows[kTileSize];
  Window windows[kPixels / kWindow];
  Hit<VFloat> h;
  PixelState<VFloat> p;
  for (int32_t k = 0; k < count && active > 0; ++k) {
    prefetch_surfel(packed, list, k, count);
    const PackedSurfel& ps = packed[list[k]];
    const PixelRect r = win.clip(ps.rect);
    if (r.x1 <= r.x0 || r.y1 <= r.y0) continue;
    candidate_rows(ps, r, win, rows);
    const int ly0 = r.y0 - win.y0, ly1 = r.y1 - win.y0;
    for (int y = ly0; y < ly1; ++y) rows[y] &= ~done[y];
    const int n = cover_rows(rows, ly0, ly1, windows);
    const SurfelParams<float>& sp = ps.params;
    for (int j = 0; j < n; j += 2) {
      const Window& a = windows[j];
      const Window b = j + 1 < n ? windows[j + 1] : spare_window();
      const WindowPair w(a, b, win);
      intersect(sp, w.x, w.y, s.near, h);
      const VMask go = mask_and(w.lanes, h.contributes);
      if (!any_lane(go)) continue;
      st.load(w.ia, w.ib, p);
      const VMask finished = blend_lanes(p, h, go, ps.color, ps.normal, s.near, s.far, k);
      st.store(w.ia, w.ib, p);
      if (any_lane(finished)) {
        const uint32_t f = lane_bits(finished);
        done[a.y] |= (f & 0xFu) << a.x;
        done[b.y] |= (f >> kWindow) << b.x;
        active -= __builtin_popcount(f);
      }
    }
  }
  for (int py = win.y0; py < win.y1; ++py)
    for (int px = win.x0; px < win.x1; ++px)
      store_pixel(st.pixel(state_index(px - win.x0, py - win.y0)), int64_t(py) * s.width + px, out);
}

namespace {

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
  int32_t load_tile(const SurfelArrays<float>& s, const TileWindow& win, const int32_t* end_in,
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
        const int64_t pix = int64_t(py) * s.width + px;
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

}  // namespace

__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void backward_tile_simd(
    const SurfelArrays<float>& s, const PackedSurfel* packed, const TileBins& bins, int tile,
    const int32_t* end, const int32_t* median_index, const float* transmittance,
    const float* totals, const UpstreamGrads<float>& up, float* records) {
  const TileWindow win(tile, bins.tiles_x, s.width, s.height);
  const int32_t* list = bins.point_list + bins.tile_offsets[tile];
  BackwardTileState st;
  const int32_t max_end = st.load_tile(s, win, end, median_index, transmittance, totals, up);
  uint32_t rows[kTileSize];
  Window windows[kPixels / kWindow];
  Hit<VFloat> h;
  PixelGrad<VFloat> g;
  BackwardState<VFloat> b;
  VFloat acc[kGradSize];
  for (int32_t k = max_end - 1; k >= 0; --k) {
    if (k >= kPrefetchAhead) __builtin_prefetch(packed + list[k - kPrefetchAhead]);
    const PackedSurfel& ps = packed[list[k]];
    const PixelRect r = win.clip(ps.rect);
    if (r.x1 <= r.x0 || r.y1 <= r.y0) continue;
    candidate_rows(ps, r, win, rows);
    // only the pixels that blended list position k (k < their end)
    const int ly0 = r.y0 - win.y0, ly1 = r.y1 - win.y0;
    for (int y = ly0; y < ly1; ++y) {
      if (!rows[y]) continue;
      const int32_t* e = st.end + state_index(0, y);
      rows[y] &= lane_bits(VInt(k) < load8(e)) | lane_bits(VInt(k) < load8(e + kLanes)) << kLanes;
    }
    const int n = cover_rows(rows, ly0, ly1, windows);
    const SurfelParams<float>& sp = ps.params;
    bool touched = false;
    for (int j = 0; j < n; j += 2) {
      const Window& wa = windows[j];
      const Window wb = j + 1 < n ? windows[j + 1] : spare_window();
      const WindowPair w(wa, wb, win);
      intersect(sp, w.x, w.y, s.near, h);
      const VMask go = mask_and(w.lanes, h.contributes);
      if (!any_lane(go)) continue;
      if (!touched) {
        for (auto& a : acc) a = VFloat(0.0f);
        touched = true;
      }
      st.load(w.ia, w.ib, g, b);
      const VMask is_median =
          mask_and(go, load_halves(st.median_index + w.ia, st.median_index + w.ib) == k);
      backward_lanes(b, g, sp, h, go, ps.color, ps.normal, w.x, w.y, s.near, s.far, is_median, acc);
      store_halves(st.T + w.ia, st.T + w.ib, b.transmittance);
      store_halves(st.dL_dT + w.ia, st.dL_dT + w.ib, b.last_dL_dT);
    }
    if (touched) {
      float* record = records + int64_t(k) * kGradSize;
      for (int j = 0; j < kGradSize; ++j) record[j] = lane_sum(acc[j]);
    }
  }
}

namespace {

// Tiles ordered by decreasing list length, so that dynamic scheduling starts
// the expensive tiles first and the threads finish together.
template <typename T>
constexpr bool kHasSimd = false;
template <>
constexpr bool kHasSimd<float> = true;

}  // namespace

template <typename T>
int64_t packed_surfel_bytes(int64_t num_surfels) {
  return kHasSimd<T> && g_kernel_mode == kModeSimd ? num_surfels * int64_t(sizeof(PackedSurfel))
                                                   : 0;
}

template <typename T>
void forward_cpu(const SurfelArrays<T>& s, const TileBins& bins, const ForwardOutputs<T>& out,
                 uint8_t* packed_out) {
  const std::vector<int> order = tiles_by_cost(bins);
  const int num_tiles = static_cast<int>(order.size());
  const int mode = g_kernel_mode;
  // The packed records go to packed_out (kept for the backward pass) when given.
  ScratchArray<PackedSurfel> own(kHasSimd<T> && mode == kModeSimd && !packed_out ? s.num_surfels
                                                                                 : 0);
  PackedSurfel* packed = reinterpret_cast<PackedSurfel*>(packed_out);
  if constexpr (kHasSimd<T>) {
    if (mode == kModeSimd) {
      if (!packed) packed = own.data();
      pack_surfels(s, packed);
    }
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int t = 0; t < num_tiles; ++t) {
    const int tile = order[t];
    if constexpr (kHasSimd<T>) {
      if (mode == kModeSimd) {
        forward_tile_simd(s, packed, bins, tile, out);
        continue;
      }
    }
    forward_tile_scalar(s, bins, tile, out, mode != kModeReference);
  }
}

template <typename T>
void backward_cpu(const SurfelArrays<T>& s, const TileBins& bins, const int32_t* end,
                  const int32_t* median_index, const T* transmittance, const T* totals,
                  const UpstreamGrads<T>& up, T* v_surfels /* [N, kGradSize] */,
                  const uint8_t* packed_in) {
  const int mode = g_kernel_mode;
  // The forward pass's packed records when it kept them, else packed here.
  ScratchArray<PackedSurfel> own(kHasSimd<T> && mode == kModeSimd && !packed_in ? s.num_surfels
                                                                                : 0);
  const PackedSurfel* packed = reinterpret_cast<const PackedSurfel*>(packed_in);
  if constexpr (kHasSimd<T>) {
    if (mode == kModeSimd && !packed) {
      pack_surfels(s, own.data());
      packed = own.data();
    }
  }
  tiles::backward_over_tiles<kGradSize>(
      bins, s.width, s.height, end, s.num_surfels,
      [&](int tile, T* tile_records) {
        if constexpr (kHasSimd<T>) {
          if (mode == kModeSimd) {
            backward_tile_simd(s, packed, bins, tile, end, median_index, transmittance, totals, up,
                               tile_records);
            return;
          }
        }
        backward_tile_scalar(s, bins, tile, end, median_index, transmittance, totals, up,
                             tile_records, mode != kModeReference);
      },
      v_surfels);
}

#define SPLAT_INSTANTIATE(T)                                                                      \
  template void bin_tiles_cpu<T>(int64_t, const T*, const int32_t*, int, int,                     \
                                 std::vector<int64_t>&, const std::function<int32_t*(int64_t)>&); \
  template int64_t packed_surfel_bytes<T>(int64_t);                                               \
  template void forward_cpu<T>(const SurfelArrays<T>&, const TileBins&, const ForwardOutputs<T>&, \
                               uint8_t*);                                                         \
  template void backward_cpu<T>(const SurfelArrays<T>&, const TileBins&, const int32_t*,          \
                                const int32_t*, const T*, const T*, const UpstreamGrads<T>&, T*,  \
                                const uint8_t*);
SPLAT_INSTANTIATE(float)
SPLAT_INSTANTIATE(double)
#undef SPLAT_INSTANTIATE

}  // namespace splat
