// The host-side call sequence of the CUDA backend: validate, allocate, bin
// (bin_count, read back P, bin_pairs), render, and for the gradients check the
// saved forward state and launch the backward kernel; for surfels
// (forward/backward) and 3D Gaussians (forward_gaussians/backward_gaussians),
// which differ only in their inputs' checks and the kernels' overload.
//
// ONE copy, compiled twice: by the real bindings (bindings_cuda.cpp, with the
// CUDA runtime and torch CUDA tensors) and by the CUDA emulation harness
// (tests/cuda_emulation/emu_bindings.cpp, with the cudaemu shim standing in for
// <cuda_runtime.h> and CPU tensors), so what CI runs under emulation is the
// very sequence GPU users run.  The two builds differ only in the `Dev`
// policy:
//
//   struct Dev {
//     static constexpr c10::DeviceType kType;   // kCUDA, or kCPU when emulated
//     static constexpr bool kHostMemory;        // tensors readable from the host
//     static torch::Tensor empty(at::IntArrayRef, const torch::TensorOptions&);
//     static cudaStream_t stream();             // where every launch goes
//     struct Guard { explicit Guard(const torch::Device&); };  // current device
//   };
#pragma once

#include <cuda_runtime.h>
#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "../core.h"
#include "../op_signatures.h"
#include "../raster_args.h"
#include "rasterize_cuda.h"

