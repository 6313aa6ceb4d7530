// CPU kernels for 3D Gaussians: the 3D Gaussian policy of the tile loops
// (cpu/tile_loop.h, shared with the surfels), in float32 or float64.  Same
// tiles, list order, stopping rule, saved state and kernel modes as the
// surfel kernels, so the forward outputs and the backward walk mean the same
// thing for both primitives.  Every mode gives bitwise the same outputs and
// gradients: the SIMD backward adds its lanes' gradients to a Gaussian's
// record one lane at a time, in the scalar loop's pixel order.
#include "gaussians_cpu.h"

#include <algorithm>
#include <cmath>

#include "../core.h"
#include "rasterize_cpu.h"
#include "scratch.h"
#include "simd.h"
#include "tile_loop.h"
#include "tiles.h"
#include "dispatch.h"

namespace splat {
namespace {

using tiles::kHasSimd;
using tiles::TileWindow;

// alpha >= kAlphaMin needs o exp(-rho/2) >= 1/255: rho <= 2 ln(255 o); the
// 0.05 margin covers float32 rounding of exp and of the product.  A NaN
// opacity passes the kernel's clamp as kAlphaMax, hence kRhoCutoff.
inline float gaussian_rho_cut(float opacity) {
  const double o = opacity;
  if (std::isnan(o)) return float(kRhoCutoff);
  return o > 0 ? float(std::min(kRhoCutoff, 2.0 * std::log(o / kAlphaMin) + 0.05)) : -1.0f;
}

// Everything the SIMD tile loops read about one Gaussian, in one record.
struct alignas(32) PackedGaussian {
  GaussianParams<float> params;
  PixelRect rect;
  float color[3];
  float rho_cut;  // gaussian_rho_cut(opacity)
};
static_assert(sizeof(PackedGaussian) == 160, "PackedGaussian layout");

void pack_gaussians(const GaussianArrays<float>& g, PackedGaussian* packed) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < g.num_gaussians; ++i) {
    PackedGaussian& p = packed[i];
    p.rect = load_pixel_rect(g.pixel_rect, i);
    if (p.rect.x1 <= p.rect.x0 || p.rect.y1 <= p.rect.y0) continue;  // never listed
    load_gaussian(g.params, i, p.params);
    for (int k = 0; k < 3; ++k) p.color[k] = g.color[3 * i + k];
    p.rho_cut = gaussian_rho_cut(p.params.p[kGaussOpacity]);
  }
}

// The candidate pixels of Gaussian `ps` in rectangle r (inside the tile), as
// one bit mask per tile row (bit x: tile-local column x).  rho is computed
// with intersect_gaussian's very operations (the column terms once per
// half-row, the row's once per row), so it has the same bits, and compared
// with the Gaussian's own cutoff (gaussian_rho_cut): a pixel past it has
// alpha < kAlphaMin, so skipping it is exact.
SPLAT_ALWAYS_INLINE void gaussian_candidate_rows(const PackedGaussian& ps, const PixelRect& r,
                                                 const TileWindow& win, uint32_t* rows) {
  constexpr int kHalves = kTileSize / kLanes;
  const float* q = ps.params.p;
  VFloat xx[kHalves], xy[kHalves];  // q0 d0 d0 and 2 q1 d0, per column
  VMask in_rect[kHalves];
  bool used[kHalves];
  for (int half = 0; half < kHalves; ++half) {
    const int xs = win.x0 + half * kLanes;
    used[half] = xs < r.x1 && xs + kLanes > r.x0;
    if (!used[half]) continue;
    const VFloat d0 = (to_float(VInt(tiles::kLaneIndex.v + xs)) + 0.5f) - q[kGaussCenter];
    xx[half] = q[kGaussConic] * d0 * d0;
    xy[half] = 2.0f * q[kGaussConic + 1] * d0;
    in_rect[half] = tiles::span_lanes(xs, r.x0, r.x1);
  }
  for (int py = r.y0; py < r.y1; ++py) {
    const float d1 = (float(py) + 0.5f) - q[kGaussCenter + 1];
    const float yy = q[kGaussConic + 2] * d1 * d1;
    uint32_t bits = 0;
    for (int half = 0; half < kHalves; ++half) {
      if (!used[half]) continue;
      const VFloat rho = xx[half] + xy[half] * d1 + yy;
      bits |= lane_bits(mask_and(rho < ps.rho_cut, in_rect[half])) << (half * kLanes);
    }
    rows[py - win.y0] = bits;
  }
}

