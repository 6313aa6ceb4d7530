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

std::vector<torch::Tensor> forward_cuda(SPLAT_SURFEL_PARAMS) {
  return host_sequence::forward<CudaDevice>(SPLAT_SURFEL_NAMES);
}

torch::Tensor backward_cuda(SPLAT_SURFEL_PARAMS, SPLAT_BACKWARD_STATE_PARAMS) {
  return host_sequence::backward<CudaDevice>(SPLAT_SURFEL_NAMES, SPLAT_BACKWARD_STATE_NAMES);
}

std::vector<torch::Tensor> forward_gaussians_cuda(SPLAT_GAUSSIAN_PARAMS) {
  return host_sequence::forward_gaussians<CudaDevice>(SPLAT_GAUSSIAN_NAMES);
}

torch::Tensor backward_gaussians_cuda(SPLAT_GAUSSIAN_PARAMS, SPLAT_BACKWARD_STATE_PARAMS) {
  return host_sequence::backward_gaussians<CudaDevice>(SPLAT_GAUSSIAN_NAMES,
                                                       SPLAT_BACKWARD_STATE_NAMES);
}

}  // namespace splat
