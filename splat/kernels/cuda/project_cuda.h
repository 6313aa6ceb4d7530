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

}  // namespace gpu
}  // namespace splat
