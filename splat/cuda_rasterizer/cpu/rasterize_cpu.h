// CPU backend entry points (no torch headers; see bindings.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "../raster_args.h"

namespace splat {

// Sorts the visible surfels front to back and lists them per tile.
template <typename T>
void bin_tiles_cpu(const SurfelArrays<T>& s, int tiles_x, int tiles_y,
                   std::vector<int64_t>& tile_offsets, std::vector<int32_t>& point_list);

template <typename T>
void forward_cpu(const SurfelArrays<T>& s, const TileBins& bins, const ForwardOutputs<T>& out);

// Writes dL/d(per-surfel record) into v_surfels [N, kGradSize] (see core.h).
template <typename T>
void backward_cpu(const SurfelArrays<T>& s, const TileBins& bins, const int32_t* end,
                  const int32_t* median_index, const T* transmittance, const T* totals,
                  const UpstreamGrads<T>& up, T* v_surfels);

}  // namespace splat
