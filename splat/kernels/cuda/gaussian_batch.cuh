// The 3D Gaussian policy of the tile kernels (forward.cu, backward.cu): its
// shared-memory batch and its per-pixel step, the twin of surfel_batch.cuh
// (device code only).  The per-pixel maths is core.h's "3D Gaussians",
// shared with cpu/gaussians_cpu.cpp, whose loop this follows call for call.
#pragma once

#include <cstdint>

#include "../core.h"
#include "../raster_args.h"
#include "rasterize_cuda.h"

namespace splat {
namespace gpu {

// Gaussians per shared-memory batch.  A Gaussian takes kGaussParams + 3
// scalars and 5 ints: 140 bytes in float32 (256 of them: 35 KiB) but 260 in
// float64, where 256 would need 65 KiB, over the 48 KiB of static shared
// memory a block may have; so float64 batches hold 128 (33 KiB) and half
// the threads load each batch.
template <typename T>
constexpr int gaussian_batch_size() {
  return sizeof(T) == 8 ? kBlockThreads / 2 : kBlockThreads;
}

template <typename T>
struct GaussianBatch {
  static constexpr int kSize = gaussian_batch_size<T>();
  T params[kGaussParams][kSize];  // structure of arrays: conflict-free stores
  T color[kChannels][kSize];
  int32_t id[kSize];
  int32_t rect[4][kSize];  // pixel rectangle x0, y0, x1, y1 (exclusive)
};

template <typename T>
struct GaussianKernel {
  using Arrays = GaussianArrays<T>;
  using Batch = GaussianBatch<T>;
  static constexpr int kBatch = Batch::kSize;
  static constexpr int kRecord = kGaussGradSize;
  static_assert(kBatch <= kBlockThreads, "each slot of a batch is loaded by one thread");

  __host__ __device__ static int64_t count(const Arrays& g) { return g.num_gaussians; }

  // Gathers Gaussian `id` from global memory into slot `slot` (read-only path).
  __device__ __forceinline__ static void store(Batch& b, int slot, const Arrays& g, int32_t id) {
    const int64_t i = id;
#pragma unroll
    for (int k = 0; k < kGaussParams; ++k)
      b.params[k][slot] = __ldg(g.params + i * kGaussParams + k);
#pragma unroll
    for (int c = 0; c < kChannels; ++c) b.color[c][slot] = __ldg(g.color + i * kChannels + c);
    b.id[slot] = id;
#pragma unroll
    for (int k = 0; k < 4; ++k) b.rect[k][slot] = __ldg(g.pixel_rect + i * 4 + k);
  }

  // As for surfels: only the pixels of the rectangle, the ones the CPU visits.
  __device__ __forceinline__ static bool in_rect(const Batch& b, int slot, int px, int py) {
    return px >= b.rect[0][slot] && py >= b.rect[1][slot] && px < b.rect[2][slot] &&
           py < b.rect[3][slot];
  }

  __device__ __forceinline__ static void load(const Batch& b, int slot, GaussianParams<T>& gp,
                                              T (&color)[kChannels]) {
#pragma unroll
    for (int k = 0; k < kGaussParams; ++k) gp.p[k] = b.params[k][slot];
#pragma unroll
    for (int c = 0; c < kChannels; ++c) color[c] = b.color[c][slot];
  }

  // Blends slot `slot` (list position k) into the pixel at centre (x, y).
  // Returns false once the pixel is finished (blend refused).
  __device__ __forceinline__ static bool blend_at(PixelState<T>& p, const Batch& b, int slot, T x,
                                                  T y, const Arrays& g, int32_t k) {
    GaussianParams<T> gp;
    T color[kChannels];
    load(b, slot, gp, color);
    GaussianHit<T> h;
    intersect_gaussian(gp, x, y, g.near, h);
    if (!h.contributes) return true;
    return blend(p, h, color, h.normal, g.near, g.far, k);
  }

  // Differentiates slot `slot` at the pixel into `record`; returns whether
  // the sample contributed (false: record untouched).
  __device__ __forceinline__ static bool backward_at(BackwardState<T>& st, const PixelGrad<T>& grad,
                                                     const Batch& b, int slot, T x, T y,
                                                     const Arrays& g, bool is_median, T* record) {
    GaussianParams<T> gp;
    T color[kChannels];
    load(b, slot, gp, color);
    GaussianHit<T> h;
    intersect_gaussian(gp, x, y, g.near, h);
    if (!h.contributes) return false;
    backward_gaussian_step(st, grad, gp, h, color, g.near, g.far, is_median, record);
    return true;
  }
};

}  // namespace gpu
}  // namespace splat
