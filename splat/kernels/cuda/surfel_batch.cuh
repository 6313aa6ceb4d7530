// The surfel policy of the tile kernels (forward.cu, backward.cu): its
// shared-memory batch and its per-pixel step (device code only; included by
// .cu files, never by the torch glue).  gaussian_batch.cuh is the same for 3D
// Gaussians; the kernels are templates over the two.
//
// A tile block walks its surfel list in batches of kBatchSize: every thread
// loads ONE surfel of the batch into shared memory, then every thread reads
// every surfel of the batch from there.  So each surfel's parameters are read
// from global memory once per tile instead of once per pixel (256x fewer
// gathers), and the per-pixel loop reads shared memory at one address per warp
// (a broadcast, no bank conflicts).  The layout is structure-of-arrays so that
// the cooperative stores (thread t writes slot t of each array) are
// conflict-free too.
#pragma once

#include <cstdint>

#include "../core.h"
#include "../raster_args.h"
#include "rasterize_cuda.h"

namespace splat {
namespace gpu {

template <typename T>
struct SurfelBatch {
  T tuvw[9][kBatchSize];  // rows Tu, Tv, Tw of M
  T center[2][kBatchSize];
  T opacity[kBatchSize];
  T color[kChannels][kBatchSize];
  T normal[3][kBatchSize];
  int32_t id[kBatchSize];
  int32_t rect[4][kBatchSize];  // pixel rectangle x0, y0, x1, y1 (exclusive)
};

// Gathers surfel `id` from global memory into slot `slot` (read-only path).
template <typename T>
__device__ __forceinline__ void store_surfel(SurfelBatch<T>& b, int slot, const SurfelArrays<T>& s,
                                             int32_t id) {
  const int64_t i = id;
#pragma unroll
  for (int k = 0; k < 9; ++k) b.tuvw[k][slot] = __ldg(s.Tuvw + i * 9 + k);
#pragma unroll
  for (int k = 0; k < 2; ++k) b.center[k][slot] = __ldg(s.center + i * 2 + k);
  b.opacity[slot] = __ldg(s.opacity + i);
#pragma unroll
  for (int c = 0; c < kChannels; ++c) b.color[c][slot] = __ldg(s.color + i * kChannels + c);
#pragma unroll
  for (int k = 0; k < 3; ++k) b.normal[k][slot] = __ldg(s.normal + i * 3 + k);
  b.id[slot] = id;
#pragma unroll
  for (int k = 0; k < 4; ++k) b.rect[k][slot] = __ldg(s.pixel_rect + i * 4 + k);
}

// Whether pixel (px, py) lies in the surfel's pixel rectangle: the CPU
// evaluates only those pixels, so both backends skip the same ones even if a
// caller passes a rectangle tighter than the footprint.
template <typename T>
__device__ __forceinline__ bool in_rect(const SurfelBatch<T>& b, int slot, int px, int py) {
  return px >= b.rect[0][slot] && py >= b.rect[1][slot] && px < b.rect[2][slot] &&
         py < b.rect[3][slot];
}

// Reads slot `slot` into the SurfelParams that core.h's intersect takes.
template <typename T>
__device__ __forceinline__ void load_params(const SurfelBatch<T>& b, int slot,
                                            SurfelParams<T>& sp) {
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    sp.Tu[k] = b.tuvw[k][slot];
    sp.Tv[k] = b.tuvw[3 + k][slot];
    sp.Tw[k] = b.tuvw[6 + k][slot];
  }
  sp.center[0] = b.center[0][slot];
  sp.center[1] = b.center[1][slot];
  sp.opacity = b.opacity[slot];
}

// Colour and normal of slot `slot` as the contiguous triples blend() and
// backward_step() take.
template <typename T>
__device__ __forceinline__ void load_color_normal(const SurfelBatch<T>& b, int slot,
                                                  T (&color)[kChannels], T (&normal)[3]) {
#pragma unroll
  for (int c = 0; c < kChannels; ++c) color[c] = b.color[c][slot];
#pragma unroll
  for (int k = 0; k < 3; ++k) normal[k] = b.normal[k][slot];
}

// The policy the tile kernels take: what a batch holds, how one primitive of
// it is evaluated at a pixel and blended (forward) or differentiated
// (backward).  Each step is the CPU backend's (cpu/rasterize_cpu.cpp) call
// for call, so both backends take the same decisions.
template <typename T>
struct SurfelKernel {
  using Arrays = SurfelArrays<T>;
  using Batch = SurfelBatch<T>;
  static constexpr int kBatch = kBatchSize;  // primitives per shared-memory batch
  static constexpr int kRecord = kGradSize;  // gradient scalars per primitive

  __host__ __device__ static int64_t count(const Arrays& s) { return s.num_surfels; }

  __device__ __forceinline__ static void store(Batch& b, int slot, const Arrays& s, int32_t id) {
    store_surfel(b, slot, s, id);
  }

  __device__ __forceinline__ static bool in_rect(const Batch& b, int slot, int px, int py) {
    return splat::gpu::in_rect(b, slot, px, py);
  }

  // Blends slot `slot` (list position k) into the pixel at centre (x, y).
  // Returns false once the pixel is finished (blend refused).
  __device__ __forceinline__ static bool blend_at(PixelState<T>& p, const Batch& b, int slot, T x,
                                                  T y, const Arrays& s, int32_t k) {
    SurfelParams<T> sp;
    load_params(b, slot, sp);
    Hit<T> h;
    intersect(sp, x, y, s.near, h);
    if (!h.contributes) return true;
    T color[kChannels], normal[3];
    load_color_normal(b, slot, color, normal);
    return blend(p, h, color, normal, s.near, s.far, k);
  }

  // Differentiates slot `slot` at the pixel into `record`; returns whether
  // the sample contributed (false: record untouched).
  __device__ __forceinline__ static bool backward_at(BackwardState<T>& st, const PixelGrad<T>& g,
                                                     const Batch& b, int slot, T x, T y,
                                                     const Arrays& s, bool is_median, T* record) {
    SurfelParams<T> sp;
    load_params(b, slot, sp);
    Hit<T> h;
    intersect(sp, x, y, s.near, h);
    if (!h.contributes) return false;
    T color[kChannels], normal[3];
    load_color_normal(b, slot, color, normal);
    backward_step(st, g, sp, h, color, normal, x, y, s.near, s.far, is_median, record);
    return true;
  }
};

}  // namespace gpu
}  // namespace splat
