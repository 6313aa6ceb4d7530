// CPU kernels for 3D Gaussians: the surfels' tiles, order,
// blending and back-to-front walk (cpu/tiles.h, core.h), with core.h's
// per-pixel Gaussian evaluation.  Binning is bin_tiles_cpu (rasterize_cpu.h).
#pragma once

#include <cstdint>

#include "../raster_args.h"

namespace splat {

template <typename T>
void forward_gaussians_cpu(const GaussianArrays<T>& g, const TileBins& bins,
                           const ForwardOutputs<T>& out);

// Writes dL/d(parameters, colour) into v_gaussians [N, kGaussGradSize].
template <typename T>
void backward_gaussians_cpu(const GaussianArrays<T>& g, const TileBins& bins, const int32_t* end,
                            const int32_t* median_index, const T* transmittance, const T* totals,
                            const UpstreamGrads<T>& up, T* v_gaussians);

}  // namespace splat