// The 3D Gaussian policy of the tile loops (cpu/tile_loop.h).
struct GaussianTiles {
  template <typename T>
  using Arrays = GaussianArrays<T>;
  template <typename T>
  using Params = GaussianParams<T>;
  template <typename V>
  using Hit = GaussianHit<V>;
  using Packed = PackedGaussian;
  static constexpr int kRecord = kGaussGradSize;

  // Row spans: the whole rectangle row.
  template <typename T>
  struct Rows {
    explicit Rows(const GaussianParams<T>&) {}
    void clip_row(int, int&, int&) const {}
  };

  template <typename T>
  static int64_t count(const GaussianArrays<T>& g) {
    return g.num_gaussians;
  }
  template <typename T>
  static void load(const GaussianArrays<T>& g, int32_t id, GaussianParams<T>& gp) {
    load_gaussian(g.params, id, gp);
  }
  // Blends Gaussian `id` (list position k) into the pixel at centre (x, y);
  // returns whether the pixel is finished.
  template <typename T>
  static bool blend(PixelState<T>& p, const GaussianParams<T>& gp, const GaussianArrays<T>& g,
                    int32_t id, T x, T y, int32_t k) {
    GaussianHit<T> h;
    intersect_gaussian(gp, x, y, g.near, h);
    if (!h.contributes) return false;
    return blend_lanes<T>(p, h, true, g.color + 3 * id, h.normal, g.near, g.far, k);
  }
  template <typename T>
  static void backward(BackwardState<T>& st, const PixelGrad<T>& grad, const GaussianParams<T>& gp,
                       const GaussianArrays<T>& g, int32_t id, T x, T y, bool is_median,
                       T* record) {
    GaussianHit<T> h;
    intersect_gaussian(gp, x, y, g.near, h);
    if (!h.contributes) return;
    backward_gaussian_step(st, grad, gp, h, g.color + 3 * id, g.near, g.far, is_median, record);
  }

  static PixelRect rect(const PackedGaussian& ps) { return ps.rect; }
  SPLAT_ALWAYS_INLINE static void candidate_rows(const PackedGaussian& ps, const PixelRect& r,
                                                 const TileWindow& win, uint32_t* rows) {
    gaussian_candidate_rows(ps, r, win, rows);
  }
  SPLAT_ALWAYS_INLINE static void intersect(const PackedGaussian& ps, VFloat x, VFloat y,
                                            float near, GaussianHit<VFloat>& h) {
    intersect_gaussian(ps.params, x, y, near, h);
  }
  static const float* color(const PackedGaussian& ps) { return ps.color; }
  static const VFloat* normal(const PackedGaussian&, const GaussianHit<VFloat>& h) {
    return h.normal;
  }

