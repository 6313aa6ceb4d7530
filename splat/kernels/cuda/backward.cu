// Backward pass: same tiling as forward.cu, each tile's list walked BACK TO
// FRONT, one thread per pixel; a template over the primitive's policy
// (surfel_batch.cuh, gaussian_batch.cuh) like the forward.
//
// Per pixel this is exactly the CPU's loop (backward_cpu, backward_gaussians_cpu):
// from list position end-1 down to 0, re-evaluate, skip non-contributing
// samples, and call core.h's backward step, which peels one primitive off the
// saved final transmittance and carries dL/dT in `last_dL_dT`.
//
// GPU structure:
//   * the block starts at the largest `end` of its pixels (nothing behind it
//     was blended anywhere in the tile) and stages the list in shared-memory
//     batches of P::kBatch, loaded back to front;
//   * a thread whose pixel stopped before list position k (k >= end) skips it;
//   * each pixel's contribution to primitive k is a P::kRecord record held in
//     registers; the 32 lanes of a warp first vote (__any_sync) and skip the
//     surfel entirely when no lane touched it, else they sum their records
//     with a warp reduce-scatter (31 shuffles instead of 5 * kGradSize for a
//     shuffle-down tree) after which lane q holds the warp's total of scalar q,
//     and lanes 0..P::kRecord-1 issue ONE atomicAdd each, all into the one
//     contiguous row of the gradient: one coalesced atomic per warp and
//     primitive (surfels: 18 scalars, 3D Gaussians: 30).
//
// Float atomics make the summation order (and so the last bits) vary from run
// to run; the CPU backend is the deterministic reference.
#include <cstdint>

#include "../core.h"
#include "rasterize_cuda.h"
#include "gaussian_batch.cuh"
#include "surfel_batch.cuh"

