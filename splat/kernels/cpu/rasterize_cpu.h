// CPU backend entry points (no torch headers; see bindings.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "../raster_args.h"

namespace splat {

// Kernel modes (see rasterize_cpu.cpp): all give bitwise equal forward outputs.
constexpr int kModeReference = 0;  // pixel by pixel over whole pixel rectangles
constexpr int kModeScalar = 1;     // pixel by pixel over exact row spans
constexpr int kModeSimd = 2;       // 8 float32 pixels at a time (float64: kModeScalar)
void set_cpu_kernel_mode(int mode);
int cpu_kernel_mode();

// Sorts the n primitives front to back by depth [n] and lists those with a
// non-empty pixel_rect [n, 4] per tile; the list (P entries) is written to
// alloc_point_list(P).  Shared by surfels and 3D Gaussians.
template <typename T>
void bin_tiles_cpu(int64_t n, const T* depth, const int32_t* pixel_rect, int tiles_x, int tiles_y,
                   std::vector<int64_t>& tile_offsets,
                   const std::function<int32_t*(int64_t)>& alloc_point_list);

// Bytes of the per-surfel records the float32 SIMD kernels pack (0 when the
// kernels do not pack: float64, or a scalar kernel mode).
template <typename T>
int64_t packed_surfel_bytes(int64_t num_surfels);

// packed_out: packed_surfel_bytes(N) bytes that receive the packed records,
// for backward_cpu to reuse, or nullptr.
template <typename T>
void forward_cpu(const SurfelArrays<T>& s, const TileBins& bins, const ForwardOutputs<T>& out,
                 uint8_t* packed_out);

// Writes dL/d(per-surfel record) into v_surfels [N, kGradSize] (see core.h).
// packed_in: forward_cpu's packed records, or nullptr to pack them again.
template <typename T>
void backward_cpu(const SurfelArrays<T>& s, const TileBins& bins, const int32_t* end,
                  const int32_t* median_index, const T* transmittance, const T* totals,
                  const UpstreamGrads<T>& up, T* v_surfels, const uint8_t* packed_in);

}  // namespace splat
