// CUDA backend launchers: raw device pointers and a cudaStream_t only, no torch
// headers, so every .cu file compiles with a plain `nvcc -c`.  The host call
// sequence (host_sequence.h) allocates all memory and calls these in order:
//
//   binning (binning.cu), two phases because the number of (tile, surfel)
//   pairs P is only known after a scan:
//     1. bin_count:  sort the surfels front to back, count the tiles each one
//                    touches in that order, inclusive-scan the counts, and read
//                    P back to the host (the ONE host sync of the forward pass).
//     2. bin_pairs:  emit one (tile id, surfel id) pair per touched tile in
//                    depth order, stable-sort the pairs by tile id, and derive
//                    tile_offsets; the sorted ids are written to point_list.
//   render (forward.cu):   launch_forward
//   gradients (backward.cu): launch_backward (the gradient must be zeroed first)
//
// Binning is the same for surfels and 3D Gaussians (it reads only depth and
// pixel_rect); the render and gradient launchers have one overload per
// primitive (SurfelArrays, GaussianArrays).
//
// Every launcher enqueues work on `stream` and returns the first CUDA error it
// saw (cudaSuccess otherwise); only bin_count synchronises with the host.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../raster_args.h"

namespace splat {
namespace gpu {  // not "cuda": that would shadow libcu++'s ::cuda inside splat

// Threads per tile block (one per pixel) and surfels per shared-memory batch
// (3D Gaussians: gaussian_batch.cuh).
constexpr int kBlockThreads = 16 * 16;
constexpr int kBatchSize = kBlockThreads;

// ---- binning, phase 1 ------------------------------------------------------
// Bytes of the phase-1 workspace for n surfels (depth keys, ids, counts, their
// scan and CUB's temporary storage).  The workspace must stay alive (and
// untouched) until bin_pairs has run: phase 2 reads the sorted ids and scan.
template <typename T>
size_t bin_count_workspace_bytes(int64_t n);

// Sorts the n surfels by depth (stable, so ties keep index order), counts the
// tiles each visible one touches (tiles_of(pixel_rect) clamped to the tile grid), scans
// the counts and copies the total number of pairs into *num_pairs (host).
// Requires 0 < n < 2^31.  Synchronises `stream` once, for *num_pairs.
template <typename T>
cudaError_t bin_count(const T* depth, const int32_t* pixel_rect, int64_t n, int tiles_x,
                      int tiles_y, void* workspace, size_t workspace_bytes, int64_t* num_pairs,
                      cudaStream_t stream);

// ---- binning, phase 2 ------------------------------------------------------
// Bytes of the phase-2 workspace for num_pairs pairs on a grid of num_tiles.
size_t bin_pairs_workspace_bytes(int64_t num_pairs, int num_tiles);

// Fills point_list [num_pairs] (surfel ids, per tile front to back) and
// tile_offsets [tiles_x * tiles_y + 1].  `count_workspace` is the phase-1
// workspace of bin_count (same n).  num_pairs may be 0 (offsets all 0); it
// must be < 2^31.
template <typename T>
cudaError_t bin_pairs(const int32_t* pixel_rect, int64_t n, int tiles_x, int tiles_y,
                      const void* count_workspace, int64_t num_pairs, void* workspace,
                      size_t workspace_bytes, int32_t* point_list, int64_t* tile_offsets,
                      cudaStream_t stream);

// ---- render ------------------------------------------------------------------
// One 16x16 block per tile; writes every output for every pixel (tiles with an
// empty list get the background state).  No host sync.
template <typename T>
cudaError_t launch_forward(const SurfelArrays<T>& s, const TileBins& bins,
                           const ForwardOutputs<T>& out, cudaStream_t stream);
template <typename T>
cudaError_t launch_forward(const GaussianArrays<T>& g, const TileBins& bins,
                           const ForwardOutputs<T>& out, cudaStream_t stream);

// ---- gradients ---------------------------------------------------------------
// Accumulates (atomically) dL/d(per-primitive record) into v_surfels
// [N, kGradSize] or v_gaussians [N, kGaussGradSize] (core.h), which the
// caller must have zeroed.  No host sync.
template <typename T>
cudaError_t launch_backward(const SurfelArrays<T>& s, const TileBins& bins, const int32_t* end,
                            const int32_t* median_index, const T* transmittance, const T* totals,
                            const UpstreamGrads<T>& up, T* v_surfels, cudaStream_t stream);
template <typename T>
cudaError_t launch_backward(const GaussianArrays<T>& g, const TileBins& bins, const int32_t* end,
                            const int32_t* median_index, const T* transmittance, const T* totals,
                            const UpstreamGrads<T>& up, T* v_gaussians, cudaStream_t stream);

}  // namespace gpu
}  // namespace splat