namespace splat {
namespace host_sequence {

constexpr int64_t kMaxInt32 = (int64_t(1) << 31) - 1;

inline void check_cuda(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, "CUDA rasterizer: ", what, " failed: ", cudaGetErrorString(e));
}

template <class Dev>
void check_tensor(const torch::Tensor& t, const char* name, const torch::Device& device,
                  torch::ScalarType dtype) {
  TORCH_CHECK(t.defined(), name, " is undefined (None)");
  TORCH_CHECK(t.device().type() == Dev::kType, name, " must be a ", c10::DeviceTypeName(Dev::kType),
              " tensor for the CUDA backend, got one on ", t.device());
  TORCH_CHECK(t.device() == device, name, " is on ", t.device(), " but the first input is on ",
              device, ": all inputs must be on one device");
  TORCH_CHECK(t.scalar_type() == dtype, name, " has dtype ", t.scalar_type(), ", expected ", dtype);
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// [n, cols] when cols > 0; n elements with n rows (e.g. [N] or [N, 1]) when cols == 0.
inline void check_rows(const torch::Tensor& t, const char* name, int64_t n, int64_t cols) {
  TORCH_CHECK(t.dim() >= 1 && t.size(0) == n, name, " has shape ", t.sizes(), ", expected ", n,
              " rows");
  if (cols > 0) {
    TORCH_CHECK(t.dim() == 2 && t.size(1) == cols, name, " has shape ", t.sizes(), ", expected [",
                n, ", ", cols, "]");
  } else {
    TORCH_CHECK(t.numel() == n, name, " has shape ", t.sizes(), ", expected [", n, "]");
  }
}

inline void check_image(const torch::Tensor& t, const char* name, int64_t height, int64_t width,
                        int64_t channels) {
  const bool ok = channels > 0 ? (t.dim() == 3 && t.size(0) == height && t.size(1) == width &&
                                  t.size(2) == channels)
                               : (t.dim() == 2 && t.size(0) == height && t.size(1) == width);
  if (channels > 0) {
    TORCH_CHECK(ok, name, " has shape ", t.sizes(), ", expected [", height, ", ", width, ", ",
                channels, "]");
  } else {
    TORCH_CHECK(ok, name, " has shape ", t.sizes(), ", expected [", height, ", ", width, "]");
  }
}

inline int tiles_along(int64_t pixels) {
  return static_cast<int>((pixels + kTileSize - 1) / kTileSize);
}

// Checks the first input (its device and dtype set the others') and the
// image size; returns N, the first input's rows.
template <class Dev>
int64_t check_first_input(const torch::Tensor& first, const char* name, const char* shape,
                          int64_t width, int64_t height) {
  TORCH_CHECK(first.defined(), name, " is undefined (None)");
  TORCH_CHECK(first.device().type() == Dev::kType, name, " must be a ",
              c10::DeviceTypeName(Dev::kType), " tensor for the CUDA backend, got one on ",
              first.device());
  const auto dtype = first.scalar_type();
  TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kFloat64,
              "the CUDA rasterizer supports float32 and float64 inputs, got ", dtype);
  TORCH_CHECK(first.dim() == 2, name, " has shape ", first.sizes(), ", expected ", shape);
  const int64_t n = first.size(0);
  TORCH_CHECK(n <= kMaxInt32, "too many primitives for the CUDA rasterizer: ", n);
  TORCH_CHECK(width >= 0 && height >= 0 && width <= kMaxInt32 && height <= kMaxInt32,
              "invalid image size ", width, " x ", height);
  // The kernels index tiles with int (and the launch grid is 1-D over tiles).
  TORCH_CHECK(int64_t(tiles_along(width)) * tiles_along(height) <= kMaxInt32 / 2,
              "image too large: ", width, " x ", height);
  return n;
}

// Checks the per-surfel inputs and image size; returns N.
template <class Dev>
int64_t check_surfels(const torch::Tensor& Tuvw, const torch::Tensor& center,
                      const torch::Tensor& normal, const torch::Tensor& color,
                      const torch::Tensor& opacity, const torch::Tensor& depth,
                      const torch::Tensor& pixel_rect, int64_t width, int64_t height) {
  const int64_t n = check_first_input<Dev>(Tuvw, "Tuvw", "[N, 9]", width, height);
  const auto device = Tuvw.device();
  const auto dtype = Tuvw.scalar_type();
  check_tensor<Dev>(Tuvw, "Tuvw", device, dtype);
  check_rows(Tuvw, "Tuvw", n, 9);
  check_tensor<Dev>(center, "center", device, dtype);
  check_rows(center, "center", n, 2);
  check_tensor<Dev>(normal, "normal", device, dtype);
  check_rows(normal, "normal", n, 3);
  check_tensor<Dev>(color, "color", device, dtype);
  check_rows(color, "color", n, kChannels);
  check_tensor<Dev>(opacity, "opacity", device, dtype);
  check_rows(opacity, "opacity", n, 0);
  check_tensor<Dev>(depth, "depth", device, dtype);
  check_rows(depth, "depth", n, 0);
  check_tensor<Dev>(pixel_rect, "pixel_rect", device, torch::kInt32);
  check_rows(pixel_rect, "pixel_rect", n, 4);
  return n;
}

// Checks the per-Gaussian inputs (core.h "3D Gaussians") and image size; returns N.
template <class Dev>
int64_t check_gaussians(const torch::Tensor& params, const torch::Tensor& color,
                        const torch::Tensor& depth, const torch::Tensor& pixel_rect, int64_t width,
                        int64_t height) {
  const int64_t n = check_first_input<Dev>(params, "params", "[N, 27]", width, height);
  const auto device = params.device();
  const auto dtype = params.scalar_type();
  check_tensor<Dev>(params, "params", device, dtype);
  check_rows(params, "params", n, kGaussParams);
  check_tensor<Dev>(color, "color", device, dtype);
  check_rows(color, "color", n, kChannels);
  check_tensor<Dev>(depth, "depth", device, dtype);
  check_rows(depth, "depth", n, 0);
  check_tensor<Dev>(pixel_rect, "pixel_rect", device, torch::kInt32);
  check_rows(pixel_rect, "pixel_rect", n, 4);
  return n;
}

template <typename T>
SurfelArrays<T> surfel_arrays(SPLAT_SURFEL_PARAMS) {
  return SurfelArrays<T>{Tuvw.data_ptr<T>(),
                         center.data_ptr<T>(),
                         normal.data_ptr<T>(),
                         color.data_ptr<T>(),
                         opacity.data_ptr<T>(),
                         depth.data_ptr<T>(),
                         pixel_rect.data_ptr<int32_t>(),
                         Tuvw.size(0),
                         static_cast<int>(width),
                         static_cast<int>(height),
                         static_cast<T>(near),
                         static_cast<T>(far)};
}

template <typename T>
GaussianArrays<T> gaussian_arrays(SPLAT_GAUSSIAN_PARAMS) {
  return GaussianArrays<T>{
      params.data_ptr<T>(),           color.data_ptr<T>(),  depth.data_ptr<T>(),
      pixel_rect.data_ptr<int32_t>(), params.size(0),       static_cast<int>(width),
      static_cast<int>(height),       static_cast<T>(near), static_cast<T>(far)};
}

// Allocates the outputs, bins and renders `a` (SurfelArrays or
// GaussianArrays: binning reads only depth and pixel_rect; the render
// launcher is the primitive's overload).  `like` gives dtype and device.
template <class Dev, typename T, class Arrays>
std::vector<torch::Tensor> forward_impl(const Arrays& a, int64_t n, const torch::Tensor& like,
                                        int64_t width, int64_t height) {
  cudaStream_t stream = Dev::stream();
  const auto opts = like.options();
  const auto iopts = opts.dtype(torch::kInt32);
  torch::Tensor color_sum = Dev::empty({height, width, kChannels}, opts);
  torch::Tensor transmittance = Dev::empty({height, width}, opts);
  torch::Tensor depth_sum = Dev::empty({height, width}, opts);
  torch::Tensor normal_sum = Dev::empty({height, width, 3}, opts);
  torch::Tensor distortion = Dev::empty({height, width}, opts);
  torch::Tensor median_depth = Dev::empty({height, width}, opts);
  torch::Tensor end = Dev::empty({height, width}, iopts);
  torch::Tensor median_index = Dev::empty({height, width}, iopts);
  torch::Tensor totals = Dev::empty({height, width, kTotalsSize}, opts);
  const int tiles_x = tiles_along(width), tiles_y = tiles_along(height);
  const int num_tiles = tiles_x * tiles_y;
  torch::Tensor tile_offsets = Dev::empty({int64_t(num_tiles) + 1}, opts.dtype(torch::kInt64));
  torch::Tensor point_list;

  const auto bytes = opts.dtype(torch::kUInt8);
  if (n > 0 && num_tiles > 0) {
    torch::Tensor count_ws = Dev::empty({int64_t(gpu::bin_count_workspace_bytes<T>(n))}, bytes);
    int64_t num_pairs = 0;
    check_cuda(gpu::bin_count<T>(a.depth, a.pixel_rect, n, tiles_x, tiles_y, count_ws.data_ptr(),
                                 size_t(count_ws.numel()), &num_pairs, stream),
               "binning (bin_count)");
    TORCH_CHECK(num_pairs <= kMaxInt32,
                "too many (tile, primitive) pairs for the CUDA rasterizer: ", num_pairs);
    point_list = Dev::empty({num_pairs}, iopts);
    torch::Tensor pairs_ws =
        Dev::empty({int64_t(gpu::bin_pairs_workspace_bytes(num_pairs, num_tiles))}, bytes);
    check_cuda(
        gpu::bin_pairs<T>(a.pixel_rect, n, tiles_x, tiles_y, count_ws.data_ptr(), num_pairs,
                          pairs_ws.data_ptr(), size_t(pairs_ws.numel()),
                          point_list.data_ptr<int32_t>(), tile_offsets.data_ptr<int64_t>(), stream),
        "binning (bin_pairs)");
  } else {
    // No primitives (or no pixels): every tile has the empty list, and the
    // render below writes the background state (transmittance 1, sums 0,
    // end 0, median_index -1).
    tile_offsets.zero_();
    point_list = Dev::empty({0}, iopts);
  }

  TileBins bins{tile_offsets.data_ptr<int64_t>(), point_list.data_ptr<int32_t>(), tiles_x, tiles_y};
  ForwardOutputs<T> out{
      color_sum.data_ptr<T>(),  transmittance.data_ptr<T>(),      depth_sum.data_ptr<T>(),
      normal_sum.data_ptr<T>(), distortion.data_ptr<T>(),         median_depth.data_ptr<T>(),
      end.data_ptr<int32_t>(),  median_index.data_ptr<int32_t>(), totals.data_ptr<T>()};
  check_cuda(gpu::launch_forward<T>(a, bins, out, stream), "the forward kernel");
  return {color_sum, transmittance, depth_sum, normal_sum,   distortion, median_depth,
          end,       median_index,  totals,    tile_offsets, point_list};
}

// The saved forward state and the upstream gradients, as backward_impl takes them.
struct BackwardInputs {
  torch::Tensor tile_offsets, point_list, end, median_index, transmittance, totals;
  std::vector<torch::Tensor> up;  // 6, contiguous
};

// Accumulates the gradient records [N, record_size] of `a` (zeroed first:
// the kernel adds with atomics).
template <class Dev, typename T, class Arrays>
torch::Tensor backward_impl(const Arrays& a, int64_t n, int64_t record_size,
                            const torch::Tensor& like, int64_t width, int64_t height,
                            const BackwardInputs& in) {
  cudaStream_t stream = Dev::stream();
  torch::Tensor v_params = Dev::empty({n, record_size}, like.options()).zero_();
  const int tiles_x = tiles_along(width), tiles_y = tiles_along(height);
  if (n == 0 || tiles_x == 0 || tiles_y == 0) return v_params;

  TileBins bins{in.tile_offsets.data_ptr<int64_t>(), in.point_list.data_ptr<int32_t>(), tiles_x,
                tiles_y};
  const auto& up = in.up;
  UpstreamGrads<T> grads{up[0].data_ptr<T>(), up[1].data_ptr<T>(), up[2].data_ptr<T>(),
                         up[3].data_ptr<T>(), up[4].data_ptr<T>(), up[5].data_ptr<T>()};
  check_cuda(
      gpu::launch_backward<T>(a, bins, in.end.data_ptr<int32_t>(),
                              in.median_index.data_ptr<int32_t>(), in.transmittance.data_ptr<T>(),
                              in.totals.data_ptr<T>(), grads, v_params.data_ptr<T>(), stream),
      "the backward kernel");
  return v_params;
}

// The binning saved by forward must belong to these inputs: shapes always;
// where the tensors are host-readable (the emulated build), also the contents
// the kernels index with (offsets monotone from 0 to P, ids in [0, N)), which
// on a GPU would cost a host sync per backward call.
template <class Dev>
void check_binning(const torch::Tensor& tile_offsets, const torch::Tensor& point_list, int64_t n,
                   int64_t num_tiles, int64_t width, int64_t height, const torch::Device& device) {
  check_tensor<Dev>(tile_offsets, "tile_offsets", device, torch::kInt64);
  TORCH_CHECK(tile_offsets.dim() == 1 && tile_offsets.numel() == num_tiles + 1,
              "tile_offsets has shape ", tile_offsets.sizes(), ", expected [", num_tiles + 1,
              "] for a ", width, " x ", height,
              " image: the saved forward state does not "
              "belong to these inputs");
  check_tensor<Dev>(point_list, "point_list", device, torch::kInt32);
  TORCH_CHECK(point_list.dim() == 1, "point_list must be 1-D, got shape ", point_list.sizes());
  if constexpr (Dev::kHostMemory) {
    const int64_t* off = tile_offsets.data_ptr<int64_t>();
    TORCH_CHECK(off[0] == 0 && off[num_tiles] == point_list.numel(), "tile_offsets run from ",
                off[0], " to ", off[num_tiles], " but point_list has ", point_list.numel(),
                " entries: the saved forward state does not belong to "
                "these inputs");
    for (int64_t t = 0; t < num_tiles; ++t)
      TORCH_CHECK(off[t] <= off[t + 1], "tile_offsets decrease at tile ", t,
                  ": the saved forward state is corrupt");
    const int32_t* ids = point_list.data_ptr<int32_t>();
    for (int64_t i = 0; i < point_list.numel(); ++i)
      TORCH_CHECK(ids[i] >= 0 && ids[i] < n, "point_list[", i, "] = ", ids[i],
                  " is not a primitive index in [0, ", n,
                  "): the saved forward state does not "
                  "belong to these inputs");
  }
}

// Checks the saved forward state (it must come from forward on the same
// inputs) and the upstream gradients, whose device and dtype must be `like`'s.
template <class Dev>
BackwardInputs check_backward_inputs(const torch::Tensor& like, int64_t n, int64_t width,
                                     int64_t height, SPLAT_BACKWARD_STATE_PARAMS) {
  const auto device = like.device();
  const auto dtype = like.scalar_type();
  const int64_t num_tiles = int64_t(tiles_along(width)) * tiles_along(height);
  check_binning<Dev>(tile_offsets, point_list, n, num_tiles, width, height, device);
  check_tensor<Dev>(end, "end", device, torch::kInt32);
  check_image(end, "end", height, width, 0);
  check_tensor<Dev>(median_index, "median_index", device, torch::kInt32);
  check_image(median_index, "median_index", height, width, 0);
  check_tensor<Dev>(transmittance, "transmittance", device, dtype);
  check_image(transmittance, "transmittance", height, width, 0);
  check_tensor<Dev>(totals, "totals", device, dtype);
  check_image(totals, "totals", height, width, splat::kTotalsSize);

  // Upstream gradients: autograd may hand over expanded (stride-0) or
  // otherwise non-contiguous tensors; contiguous() is free when they are not.
  const torch::Tensor* raw[6] = {&v_color_sum,  &v_transmittance, &v_depth_sum,
                                 &v_normal_sum, &v_distortion,    &v_median_depth};
  const char* names[6] = {"v_color_sum",  "v_transmittance", "v_depth_sum",
                          "v_normal_sum", "v_distortion",    "v_median_depth"};
  const int64_t channels[6] = {kChannels, 0, 0, 3, 0, 0};
  BackwardInputs in{tile_offsets, point_list, end, median_index, transmittance, totals, {}};
  in.up.reserve(6);
  for (int i = 0; i < 6; ++i) {
    TORCH_CHECK(raw[i]->defined(), names[i], " is undefined (None)");
    auto t = raw[i]->contiguous();
    check_tensor<Dev>(t, names[i], device, dtype);
    check_image(t, names[i], height, width, channels[i]);
    in.up.push_back(std::move(t));
  }
  return in;
}

// ---- entry points --------------------------------------------------------------
// Surfels: core.h's surfel record, v_surfels [N, kGradSize].
template <class Dev>
std::vector<torch::Tensor> forward(SPLAT_SURFEL_PARAMS) {
  const int64_t n =
      check_surfels<Dev>(Tuvw, center, normal, color, opacity, depth, pixel_rect, width, height);
  const typename Dev::Guard device_guard(Tuvw.device());
  if (Tuvw.scalar_type() == torch::kFloat64)
    return forward_impl<Dev, double>(surfel_arrays<double>(SPLAT_SURFEL_NAMES), n, Tuvw, width,
                                     height);
  return forward_impl<Dev, float>(surfel_arrays<float>(SPLAT_SURFEL_NAMES), n, Tuvw, width, height);
}

template <class Dev>
torch::Tensor backward(SPLAT_SURFEL_PARAMS, SPLAT_BACKWARD_STATE_PARAMS) {
  const int64_t n =
      check_surfels<Dev>(Tuvw, center, normal, color, opacity, depth, pixel_rect, width, height);
  const typename Dev::Guard device_guard(Tuvw.device());
  const BackwardInputs in =
      check_backward_inputs<Dev>(Tuvw, n, width, height, SPLAT_BACKWARD_STATE_NAMES);
  if (Tuvw.scalar_type() == torch::kFloat64)
    return backward_impl<Dev, double>(surfel_arrays<double>(SPLAT_SURFEL_NAMES), n, kGradSize, Tuvw,
                                      width, height, in);
  return backward_impl<Dev, float>(surfel_arrays<float>(SPLAT_SURFEL_NAMES), n, kGradSize, Tuvw,
                                   width, height, in);
}

// 3D Gaussians: params [N, kGaussParams] (core.h), v_gaussians [N, kGaussGradSize].
template <class Dev>
std::vector<torch::Tensor> forward_gaussians(SPLAT_GAUSSIAN_PARAMS) {
  const int64_t n = check_gaussians<Dev>(params, color, depth, pixel_rect, width, height);
  const typename Dev::Guard device_guard(params.device());
  if (params.scalar_type() == torch::kFloat64)
    return forward_impl<Dev, double>(gaussian_arrays<double>(SPLAT_GAUSSIAN_NAMES), n, params,
                                     width, height);
  return forward_impl<Dev, float>(gaussian_arrays<float>(SPLAT_GAUSSIAN_NAMES), n, params, width,
                                  height);
}

template <class Dev>
torch::Tensor backward_gaussians(SPLAT_GAUSSIAN_PARAMS, SPLAT_BACKWARD_STATE_PARAMS) {
  const int64_t n = check_gaussians<Dev>(params, color, depth, pixel_rect, width, height);
  const typename Dev::Guard device_guard(params.device());
  const BackwardInputs in =
      check_backward_inputs<Dev>(params, n, width, height, SPLAT_BACKWARD_STATE_NAMES);
  if (params.scalar_type() == torch::kFloat64)
    return backward_impl<Dev, double>(gaussian_arrays<double>(SPLAT_GAUSSIAN_NAMES), n,
                                      kGaussGradSize, params, width, height, in);
  return backward_impl<Dev, float>(gaussian_arrays<float>(SPLAT_GAUSSIAN_NAMES), n, kGaussGradSize,
                                   params, width, height, in);
}

}  // namespace host_sequence
}  // namespace splat
