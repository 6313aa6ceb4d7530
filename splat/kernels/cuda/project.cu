// The fused surfel projection on the GPU: one thread per surfel, each running
// ../project_surfels.h's forward or backward for a block of one surfel, the
// same maths and the same operations as the CPU's blocks of 64
// (cpu/project_cpu.cpp), so with --fmad=false the results are the CPU's up
// to the library functions (log), and bitwise the CPU's under the emulation.
//
// Every surfel is independent: the backward writes its own rows and needs no
// atomics; the forward's only shared result, the count of surfels over the
// magnitude limits, is one atomicAdd per such surfel (none in a valid scene).
#include <cub/device/device_scan.cuh>

#include <cstdint>

#include "../project_gaussians.h"
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

// ---- the fused projection of 3D Gaussians -------------------------------------------
// ../project_gaussians.h per Gaussian, one thread each, as the CPU's blocks
// (cpu/project_gaussians_cpu.cpp) run it: the same operations, so the same
// bits under the emulation.  The cull is a compaction: keep flags, their
// inclusive scan (cub), M read back, then each kept Gaussian writes its index
// at its rank, so ids come out increasing as the CPU's.

namespace {

constexpr size_t kGaussAlign = 256;
inline size_t gauss_align(size_t x) { return (x + kGaussAlign - 1) / kGaussAlign * kGaussAlign; }

// The cull's workspace: flags int64 [n], their inclusive scan int64 [n], cub's scratch.
struct GaussCullLayout {
  size_t flags, rank, temp, temp_bytes, total;
  explicit GaussCullLayout(int n) {
    temp_bytes = 0;
    cub::DeviceScan::InclusiveSum(nullptr, temp_bytes, static_cast<const int64_t*>(nullptr),
                                  static_cast<int64_t*>(nullptr), n);
    flags = 0;
    rank = gauss_align(sizeof(int64_t) * size_t(n));
    temp = rank + gauss_align(sizeof(int64_t) * size_t(n));
    total = temp + gauss_align(temp_bytes);
  }
};

template <typename T>
__global__ void __launch_bounds__(kProjectThreads)
    gauss_keep_kernel(const GaussCudaInputs<T> in, double near, double far, int64_t* flags) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= in.n) return;
  flags[i] = gauss_kept(in.means + 3 * i, in.opacities[i], in.viewmat, near, far) ? 1 : 0;
}

__global__ void __launch_bounds__(kProjectThreads)
    gauss_ids_kernel(const int64_t* flags, const int64_t* rank, int64_t n, int64_t* ids) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n || !flags[i]) return;
  ids[rank[i] - 1] = i;
}

// This thread's Gaussian: index, camera (every thread reads the same numbers,
// served by the cache; the CPU builds it once per call with the same
// operations), rows, and their forward projection (p, row).
template <typename T>
struct GaussThread {
  int64_t i;
  GaussCamera<T> cam;
  T m[3], q[4], s[3], o;
  GaussProjected<T> p;
  T row[kGaussParams];
};

// Loads the j-th kept Gaussian and projects it (the backward recomputes the
// forward, as the CPU's does).
template <typename T>
__device__ __forceinline__ void project_kept(const GaussCudaInputs<T>& in, int64_t j,
                                             GaussThread<T>& t) {
  t.i = in.ids[j];
  t.cam = gauss_camera(in.viewmat, in.K, in.K_inv, in.width, in.height, in.antialiased);
  for (int k = 0; k < 3; ++k) t.m[k] = in.means[3 * t.i + k];
  for (int k = 0; k < 4; ++k) t.q[k] = in.quats[4 * t.i + k];
  for (int k = 0; k < 3; ++k) t.s[k] = in.scales[3 * t.i + k];
  t.o = in.opacities[t.i];
  gauss_project_forward(t.cam, t.m, t.q, t.s, t.o, t.p, t.row);
}