namespace splat {
namespace gpu {
namespace {

static_assert(kTileSize * kTileSize == kBlockThreads, "one thread per pixel of a tile");
static_assert(kBlockThreads % 32 == 0, "whole warps only: the warp votes need all 32 lanes");

constexpr unsigned kFullMask = 0xffffffffu;

// Warp reduce-scatter of a 32-slot record (slots >= kGradSize are zero and
// fold away at compile time).  At the step of width `half`, a lane keeps the
// half of its slots whose index has the bit `half` equal to its lane's bit and
// adds the partner's (lane ^ half) copy of that half; after the 5 steps lane l
// holds, in v[0], the sum over the warp of slot l.  All indices are
// compile-time constants, so the record stays in registers.
template <int Half, typename T>
__device__ __forceinline__ void reduce_scatter_step(T (&v)[32], unsigned lane) {
  const bool upper = (lane & Half) != 0;
#pragma unroll
  for (int i = 0; i < Half; ++i) {
    const T send = upper ? v[i] : v[i + Half];
    const T keep = upper ? v[i + Half] : v[i];
    v[i] = keep + __shfl_xor_sync(kFullMask, send, Half);
  }
}

// (One template step per width: a loop over `half` would leave the inner trip
// count non-constant and push the record to local memory.)
template <typename T>
__device__ __forceinline__ T warp_reduce_scatter(T (&v)[32], unsigned lane) {
  reduce_scatter_step<16>(v, lane);
  reduce_scatter_step<8>(v, lane);
  reduce_scatter_step<4>(v, lane);
  reduce_scatter_step<2>(v, lane);
  reduce_scatter_step<1>(v, lane);
  return v[0];
}

// atomicAdd on double is native from sm_60; older targets get the CAS loop.
__device__ __forceinline__ void atomic_add(float* address, float value) {
  atomicAdd(address, value);
}
__device__ __forceinline__ void atomic_add(double* address, double value) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 600
  atomicAdd(address, value);
#else
  unsigned long long* bits = reinterpret_cast<unsigned long long*>(address);
  unsigned long long old = *bits, assumed;
  do {
    assumed = old;
    old = atomicCAS(bits, assumed, __double_as_longlong(value + __longlong_as_double(assumed)));
  } while (assumed != old);
#endif
}

template <typename T, class P>
__global__ void __launch_bounds__(kBlockThreads)
    backward_kernel(const typename P::Arrays s, const TileBins bins,
                    const int32_t* __restrict__ end, const int32_t* __restrict__ median_index,
                    const T* __restrict__ transmittance, const T* __restrict__ totals,
                    const UpstreamGrads<T> up, T* __restrict__ v_params) {
  static_assert(P::kRecord <= 32, "the reduce-scatter gives each lane one scalar of the record");
  __shared__ typename P::Batch batch;
  __shared__ int32_t block_end;

  const int tile = blockIdx.y * bins.tiles_x + blockIdx.x;
  const int tid = threadIdx.y * kTileSize + threadIdx.x;
  const unsigned lane = tid & 31u;
  const int px = blockIdx.x * kTileSize + threadIdx.x;
  const int py = blockIdx.y * kTileSize + threadIdx.y;
  const bool inside = px < s.width && py < s.height;
  const T x = T(px) + T(0.5), y = T(py) + T(0.5);

  const int64_t begin = bins.tile_offsets[tile];
  const int32_t* __restrict__ list = bins.point_list + begin;

  // Per-pixel state; pixels outside the image have pixel_end == 0 and so never
  // contribute, but still load batches and vote.
  PixelGrad<T> g{};
  BackwardState<T> st{};
  int32_t pixel_end = 0, median_k = -1;
  if (inside) {
    const int64_t pix = int64_t(py) * s.width + px;
    load_pixel_grad(up, totals, pix, g);
    st = initial_backward_state(transmittance, up, pix);
    pixel_end = end[pix];
    median_k = median_index[pix];
  }

  // Largest end in the tile: list positions at or past it were blended by no
  // pixel of this tile, so the walk starts there.
  if (tid == 0) block_end = 0;
  __syncthreads();
  if (pixel_end > 0) atomicMax(&block_end, pixel_end);
  __syncthreads();
  const int32_t walk_end = block_end;

  for (int32_t batch_end = walk_end; batch_end > 0; batch_end -= P::kBatch) {
    const int32_t batch_start = batch_end > P::kBatch ? batch_end - P::kBatch : 0;
    __syncthreads();  // every thread is done with the previous batch
    // Slot j holds list position batch_end - 1 - j: back to front.  Threads
    // tid >= P::kBatch get k_load < batch_start and load nothing.
    const int32_t k_load = batch_end - 1 - tid;
    if (k_load >= batch_start) P::store(batch, tid, s, list[k_load]);
    __syncthreads();

    // Block-uniform trip count: every lane reaches the warp votes below.
    const int n_batch = batch_end - batch_start;
    for (int j = 0; j < n_batch; ++j) {
      const int32_t k = batch_end - 1 - j;
      T record[32];
#pragma unroll
      for (int q = 0; q < 32; ++q) record[q] = T(0);
      const bool touched = k < pixel_end && P::in_rect(batch, j, px, py) &&
                           P::backward_at(st, g, batch, j, x, y, s, k == median_k, record);
      // Skip the reduction (and the atomics) when no pixel of this warp
      // blended primitive k, the common case near silhouettes and past `end`.
      if (__any_sync(kFullMask, touched)) {
        const T total = warp_reduce_scatter(record, lane);
        if (lane < static_cast<unsigned>(P::kRecord))
          atomic_add(v_params + int64_t(batch.id[j]) * P::kRecord + lane, total);
      }
    }
  }
}

template <typename T, class P>
cudaError_t launch(const typename P::Arrays& s, const TileBins& bins, const int32_t* end,
                   const int32_t* median_index, const T* transmittance, const T* totals,
                   const UpstreamGrads<T>& up, T* v_params, cudaStream_t stream) {
  if (bins.tiles_x <= 0 || bins.tiles_y <= 0 || P::count(s) <= 0) return cudaSuccess;
  const dim3 grid(bins.tiles_x, bins.tiles_y);
  const dim3 block(kTileSize, kTileSize);
  backward_kernel<T, P>
      <<<grid, block, 0, stream>>>(s, bins, end, median_index, transmittance, totals, up, v_params);
  return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t launch_backward(const SurfelArrays<T>& s, const TileBins& bins, const int32_t* end,
                            const int32_t* median_index, const T* transmittance, const T* totals,
                            const UpstreamGrads<T>& up, T* v_surfels, cudaStream_t stream) {
  return launch<T, SurfelKernel<T>>(s, bins, end, median_index, transmittance, totals, up,
                                    v_surfels, stream);
}

template <typename T>
cudaError_t launch_backward(const GaussianArrays<T>& g, const TileBins& bins, const int32_t* end,
                            const int32_t* median_index, const T* transmittance, const T* totals,
                            const UpstreamGrads<T>& up, T* v_gaussians, cudaStream_t stream) {
  return launch<T, GaussianKernel<T>>(g, bins, end, median_index, transmittance, totals, up,
                                      v_gaussians, stream);
}

#define SPLAT_INSTANTIATE(T, Arrays)                                                         \
  template cudaError_t launch_backward<T>(const Arrays<T>&, const TileBins&, const int32_t*, \
                                          const int32_t*, const T*, const T*,                \
                                          const UpstreamGrads<T>&, T*, cudaStream_t);
SPLAT_INSTANTIATE(float, SurfelArrays)
SPLAT_INSTANTIATE(double, SurfelArrays)
SPLAT_INSTANTIATE(float, GaussianArrays)
SPLAT_INSTANTIATE(double, GaussianArrays)
#undef SPLAT_INSTANTIATE

}  // namespace gpu
}  // namespace splat
