// Forward render: one 16x16 thread block per tile, one thread per pixel.
//
// Each pixel runs exactly the CPU loop of forward_cpu (cpu/rasterize_cpu.cpp):
// for list position k = 0, 1, ...: intersect, skip non-contributing samples,
// blend until blend() refuses.  The per-pixel maths is core.h, shared with the
// CPU, so both backends take the same decisions and save the same state
// (end and median_index as tile-local list positions, final transmittance and
// the distortion totals) for the backward pass.
//
// GPU structure: the tile's list is consumed in batches of kBatchSize surfels
// staged in shared memory (see surfel_batch.cuh); the block stops as soon as
// every pixel of the tile is finished (__syncthreads_count), which is also the
// barrier that protects the batch buffer before it is overwritten.
#include <cstdint>

#include "../core.h"
#include "rasterize_cuda.h"
#include "surfel_batch.cuh"

namespace splat {
namespace gpu {
namespace {

static_assert(kTileSize * kTileSize == kBlockThreads, "one thread per pixel of a tile");

template <typename T>
__global__ void __launch_bounds__(kBlockThreads)
    forward_kernel(const SurfelArrays<T> s, const TileBins bins, const ForwardOutputs<T> out) {
  __shared__ SurfelBatch<T> batch;

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

  for (int32_t start = 0; start < count; start += kBatchSize) {
    // Barrier + vote: every thread has finished reading the previous batch,
    // and if every pixel is done the whole block leaves (uniformly).
    if (__syncthreads_count(done) == kBlockThreads) break;
    const int32_t k_load = start + tid;
    if (k_load < count) store_surfel(batch, tid, s, list[k_load]);  // coalesced list read
    __syncthreads();

    if (!done) {
      const int n_batch = min(kBatchSize, count - start);
      for (int j = 0; j < n_batch; ++j) {
        if (!in_rect(batch, j, px, py)) continue;
        SurfelParams<T> sp;
        load_params(batch, j, sp);
        Hit<T> h;
        intersect(sp, x, y, s.near, h);
        if (!h.contributes) continue;
        T color[kChannels], normal[3];
        load_color_normal(batch, j, color, normal);
        if (!blend(p, h, color, normal, s.near, s.far, start + j)) {
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

}  // namespace

template <typename T>
cudaError_t launch_forward(const SurfelArrays<T>& s, const TileBins& bins,
                           const ForwardOutputs<T>& out, cudaStream_t stream) {
  if (bins.tiles_x <= 0 || bins.tiles_y <= 0) return cudaSuccess;  // empty image
  const dim3 grid(bins.tiles_x, bins.tiles_y);
  const dim3 block(kTileSize, kTileSize);
  forward_kernel<T><<<grid, block, 0, stream>>>(s, bins, out);
  return cudaGetLastError();
}

template cudaError_t launch_forward<float>(const SurfelArrays<float>&, const TileBins&,
                                           const ForwardOutputs<float>&, cudaStream_t);
template cudaError_t launch_forward<double>(const SurfelArrays<double>&, const TileBins&,
                                            const ForwardOutputs<double>&, cudaStream_t);

}  // namespace gpu
}  // namespace splat