template <typename T>
__global__ void __launch_bounds__(kProjectThreads)
    gauss_forward_kernel(const GaussCudaInputs<T> in, const GaussCudaOutputs<T> out,
                         unsigned long long* bad) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= in.m) return;
  GaussThread<T> t;
  project_kept(in, j, t);
  const T* row = t.row;
  int32_t ok = 1;
  T* dst = out.params + kGaussParams * j;
  for (int k = 0; k < kGaussParams; ++k) {
    dst[k] = row[k];
    ok &= finite_flag(row[k]);
  }
  out.centre[2 * j] = t.p.centre[0];
  out.centre[2 * j + 1] = t.p.centre[1];
  out.depth[j] = t.p.mu[2];
  gauss_screen_bounds(double(row[kGaussConic]), double(row[kGaussConic + 1]),
                      double(row[kGaussConic + 2]), double(row[kGaussCenter]),
                      double(row[kGaussCenter + 1]), double(row[kGaussOpacity]), in.width,
                      in.height, out.pixel_rect + 4 * j, out.radii[j]);
  if (!ok) atomicAdd(bad, 1ull);
}

template <typename T>
__global__ void __launch_bounds__(kProjectThreads)
    gauss_backward_kernel(const GaussCudaInputs<T> in, const GaussCudaGrads<T> g) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= in.m) return;
  GaussThread<T> t;
  project_kept(in, j, t);
  T up[kGaussParams];
  for (int k = 0; k < kGaussParams; ++k) up[k] = g.v_params[kGaussParams * j + k];
  const T vcen[2] = {g.v_centre ? g.v_centre[2 * j] : T(0),
                     g.v_centre ? g.v_centre[2 * j + 1] : T(0)};
  T v_m[3], v_q[4], v_s[3], v_o;
  GaussCameraGrad<T> vc;  // this Gaussian's share of the camera's gradient
  gauss_project_backward(t.cam, t.m, t.s, t.o, t.p, up, vcen, v_m, v_q, v_s, v_o, vc);
  if (g.v_camera) gauss_camera_grad_flat(vc, g.v_camera + int64_t(kGaussCameraGradSize) * j);
  const int64_t i = t.i;
  for (int k = 0; k < 3; ++k) g.v_means[3 * i + k] = v_m[k];
  for (int k = 0; k < 4; ++k) g.v_quats[4 * i + k] = v_q[k];
  for (int k = 0; k < 3; ++k) g.v_scales[3 * i + k] = v_s[k];
  g.v_opacities[i] = v_o;
  // params' centre = centre + (means2d - means2d.detach()): identity
  g.v_means2d[2 * i] = up[kGaussCenter];
  g.v_means2d[2 * i + 1] = up[kGaussCenter + 1];
}

// The camera's gradient, as the CPU sums it: one thread per block of
// kGaussCameraBlock kept Gaussians sums their shares in float64 in order
// (one column per loop, the CPU's order for each column)...
template <typename T>
__global__ void __launch_bounds__(kProjectThreads)
    gauss_camera_partial_kernel(const T* __restrict__ v_camera, int64_t m, double* partial) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t first = b * kGaussCameraBlock;
  if (first >= m) return;
  const int64_t end = first + kGaussCameraBlock < m ? first + kGaussCameraBlock : m;
  for (int k = 0; k < kGaussCameraGradSize; ++k) {
    double sum = 0.0;
    for (int64_t j = first; j < end; ++j) sum += double(v_camera[kGaussCameraGradSize * j + k]);
    partial[kGaussCameraGradSize * b + k] = sum;
  }
}

// ... and one thread per column the blocks in order (one block of 32 threads;
// a column's sum is one thread's, in the CPU's order), then one thread chains
// them to viewmat, K, K^-1.
constexpr int kCameraThreads = 32;
static_assert(kGaussCameraGradSize <= kCameraThreads, "one thread per column");

template <typename T>
__global__ void __launch_bounds__(kCameraThreads)
    gauss_camera_finish_kernel(const GaussCudaInputs<T> in, const double* partial, int64_t blocks,
                               T* v_viewmat, T* v_K, T* v_K_inv) {
  __shared__ double v[kGaussCameraGradSize];
  const int k = threadIdx.x;
  if (k < kGaussCameraGradSize) {
    double sum = 0.0;
    for (int64_t b = 0; b < blocks; ++b) sum += partial[kGaussCameraGradSize * b + k];
    v[k] = sum;
  }
  __syncthreads();
  if (k != 0) return;
  const GaussCamera<T> cam =
      gauss_camera(in.viewmat, in.K, in.K_inv, in.width, in.height, in.antialiased);
  gauss_camera_grad_finish(v, cam, v_viewmat, v_K, v_K_inv);
}

}  // namespace

