// Torch entry points of the CUDA backend, registered by bindings.cpp (under
// SPLAT_WITH_CUDA) as splat._C.forward_cuda / backward_cuda and
// forward_gaussians_cuda / backward_gaussians_cuda.  The argument lists and
// results are exactly those of the *_cpu functions (less the CPU's packed
// records), so the Python side calls either backend the same way.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "../op_signatures.h"

namespace splat {

// Returns {color_sum [H,W,3], transmittance [H,W], depth_sum [H,W],
// normal_sum [H,W,3], distortion [H,W], median_depth [H,W], end int32 [H,W],
// median_index int32 [H,W], totals [H,W,kTotalsSize], tile_offsets int64 [num_tiles+1],
// point_list int32 [P]}, all on the input's CUDA device.
std::vector<torch::Tensor> forward_cuda(SPLAT_SURFEL_PARAMS);

// Returns v_surfels [N, kGradSize] (see core.h for the record layout).
torch::Tensor backward_cuda(SPLAT_SURFEL_PARAMS, SPLAT_BACKWARD_STATE_PARAMS);

// 3D Gaussians (core.h "3D Gaussians"): params [N, kGaussParams], color
// [N, 3], depth [N], pixel_rect int32 [N, 4].  Returns what forward_cuda does.
std::vector<torch::Tensor> forward_gaussians_cuda(SPLAT_GAUSSIAN_PARAMS);

// Returns v_gaussians [N, kGaussGradSize].
torch::Tensor backward_gaussians_cuda(SPLAT_GAUSSIAN_PARAMS, SPLAT_BACKWARD_STATE_PARAMS);

}  // namespace splat