  // The lanes' gradients are computed together and added to the record one
  // lane at a time, lane 0 first: the windows' pixel order, the scalar loop's
  // order of additions, so the record has the scalar loop's bits.  The record
  // is held in registers, 8 entries a vector, and each visit's gradients are
  // transposed (lane l's entries into vectors) so that adding one lane's
  // gradients takes 4 vector additions instead of 30 scalar ones.
  struct Accumulator {
    static constexpr int kBlocks = (kGaussGradSize + kLanes - 1) / kLanes;
    VFloat sum[kBlocks];  // record entries 8 b .. 8 b + 7 in sum[b]
    SPLAT_ALWAYS_INLINE void begin() {
      for (auto& v : sum) v = VFloat(0.0f);  // the zeroed record
    }
    SPLAT_ALWAYS_INLINE void visit(BackwardState<VFloat>& b, const PixelGrad<VFloat>& g,
                                   const PackedGaussian& ps, const GaussianHit<VFloat>& h, VMask go,
                                   VFloat, VFloat, float near, float far, VMask is_median, float*) {
      VFloat c[kBlocks * kLanes];
      gaussian_grad_lanes(b, g, ps.params, h, go, ps.color, near, far, is_median, c);
      for (int j = kGaussGradSize; j < kBlocks * kLanes; ++j) c[j] = VFloat(0.0f);
      for (int blk = 0; blk < kBlocks; ++blk) transpose8(c + blk * kLanes);
      for (uint32_t m = lane_bits(go); m; m &= m - 1) {
        const int l = __builtin_ctz(m);
        for (int blk = 0; blk < kBlocks; ++blk) sum[blk] += c[blk * kLanes + l];
      }
    }
    SPLAT_ALWAYS_INLINE void finish(float* record) const {
      alignas(32) float all[kBlocks * kLanes];
      for (int blk = 0; blk < kBlocks; ++blk) store8(all + blk * kLanes, sum[blk]);
      std::copy(all, all + kGaussGradSize, record);
    }
  };
};

}  // namespace

// Not in the anonymous namespace: target_clones needs external linkage.
SPLAT_CLONES_V4 void forward_tile_simd_gaussians(const GaussianArrays<float>& g,
                                                 const PackedGaussian* packed, const TileBins& bins,
                                                 int tile, const ForwardOutputs<float>& out) {
  tiles::forward_tile_simd<GaussianTiles>(g, packed, bins, tile, out);
}

SPLAT_CLONES_V4 void backward_tile_simd_gaussians(const GaussianArrays<float>& g,
                                                  const PackedGaussian* packed,
                                                  const TileBins& bins, int tile,
                                                  const int32_t* end, const int32_t* median_index,
                                                  const float* transmittance, const float* totals,
                                                  const UpstreamGrads<float>& up, float* records) {
  tiles::backward_tile_simd<GaussianTiles>(g, packed, bins, tile, end, median_index, transmittance,
                                           totals, up, records);
}

template <typename T>
void forward_gaussians_cpu(const GaussianArrays<T>& g, const TileBins& bins,
                           const ForwardOutputs<T>& out) {
  const int mode = cpu_kernel_mode();
  const bool simd = kHasSimd<T> && mode == kModeSimd;
  ScratchArray<PackedGaussian> packed(simd ? g.num_gaussians : 0);
  if constexpr (kHasSimd<T>) {
    if (simd) pack_gaussians(g, packed.data());
  }
  tiles::forward_tiles<GaussianTiles>(g, bins, out, mode, packed.data(),
                                      [&](const PackedGaussian* p, int tile) {
                                        if constexpr (kHasSimd<T>)
                                          forward_tile_simd_gaussians(g, p, bins, tile, out);
                                      });
}

template <typename T>
void backward_gaussians_cpu(const GaussianArrays<T>& g, const TileBins& bins, const int32_t* end,
                            const int32_t* median_index, const T* transmittance, const T* totals,
                            const UpstreamGrads<T>& up, T* v_gaussians) {
  const int mode = cpu_kernel_mode();
  const bool simd = kHasSimd<T> && mode == kModeSimd;
  ScratchArray<PackedGaussian> packed(simd ? g.num_gaussians : 0);
  if constexpr (kHasSimd<T>) {
    if (simd) pack_gaussians(g, packed.data());
  }
  tiles::backward_tiles<GaussianTiles>(
      g, bins, end, median_index, transmittance, totals, up, v_gaussians, mode, packed.data(),
      [&](const PackedGaussian* p, int tile, T* records) {
        if constexpr (kHasSimd<T>)
          backward_tile_simd_gaussians(g, p, bins, tile, end, median_index, transmittance, totals,
                                       up, records);
      });
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