size_t gauss_cull_workspace_bytes(int64_t n) { return GaussCullLayout(static_cast<int>(n)).total; }

template <typename T>
cudaError_t gauss_cull(const GaussCudaInputs<T>& in, double near, double far, void* workspace,
                       size_t workspace_bytes, int64_t* m, cudaStream_t stream) {
  *m = 0;
  if (in.n <= 0) return cudaSuccess;
  if (in.n >= (int64_t(1) << 31)) return cudaErrorInvalidValue;
  const int n = static_cast<int>(in.n);
  const GaussCullLayout L(n);
  if (workspace_bytes < L.total) return cudaErrorInvalidValue;
  char* ws = static_cast<char*>(workspace);
  int64_t* flags = reinterpret_cast<int64_t*>(ws + L.flags);
  int64_t* rank = reinterpret_cast<int64_t*>(ws + L.rank);
  gauss_keep_kernel<T><<<grid_for(n), kProjectThreads, 0, stream>>>(in, near, far, flags);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  size_t temp_bytes = L.temp_bytes;
  e = cub::DeviceScan::InclusiveSum(ws + L.temp, temp_bytes, flags, rank, n, stream);
  if (e != cudaSuccess) return e;
  e = cudaMemcpyAsync(m, rank + (n - 1), sizeof(int64_t), cudaMemcpyDeviceToHost, stream);
  if (e != cudaSuccess) return e;
  return cudaStreamSynchronize(stream);
}

cudaError_t gauss_cull_ids(const void* workspace, int64_t n, int64_t* ids, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const GaussCullLayout L(static_cast<int>(n));
  const char* ws = static_cast<const char*>(workspace);
  gauss_ids_kernel<<<grid_for(n), kProjectThreads, 0, stream>>>(
      reinterpret_cast<const int64_t*>(ws + L.flags), reinterpret_cast<const int64_t*>(ws + L.rank),
      n, ids);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_gauss_project_forward(const GaussCudaInputs<T>& in,
                                         const GaussCudaOutputs<T>& out, unsigned long long* bad,
                                         cudaStream_t stream) {
  if (in.m <= 0) return cudaSuccess;
  gauss_forward_kernel<T><<<grid_for(in.m), kProjectThreads, 0, stream>>>(in, out, bad);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_gauss_project_backward(const GaussCudaInputs<T>& in, const GaussCudaGrads<T>& g,
                                          cudaStream_t stream) {
  if (in.m > 0) {
    gauss_backward_kernel<T><<<grid_for(in.m), kProjectThreads, 0, stream>>>(in, g);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || !g.v_viewmat) return e;
  }
  if (!g.v_viewmat) return cudaSuccess;
  const int64_t blocks = (in.m + kGaussCameraBlock - 1) / kGaussCameraBlock;
  if (blocks > 0) {
    gauss_camera_partial_kernel<T>
        <<<grid_for(blocks), kProjectThreads, 0, stream>>>(g.v_camera, in.m, g.partial);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  gauss_camera_finish_kernel<T>
      <<<1, kCameraThreads, 0, stream>>>(in, g.partial, blocks, g.v_viewmat, g.v_K, g.v_K_inv);
  return cudaGetLastError();
}

#define SPLAT_INSTANTIATE(T)                                                                     \
  template cudaError_t gauss_cull<T>(const GaussCudaInputs<T>&, double, double, void*, size_t,   \
                                     int64_t*, cudaStream_t);                                    \
  template cudaError_t launch_gauss_project_forward<T>(                                          \
      const GaussCudaInputs<T>&, const GaussCudaOutputs<T>&, unsigned long long*, cudaStream_t); \
  template cudaError_t launch_gauss_project_backward<T>(const GaussCudaInputs<T>&,               \
                                                        const GaussCudaGrads<T>&, cudaStream_t);
SPLAT_INSTANTIATE(float)
SPLAT_INSTANTIATE(double)
#undef SPLAT_INSTANTIATE

}  // namespace gpu
}  // namespace splat
