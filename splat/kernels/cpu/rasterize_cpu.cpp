// CPU backend for surfels: binning (shared with 3D Gaussians) and the surfel
// policy of the tile loops (cpu/tile_loop.h, written once for both
// primitives), with OpenMP over tiles.  The per-pixel maths comes from core.h.
//
// Three kernel modes (set_cpu_kernel_mode; the default is the fastest):
//   kModeReference  one pixel at a time over each primitive's whole pixel rectangle;
//   kModeScalar     one pixel at a time over the exact per-row spans of each
//                   surfel's footprint (RowSpans below; 3D Gaussians: the
//                   whole rectangle);
//   kModeSimd       float32: 8 pixels at a time (cpu/simd.h), two windows of
//                   4 over each primitive's candidate pixels (candidate_rows),
//                   compiled for AVX-512, AVX2 and baseline x86-64 and chosen
//                   at run time; float64 falls back to kModeScalar.
// Every mode computes, for each pixel, exactly the operations of core.h in the
// same order, so the forward outputs are bitwise equal across modes.  Backward
// gradients are bitwise equal between the two scalar modes; the surfels' SIMD
// mode sums the eight lanes' contributions to a surfel in another order
// (float32 noise), the 3D Gaussians' adds them in the scalar order (bitwise).
//
// Determinism: the backward pass never adds two threads' results into one
// place.  Each tile owns one gradient record per list position it blended
// (below the tile's largest `end`), filled by the one thread that renders the
// tile; records are then reduced into primitives in tile order, each thread
// owning a range of primitives.  Gradients are therefore bitwise identical
// across runs and thread counts, and the memory is bounded by the blended work.
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
#include "tile_loop.h"
#include "tiles.h"
#include "dispatch.h"

namespace splat {

using tiles::kHasSimd;
using tiles::kLaneIndex;
using tiles::max_threads;
using tiles::span_lanes;
using tiles::ThreadChunk;
using tiles::TileWindow;

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

// The surfel policy of the tile loops (cpu/tile_loop.h).
struct SurfelTiles {
  template <typename T>
  using Arrays = SurfelArrays<T>;
  template <typename T>
  using Params = SurfelParams<T>;
  template <typename T>
  using Rows = RowSpans<T>;
  template <typename V>
  using Hit = splat::Hit<V>;
  using Packed = PackedSurfel;
  static constexpr int kRecord = kGradSize;

  template <typename T>
  static int64_t count(const SurfelArrays<T>& s) {
    return s.num_surfels;
  }
  template <typename T>
  static void load(const SurfelArrays<T>& s, int32_t id, SurfelParams<T>& sp) {
    load_surfel(s.Tuvw, s.center, s.opacity, id, sp);
  }
  // Blends surfel `id` (list position k) into the pixel at centre (x, y);
  // returns whether the pixel is finished.
  template <typename T>
  static bool blend(PixelState<T>& p, const SurfelParams<T>& sp, const SurfelArrays<T>& s,
                    int32_t id, T x, T y, int32_t k) {
    Hit<T> h;
    splat::intersect(sp, x, y, s.near, h);
    if (!h.contributes) return false;
    return !splat::blend(p, h, s.color + 3 * id, s.normal + 3 * id, s.near, s.far, k);
  }
  template <typename T>
  static void backward(BackwardState<T>& st, const PixelGrad<T>& g, const SurfelParams<T>& sp,
                       const SurfelArrays<T>& s, int32_t id, T x, T y, bool is_median, T* record) {
    Hit<T> h;
    splat::intersect(sp, x, y, s.near, h);
    if (!h.contributes) return;
    backward_step(st, g, sp, h, s.color + 3 * id, s.normal + 3 * id, x, y, s.near, s.far, is_median,
                  record);
  }

  static PixelRect rect(const PackedSurfel& ps) { return ps.rect; }
  SPLAT_ALWAYS_INLINE static void candidate_rows(const PackedSurfel& ps, const PixelRect& r,
                                                 const TileWindow& win, uint32_t* rows) {
    splat::candidate_rows(ps, r, win, rows);
  }
  SPLAT_ALWAYS_INLINE static void intersect(const PackedSurfel& ps, VFloat x, VFloat y, float near,
                                            Hit<VFloat>& h) {
    splat::intersect(ps.params, x, y, near, h);
  }
  static const float* color(const PackedSurfel& ps) { return ps.color; }
  static const float* normal(const PackedSurfel& ps, const Hit<VFloat>&) { return ps.normal; }

  // The SIMD backward sums each lane's gradients in its own accumulator and
  // the 8 lanes at the end (lane_sum): float32 noise against the scalar loops.
  struct Accumulator {
    VFloat acc[kGradSize];
    SPLAT_ALWAYS_INLINE void begin() {
      for (auto& a : acc) a = VFloat(0.0f);
    }
    SPLAT_ALWAYS_INLINE void visit(BackwardState<VFloat>& b, const PixelGrad<VFloat>& g,
                                   const PackedSurfel& ps, const Hit<VFloat>& h, VMask go, VFloat x,
                                   VFloat y, float near, float far, VMask is_median, float*) {
      backward_lanes(b, g, ps.params, h, go, ps.color, ps.normal, x, y, near, far, is_median, acc);
    }
    SPLAT_ALWAYS_INLINE void finish(float* record) const {
      for (int j = 0; j < kGradSize; ++j) record[j] = lane_sum(acc[j]);
    }
  };
};

}  // namespace

// Not in the anonymous namespace: target_clones needs external linkage.
SPLAT_CLONES_V4 void forward_tile_simd_surfels(const SurfelArrays<float>& s,
                                               const PackedSurfel* packed, const TileBins& bins,
                                               int tile, const ForwardOutputs<float>& out) {
  tiles::forward_tile_simd<SurfelTiles>(s, packed, bins, tile, out);
}

SPLAT_CLONES_V4 void backward_tile_simd_surfels(const SurfelArrays<float>& s,
                                                const PackedSurfel* packed, const TileBins& bins,
                                                int tile, const int32_t* end,
                                                const int32_t* median_index,
                                                const float* transmittance, const float* totals,
                                                const UpstreamGrads<float>& up, float* records) {
  tiles::backward_tile_simd<SurfelTiles>(s, packed, bins, tile, end, median_index, transmittance,
                                         totals, up, records);
}

template <typename T>
int64_t packed_surfel_bytes(int64_t num_surfels) {
  return kHasSimd<T> && g_kernel_mode == kModeSimd ? num_surfels * int64_t(sizeof(PackedSurfel))
                                                   : 0;
}

template <typename T>
void forward_cpu(const SurfelArrays<T>& s, const TileBins& bins, const ForwardOutputs<T>& out,
                 uint8_t* packed_out) {
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
  tiles::forward_tiles<SurfelTiles>(s, bins, out, mode, packed,
                                    [&](const PackedSurfel* p, int tile) {
                                      if constexpr (kHasSimd<T>)
                                        forward_tile_simd_surfels(s, p, bins, tile, out);
                                    });
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
  tiles::backward_tiles<SurfelTiles>(
      s, bins, end, median_index, transmittance, totals, up, v_surfels, mode, packed,
      [&](const PackedSurfel* p, int tile, T* records) {
        if constexpr (kHasSimd<T>)
          backward_tile_simd_surfels(s, p, bins, tile, end, median_index, transmittance, totals, up,
                                     records);
      });
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
