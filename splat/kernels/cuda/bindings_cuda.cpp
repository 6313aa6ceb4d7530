// Torch glue of the CUDA backend (compiled by the host C++ compiler in the
// CUDAExtension; the kernels in *.cu see raw pointers only).
//
// The call sequence itself (validation with messages that name the argument,
// allocation, binning, render, backward) is host_sequence.h, shared with the
// CUDA emulation harness that runs these kernels on the CPU in CI.  This file
// only supplies the CUDA specifics: make the input's device current, use
// torch's current stream (so the work orders correctly with the surrounding
// torch ops and streams chosen by the caller), and allocate every buffer
// through torch (the caching allocator: no cudaMalloc, no sync, memory freed
// stream-ordered).
//
// Host syncs: exactly one per forward call, inside gpu::bin_count, to learn
// the number of (tile, surfel) pairs before allocating them; so a forward call
// cannot be captured in a CUDA graph.  The render and the backward pass never
// sync.
#include "bindings_cuda.h"

// c10's stream header rather than ATen/cuda/CUDAContext.h: same function
// (at::cuda::getCurrentCUDAStream is c10::cuda's), without pulling in the
// cuBLAS/cuSPARSE headers.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "host_sequence.h"

namespace splat {
namespace {

struct CudaDevice {
  static constexpr c10::DeviceType kType = c10::DeviceType::CUDA;
  static constexpr bool kHostMemory = false;
  static torch::Tensor empty(at::IntArrayRef shape, const torch::TensorOptions& opts) {
    return torch::empty(shape, opts);
  }
  static cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }
  using Guard = c10::cuda::CUDAGuard;
};

}  // namespace

std::vector<torch::Tensor> forward_cuda(const torch::Tensor& Tuvw, const torch::Tensor& center,
                                        const torch::Tensor& normal, const torch::Tensor& color,
                                        const torch::Tensor& opacity, const torch::Tensor& depth,
                                        const torch::Tensor& pixel_rect, int64_t width,
                                        int64_t height, double near, double far) {
  return host_sequence::forward<CudaDevice>(Tuvw, center, normal, color, opacity, depth,
                                            pixel_rect, width, height, near, far);
}

torch::Tensor backward_cuda(const torch::Tensor& Tuvw, const torch::Tensor& center,
                            const torch::Tensor& normal, const torch::Tensor& color,
                            const torch::Tensor& opacity, const torch::Tensor& depth,
                            const torch::Tensor& pixel_rect, int64_t width, int64_t height,
                            double near, double far, const torch::Tensor& tile_offsets,
                            const torch::Tensor& point_list, const torch::Tensor& end,
                            const torch::Tensor& median_index,
                            const torch::Tensor& transmittance, const torch::Tensor& totals,
                            const torch::Tensor& v_color_sum,
                            const torch::Tensor& v_transmittance,
                            const torch::Tensor& v_depth_sum, const torch::Tensor& v_normal_sum,
                            const torch::Tensor& v_distortion,
                            const torch::Tensor& v_median_depth) {
  return host_sequence::backward<CudaDevice>(
      Tuvw, center, normal, color, opacity, depth, pixel_rect, width, height, near, far,
      tile_offsets, point_list, end, median_index, transmittance, totals, v_color_sum,
      v_transmittance, v_depth_sum, v_normal_sum, v_distortion, v_median_depth);
}

std::vector<torch::Tensor> forward_gaussians_cuda(const torch::Tensor& params, const torch::Tensor& color,
                                                  const torch::Tensor& depth, const torch::Tensor& pixel_rect,
                                                  int64_t width, int64_t height, double near, double far) {
  return host_sequence::forward_gaussians<CudaDevice>(params, color, depth, pixel_rect, width, height, near,
                                                      far);
}

torch::Tensor backward_gaussians_cuda(const torch::Tensor& params, const torch::Tensor& color,
                                      const torch::Tensor& depth, const torch::Tensor& pixel_rect,
                                      int64_t width, int64_t height, double near, double far,
                                      const torch::Tensor& tile_offsets, const torch::Tensor& point_list,
                                      const torch::Tensor& end, const torch::Tensor& median_index,
                                      const torch::Tensor& transmittance, const torch::Tensor& totals,
                                      const torch::Tensor& v_color_sum, const torch::Tensor& v_transmittance,
                                      const torch::Tensor& v_depth_sum, const torch::Tensor& v_normal_sum,
                                      const torch::Tensor& v_distortion, const torch::Tensor& v_median_depth) {
  return host_sequence::backward_gaussians<CudaDevice>(
      params, color, depth, pixel_rect, width, height, near, far, tile_offsets, point_list, end,
      median_index, transmittance, totals, v_color_sum, v_transmittance, v_depth_sum, v_normal_sum,
      v_distortion, v_median_depth);
}

}  // namespace splat
