// The fused surfel projection on the GPU: one thread per surfel, each running
// ../project_surfels.h's forward or backward for a block of one surfel, the
// same maths and the same operations as the CPU's blocks of 64
// (cpu/project_cpu.cpp), so with --fmad=false the results are the CPU's up
// to the library functions (log), and bitwise the CPU's under the emulation.
//
// Every surfel is independent: the backward writes its own rows and needs no
// atomics; the forward's only shared result, the count of surfels over the
// magnitude limits, is one atomicAdd per such surfel (none in a valid scene).
#include <cstdint>

#include "../project_surfels.h"
#include "project_cuda.h"

namespace splat {
namespace gpu {
namespace {

constexpr int kProjectThreads = 256;

// Fills in.viewmat and in.K from the device (every thread reads the same 25
// numbers, served by the cache) and the camera centre, which the CPU
// computes once per call: the same operations, so the same bits.
template <typename T>
__device__ __forceinline__ void load_camera(ProjectInputs<T>& in, const T* __restrict__ viewmat,
                                            const T* __restrict__ K, T campos[3]) {
  for (int k = 0; k < 16; ++k) in.viewmat[k] = viewmat[k];
  for (int k = 0; k < 9; ++k) in.K[k] = K[k];
  camera_centre(in, campos);
}

template <typename T>
__global__ void __launch_bounds__(kProjectThreads)
    project_forward_kernel(const ProjectInputs<T> args, const T* __restrict__ viewmat,
                           const T* __restrict__ K, const ProjectOutputs<T> out,
                           unsigned long long* over_limit) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= args.n) return;
  ProjectInputs<T> in = args;
  T campos[3];
  load_camera(in, viewmat, K, campos);
  const int64_t bad = project_forward_block<1>(in, out, campos, i, 1);
  if (bad) atomicAdd(over_limit, static_cast<unsigned long long>(bad));
}

template <typename T>
__global__ void __launch_bounds__(kProjectThreads)
    project_backward_kernel(const ProjectInputs<T> args, const T* __restrict__ viewmat,
                            const T* __restrict__ K, const ProjectGrads<T> g) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= args.n) return;
  ProjectInputs<T> in = args;
  T campos[3];
  load_camera(in, viewmat, K, campos);
  project_backward_block<1>(in, g, campos, i, 1);
}

inline dim3 grid_for(int64_t n) {
  return dim3(static_cast<unsigned>((n + kProjectThreads - 1) / kProjectThreads));
}

}  // namespace

template <typename T>
cudaError_t launch_project_forward(const ProjectInputs<T>& in, const T* viewmat, const T* K,
                                   const ProjectOutputs<T>& out, unsigned long long* over_limit,
                                   cudaStream_t stream) {
  if (in.n <= 0) return cudaSuccess;
  project_forward_kernel<T>
      <<<grid_for(in.n), kProjectThreads, 0, stream>>>(in, viewmat, K, out, over_limit);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_project_backward(const ProjectInputs<T>& in, const T* viewmat, const T* K,
                                    const ProjectGrads<T>& g, cudaStream_t stream) {
  if (in.n <= 0) return cudaSuccess;
  project_backward_kernel<T><<<grid_for(in.n), kProjectThreads, 0, stream>>>(in, viewmat, K, g);
  return cudaGetLastError();
}

#define SPLAT_INSTANTIATE(T)                                                                    \
  template cudaError_t launch_project_forward<T>(const ProjectInputs<T>&, const T*, const T*,   \
                                                 const ProjectOutputs<T>&, unsigned long long*, \
                                                 cudaStream_t);                                 \
  template cudaError_t launch_project_backward<T>(const ProjectInputs<T>&, const T*, const T*,  \
                                                  const ProjectGrads<T>&, cudaStream_t);
SPLAT_INSTANTIATE(float)
SPLAT_INSTANTIATE(double)
#undef SPLAT_INSTANTIATE

}  // namespace gpu
}  // namespace splat
