// Shared-memory batch of surfels used by forward.cu and backward.cu (device
// code only; included by .cu files, never by the torch glue).
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
__device__ __forceinline__ void store_surfel(SurfelBatch<T>& b, int slot,
                                             const SurfelArrays<T>& s, int32_t id) {
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

}  // namespace gpu
}  // namespace splat
