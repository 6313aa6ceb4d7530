// Launchers of the fused surfel projection on the GPU (project.cu): raw
// device pointers and a cudaStream_t only, no torch headers.  The per-surfel
// maths is ../project_surfels.h, the one the CPU runs (cpu/project_cpu.cpp);
// the host call sequence (host_sequence.h project_forward / project_backward)
// validates the tensors, allocates and calls these.
//
// viewmat [4, 4] and K [3, 3] stay on the device: every thread reads the 25
// numbers itself (the same addresses for all threads, served by the cache),
// so a call needs no host copy and no sync.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../project_gaussians.h"
#include "../project_surfels.h"

namespace splat {
namespace gpu {

// Forward: fills `out` for the in.n surfels and adds the number of surfels over
// the magnitude limits to *over_limit (device memory, zeroed by the caller).
// `in`'s viewmat and K fields are ignored: they are read from the device
// pointers.  No host sync.
template <typename T>
cudaError_t launch_project_forward(const ProjectInputs<T>& in, const T* viewmat, const T* K,
                                   const ProjectOutputs<T>& out, unsigned long long* over_limit,
                                   cudaStream_t stream);

// Backward: writes every gradient in `g` (each surfel's rows; no atomics, no
// zeroing needed).  No host sync.
template <typename T>
cudaError_t launch_project_backward(const ProjectInputs<T>& in, const T* viewmat, const T* K,
                                    const ProjectGrads<T>& g, cudaStream_t stream);

// ---- the fused projection of 3D Gaussians (../project_gaussians.h) -------------------
// The CPU's op (cpu/project_gaussians_cpu.h) on the GPU: cull, then one
// thread per kept Gaussian each way; the camera's gradient summed as the CPU's.

// The inputs: means [N,3], quats [N,4], scales [N,3], opacities [N]; ids [M]
// (the kept, increasing; unused by the cull); viewmat [4,4], K, K^-1 [3,3],
// all device pointers.
template <typename T>
struct GaussCudaInputs {
  const T *means, *quats, *scales, *opacities;
  const int64_t* ids;
  int64_t n, m;
  const T *viewmat, *K, *K_inv;
  int width, height, antialiased;
};

template <typename T>
struct GaussCudaOutputs {
  T* params;            // [M, kGaussParams]
  T* centre;            // [M, 2]
  T* depth;             // [M]
  int32_t* pixel_rect;  // [M, 4]
  int32_t* radii;       // [M]
};

// v_params [M, kGaussParams] and v_centre [M, 2] (or nullptr) contiguous; the
// outputs [N, ...], rows of the Gaussians not kept left as the caller set them.
// With v_viewmat (else all four nullptr): v_camera [M, kGaussCameraGradSize]
// and partial [ceil(M / kGaussCameraBlock), kGaussCameraGradSize] scratch, and
// the camera's gradients v_viewmat [16], v_K [9], v_K_inv [9].
template <typename T>
struct GaussCudaGrads {
  const T *v_params, *v_centre;
  T *v_means, *v_quats, *v_scales, *v_opacities, *v_means2d;
  T* v_camera;
  double* partial;
  T *v_viewmat, *v_K, *v_K_inv;
};

// Bytes of the cull's workspace for n Gaussians (n < 2^31).
size_t gauss_cull_workspace_bytes(int64_t n);

// Keep flags (gauss_kept) and their running count in the workspace, and the
// number kept, M, read back into *m: the one host sync (the caller allocates
// the [M] outputs).
template <typename T>
cudaError_t gauss_cull(const GaussCudaInputs<T>& in, double near, double far, void* workspace,
                       size_t workspace_bytes, int64_t* m, cudaStream_t stream);

// Writes the kept Gaussians' indices, increasing, to ids [M] from gauss_cull's
// workspace.  No host sync.
cudaError_t gauss_cull_ids(const void* workspace, int64_t n, int64_t* ids, cudaStream_t stream);

// Forward of the in.m kept Gaussians in.ids: fills `out` and adds the number
// of rows with a non-finite parameter to *bad (device memory, zeroed by the
// caller).  No host sync.
template <typename T>
cudaError_t launch_gauss_project_forward(const GaussCudaInputs<T>& in,
                                         const GaussCudaOutputs<T>& out, unsigned long long* bad,
                                         cudaStream_t stream);

// Backward: writes the kept Gaussians' rows of every gradient in `g` (no
// atomics: ids are distinct), and with g.v_viewmat the camera's gradients,
// summed as the CPU's (per block of kGaussCameraBlock Gaussians in float64 in
// order, then the blocks in order).  No host sync.
template <typename T>
cudaError_t launch_gauss_project_backward(const GaussCudaInputs<T>& in, const GaussCudaGrads<T>& g,
                                          cudaStream_t stream);

}  // namespace gpu
}  // namespace splat
