// Torch entry points of the CUDA backend, registered by bindings.cpp (under
// SPLAT_WITH_CUDA) as splat._C.forward_cuda / backward_cuda,
// forward_gaussians_cuda / backward_gaussians_cuda, project_forward_cuda /
// project_backward_cuda and project_gaussians_forward_cuda / _backward_cuda.  The argument lists
// and results are exactly those of the *_cpu functions (less the CPU's packed records), so the
// Python side calls either backend the same way.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <optional>
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

// The fused surfel projection (../project_surfels.h): arguments and results
// as bindings.cpp's project_forward_cpu / project_backward_cpu, except that the
// over-limit count stays on the device (int64 []) and the upstream gradients
// are made contiguous.
std::vector<torch::Tensor> project_forward_cuda(
    const torch::Tensor& means, const torch::Tensor& quats, const torch::Tensor& scales,
    const torch::Tensor& opacities, const torch::Tensor& coeffs, int64_t sh_degree,
    const torch::Tensor& viewmat, const torch::Tensor& K, int64_t width, int64_t height,
    double near, double far, double limit_finite, double limit_drawn);
std::vector<torch::Tensor> project_backward_cuda(
    const torch::Tensor& means, const torch::Tensor& quats, const torch::Tensor& scales,
    const torch::Tensor& opacities, const torch::Tensor& coeffs, int64_t sh_degree,
    const torch::Tensor& viewmat, const torch::Tensor& K, int64_t width, int64_t height,
    double near, double far, const torch::Tensor& v_Tuvw, const torch::Tensor& v_center,
    const torch::Tensor& v_normal, const torch::Tensor& v_color);

// The fused projection of 3D Gaussians (../project_gaussians.h): arguments
// and results as splat/_native.py's project_gaussians_forward_cpu /
// _backward_cpu, except that the non-finite row count stays on the device
// (int64 []) and the upstream gradients are made contiguous.
std::vector<torch::Tensor> project_gaussians_forward_cuda(
    const torch::Tensor& means, const torch::Tensor& quats, const torch::Tensor& scales,
    const torch::Tensor& opacities, const torch::Tensor& viewmat, const torch::Tensor& K,
    const torch::Tensor& K_inv, int64_t width, int64_t height, double near, double far,
    bool antialiased);
std::vector<torch::Tensor> project_gaussians_backward_cuda(
    const torch::Tensor& means, const torch::Tensor& quats, const torch::Tensor& scales,
    const torch::Tensor& opacities, const torch::Tensor& ids, const torch::Tensor& viewmat,
    const torch::Tensor& K, const torch::Tensor& K_inv, int64_t width, int64_t height,
    bool antialiased, const torch::Tensor& v_params, const std::optional<torch::Tensor>& v_centre,
    bool with_camera);

}  // namespace splat
