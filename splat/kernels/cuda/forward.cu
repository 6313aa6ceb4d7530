// Forward render: one 16x16 thread block per tile, one thread per pixel,
// for surfels and 3D Gaussians alike (the kernel is a template over the
// primitive's policy: surfel_batch.cuh, gaussian_batch.cuh).
//
// Each pixel runs exactly the CPU loop (forward_cpu in cpu/rasterize_cpu.cpp,
// forward_gaussians_cpu in cpu/gaussians_cpu.cpp): for list position
// k = 0, 1, ...: evaluate, skip non-contributing samples, blend until blend()
// refuses.  The per-pixel maths is core.h, shared with the CPU, so both
// backends take the same decisions and save the same state (end and
// median_index as tile-local list positions, final transmittance and the
// distortion totals) for the backward pass.
//
// GPU structure: the tile's list is consumed in batches of P::kBatch
// primitives staged in shared memory; the block stops as soon as every pixel
// of the tile is finished (__syncthreads_count), which is also the barrier
// that protects the batch buffer before it is overwritten.
#include <cstdint>

#include "../core.h"
#include "rasterize_cuda.h"
#include "gaussian_batch.cuh"
#include "surfel_batch.cuh"

namespace splat {
namespace gpu {
namespace {

static_assert(kTileSize * kTileSize == kBlockThreads, "one thread per pixel of a tile");

template <typename T, class P>
__global__ void __launch_bounds__(kBlockThreads)
    forward_kernel(const typename P::Arrays s, const TileBins bins, const ForwardOutputs<T> out) {
  __shared__ typename P::Batch batch;

  const int tile = blockIdx.y * bins.tiles_x + blockIdx.x;
  const int tid = threadIdx.y * kTileSize + threadIdx.x;
  const int px = blockIdx.x * kTileSize + threadIdx.x;
  const int py = blockIdx.y * kTileSize + threadIdx.y;
  // Pixels past the image edge (partial border tiles) still help load batches
  // and take part in the barriers, but render nothing.
  const bool inside = px < s.width && py < s.height;
  const T x = T(px) + T(0.5), y = T(py) + T(0.5);

  const int64_t begin = bins.tile_offsets[tile];
  const int32_t count = static_cast<int32_t>(bins.tile_offsets[tile + 1] - begin);
  const int32_t* __restrict__ list = bins.point_list + begin;

  PixelState<T> p;
  init_pixel(p);
  bool done = !inside;

  for (int32_t start = 0; start < count; start += P::kBatch) {
    // Barrier + vote: every thread has finished reading the previous batch,
    // and if every pixel is done the whole block leaves (uniformly).
    if (__syncthreads_count(done) == kBlockThreads) break;
    const int32_t k_load = start + tid;
    if (tid < P::kBatch && k_load < count)
      P::store(batch, tid, s, list[k_load]);  // coalesced list read
    __syncthreads();

    if (!done) {
      const int n_batch = min(P::kBatch, count - start);
      for (int j = 0; j < n_batch; ++j) {
        if (!P::in_rect(batch, j, px, py)) continue;
        if (!P::blend_at(p, batch, j, x, y, s, start + j)) {
          done = true;
          break;
        }
      }
    }
  }

  if (!inside) return;
  const int64_t pix = int64_t(py) * s.width + px;
  store_pixel(p, pix, out);
}

template <typename T, class P>
cudaError_t launch(const typename P::Arrays& s, const TileBins& bins, const ForwardOutputs<T>& out,
                   cudaStream_t stream) {
  if (bins.tiles_x <= 0 || bins.tiles_y <= 0) return cudaSuccess;  // empty image
  const dim3 grid(bins.tiles_x, bins.tiles_y);
  const dim3 block(kTileSize, kTileSize);
  forward_kernel<T, P><<<grid, block, 0, stream>>>(s, bins, out);
  return cudaGetLastError();
}

}  // namespace

template <typename T>
cudaError_t launch_forward(const SurfelArrays<T>& s, const TileBins& bins,
                           const ForwardOutputs<T>& out, cudaStream_t stream) {
  return launch<T, SurfelKernel<T>>(s, bins, out, stream);
}

template <typename T>
cudaError_t launch_forward(const GaussianArrays<T>& g, const TileBins& bins,
                           const ForwardOutputs<T>& out, cudaStream_t stream) {
  return launch<T, GaussianKernel<T>>(g, bins, out, stream);
}

#define SPLAT_INSTANTIATE(T)                                                        \
  template cudaError_t launch_forward<T>(const SurfelArrays<T>&, const TileBins&,   \
                                         const ForwardOutputs<T>&, cudaStream_t);   \
  template cudaError_t launch_forward<T>(const GaussianArrays<T>&, const TileBins&, \
                                         const ForwardOutputs<T>&, cudaStream_t);
SPLAT_INSTANTIATE(float)
SPLAT_INSTANTIATE(double)
#undef SPLAT_INSTANTIATE

}  // namespace gpu
}  // namespace splat
