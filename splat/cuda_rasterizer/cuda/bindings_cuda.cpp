// Torch glue of the CUDA backend (compiled by the host C++ compiler in the
// CUDAExtension; the kernels in *.cu see raw pointers only).
//
// Responsibilities: validate the inputs (CUDA, one device, contiguous, dtype
// float32 or float64, shapes) with messages that name the argument; make the
// input's device current and use torch's current stream, so the work orders
// correctly with the surrounding torch ops and CUDA graphs/streams chosen by
// the caller; allocate every buffer through torch (the caching allocator:
// no cudaMalloc, no sync, memory freed stream-ordered).
//
// Host syncs: exactly one per forward call, inside gpu::bin_count, to learn
// the number of (tile, surfel) pairs before allocating them.  The render and
// the backward pass never sync.
#include "bindings_cuda.h"

// c10's stream header rather than ATen/cuda/CUDAContext.h: same function
// (at::cuda::getCurrentCUDAStream is c10::cuda's), without pulling in the
// cuBLAS/cuSPARSE headers.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <vector>

#include "../core.h"
#include "../raster_args.h"
#include "rasterize_cuda.h"

namespace splat {
namespace {

constexpr int64_t kMaxInt32 = (int64_t(1) << 31) - 1;

void check_tensor(const torch::Tensor& t, const char* name, const torch::Device& device,
                  torch::ScalarType dtype) {
  TORCH_CHECK(t.defined(), name, " is undefined (None)");
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor for the CUDA backend, got one on ",
              t.device());
  TORCH_CHECK(t.device() == device, name, " is on ", t.device(), " but Tuvw is on ", device,
              ": all inputs must be on one device");
  TORCH_CHECK(t.scalar_type() == dtype, name, " has dtype ", t.scalar_type(), ", expected ",
              dtype);
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// [n, cols] when cols > 0; n elements with n rows (e.g. [N] or [N, 1]) when cols == 0.
void check_rows(const torch::Tensor& t, const char* name, int64_t n, int64_t cols) {
  TORCH_CHECK(t.dim() >= 1 && t.size(0) == n, name, " has shape ", t.sizes(), ", expected ", n,
              " rows");
  if (cols > 0) {
    TORCH_CHECK(t.dim() == 2 && t.size(1) == cols, name, " has shape ", t.sizes(),
                ", expected [", n, ", ", cols, "]");
  } else {
    TORCH_CHECK(t.numel() == n, name, " has shape ", t.sizes(), ", expected [", n, "]");
  }
}

void check_image(const torch::Tensor& t, const char* name, int64_t height, int64_t width,
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

torch::ScalarType float_dtype(const torch::Tensor& Tuvw) {
  TORCH_CHECK(Tuvw.defined(), "Tuvw is undefined (None)");
  TORCH_CHECK(Tuvw.is_cuda(), "Tuvw must be a CUDA tensor for the CUDA backend, got one on ",
              Tuvw.device());
  const auto dtype = Tuvw.scalar_type();
  TORCH_CHECK(dtype == torch::kFloat32 || dtype == torch::kFloat64,
              "the CUDA rasterizer supports float32 and float64 inputs, got ", dtype);
  return dtype;
}

int tiles_along(int64_t pixels) {
  return static_cast<int>((pixels + kTileSize - 1) / kTileSize);
}

// Checks the per-surfel inputs and image size; returns N.
int64_t check_surfels(const torch::Tensor& Tuvw, const torch::Tensor& center,
                      const torch::Tensor& normal, const torch::Tensor& color,
                      const torch::Tensor& opacity, const torch::Tensor& depth,
                      const torch::Tensor& pixel_rect, int64_t width, int64_t height) {
  const auto dtype = float_dtype(Tuvw);
  const auto device = Tuvw.device();
  TORCH_CHECK(Tuvw.dim() == 2, "Tuvw has shape ", Tuvw.sizes(), ", expected [N, 9]");
  const int64_t n = Tuvw.size(0);
  TORCH_CHECK(n <= kMaxInt32, "too many surfels for the CUDA rasterizer: ", n);
  TORCH_CHECK(width >= 0 && height >= 0 && width <= kMaxInt32 && height <= kMaxInt32,
              "invalid image size ", width, " x ", height);
  TORCH_CHECK(int64_t(tiles_along(width)) * tiles_along(height) <= kMaxInt32 / 2,
              "image too large: ", width, " x ", height);
  check_tensor(Tuvw, "Tuvw", device, dtype);
  check_rows(Tuvw, "Tuvw", n, 9);
  check_tensor(center, "center", device, dtype);
  check_rows(center, "center", n, 2);
  check_tensor(normal, "normal", device, dtype);
  check_rows(normal, "normal", n, 3);
  check_tensor(color, "color", device, dtype);
  check_rows(color, "color", n, kChannels);
  check_tensor(opacity, "opacity", device, dtype);
  check_rows(opacity, "opacity", n, 0);
  check_tensor(depth, "depth", device, dtype);
  check_rows(depth, "depth", n, 0);
  check_tensor(pixel_rect, "pixel_rect", device, torch::kInt32);
  check_rows(pixel_rect, "pixel_rect", n, 4);
  return n;
}

template <typename T>
SurfelArrays<T> surfel_arrays(const torch::Tensor& Tuvw, const torch::Tensor& center,
                              const torch::Tensor& normal, const torch::Tensor& color,
                              const torch::Tensor& opacity, const torch::Tensor& depth,
                              const torch::Tensor& pixel_rect, int64_t width, int64_t height,
                              double near, double far) {
  return SurfelArrays<T>{Tuvw.data_ptr<T>(),    center.data_ptr<T>(),
                         normal.data_ptr<T>(),  color.data_ptr<T>(),
                         opacity.data_ptr<T>(), depth.data_ptr<T>(),
                         pixel_rect.data_ptr<int32_t>(), Tuvw.size(0),
                         static_cast<int>(width), static_cast<int>(height),
                         static_cast<T>(near),  static_cast<T>(far)};
}

torch::Tensor byte_buffer(size_t bytes, const torch::Tensor& like) {
  return torch::empty({static_cast<int64_t>(bytes)}, like.options().dtype(torch::kUInt8));
}

template <typename T>
std::vector<torch::Tensor> forward_impl(const torch::Tensor& Tuvw, const torch::Tensor& center,
                                        const torch::Tensor& normal, const torch::Tensor& color,
                                        const torch::Tensor& opacity, const torch::Tensor& depth,
                                        const torch::Tensor& pixel_rect, int64_t width,
                                        int64_t height, double near, double far) {
  const int64_t n = Tuvw.size(0);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const auto opts = Tuvw.options();
  const auto iopts = opts.dtype(torch::kInt32);
  auto color_sum = torch::empty({height, width, kChannels}, opts);
  auto transmittance = torch::empty({height, width}, opts);
  auto depth_sum = torch::empty({height, width}, opts);
  auto normal_sum = torch::empty({height, width, 3}, opts);
  auto distortion = torch::empty({height, width}, opts);
  auto median_depth = torch::empty({height, width}, opts);
  auto end = torch::empty({height, width}, iopts);
  auto median_index = torch::empty({height, width}, iopts);
  auto totals = torch::empty({height, width, splat::kTotalsSize}, opts);
  const int tiles_x = tiles_along(width), tiles_y = tiles_along(height);
  const int num_tiles = tiles_x * tiles_y;
  auto tile_offsets = torch::empty({int64_t(num_tiles) + 1}, opts.dtype(torch::kInt64));
  torch::Tensor point_list;

  auto s = surfel_arrays<T>(Tuvw, center, normal, color, opacity, depth, pixel_rect, width,
                            height, near, far);
  if (n > 0 && num_tiles > 0) {
    auto count_ws = byte_buffer(gpu::bin_count_workspace_bytes<T>(n), Tuvw);
    int64_t num_pairs = 0;
    C10_CUDA_CHECK(gpu::bin_count<T>(s.depth, s.pixel_rect, n, tiles_x, tiles_y,
                                     count_ws.data_ptr(), size_t(count_ws.numel()), &num_pairs,
                                     stream));
    TORCH_CHECK(num_pairs <= kMaxInt32, "too many (tile, surfel) pairs for the CUDA rasterizer: ",
                num_pairs);
    point_list = torch::empty({num_pairs}, iopts);
    auto pairs_ws = byte_buffer(gpu::bin_pairs_workspace_bytes(num_pairs, num_tiles), Tuvw);
    C10_CUDA_CHECK(gpu::bin_pairs<T>(s.pixel_rect, n, tiles_x, tiles_y, count_ws.data_ptr(),
                                     num_pairs, pairs_ws.data_ptr(), size_t(pairs_ws.numel()),
                                     point_list.data_ptr<int32_t>(),
                                     tile_offsets.data_ptr<int64_t>(), stream));
  } else {
    // No surfels (or no pixels): every tile has the empty list, and the render
    // below writes the background state (transmittance 1, sums 0, end 0,
    // median_index -1).
    tile_offsets.zero_();
    point_list = torch::empty({0}, iopts);
  }

  TileBins bins{tile_offsets.data_ptr<int64_t>(), point_list.data_ptr<int32_t>(), tiles_x,
                tiles_y};
  ForwardOutputs<T> out{color_sum.data_ptr<T>(),    transmittance.data_ptr<T>(),
                        depth_sum.data_ptr<T>(),    normal_sum.data_ptr<T>(),
                        distortion.data_ptr<T>(),   median_depth.data_ptr<T>(),
                        end.data_ptr<int32_t>(),    median_index.data_ptr<int32_t>(),
                        totals.data_ptr<T>()};
  C10_CUDA_CHECK(gpu::launch_forward<T>(s, bins, out, stream));
  return {color_sum, transmittance, depth_sum, normal_sum, distortion, median_depth,
          end,       median_index,  totals,    tile_offsets, point_list};
}

template <typename T>
torch::Tensor backward_impl(const torch::Tensor& Tuvw, const torch::Tensor& center,
                            const torch::Tensor& normal, const torch::Tensor& color,
                            const torch::Tensor& opacity, const torch::Tensor& depth,
                            const torch::Tensor& pixel_rect, int64_t width, int64_t height,
                            double near, double far, const torch::Tensor& tile_offsets,
                            const torch::Tensor& point_list, const torch::Tensor& end,
                            const torch::Tensor& median_index,
                            const torch::Tensor& transmittance, const torch::Tensor& totals,
                            const std::vector<torch::Tensor>& up /* 6, contiguous */) {
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  // Zeroed: the kernel accumulates with atomics.
  auto v_surfels = torch::zeros({Tuvw.size(0), kGradSize}, Tuvw.options());
  const int tiles_x = tiles_along(width), tiles_y = tiles_along(height);
  if (Tuvw.size(0) == 0 || tiles_x == 0 || tiles_y == 0) return v_surfels;

  auto s = surfel_arrays<T>(Tuvw, center, normal, color, opacity, depth, pixel_rect, width,
                            height, near, far);
  TileBins bins{tile_offsets.data_ptr<int64_t>(), point_list.data_ptr<int32_t>(), tiles_x,
                tiles_y};
  UpstreamGrads<T> grads{up[0].data_ptr<T>(), up[1].data_ptr<T>(), up[2].data_ptr<T>(),
                         up[3].data_ptr<T>(), up[4].data_ptr<T>(), up[5].data_ptr<T>()};
  C10_CUDA_CHECK(gpu::launch_backward<T>(s, bins, end.data_ptr<int32_t>(),
                                         median_index.data_ptr<int32_t>(),
                                         transmittance.data_ptr<T>(), totals.data_ptr<T>(),
                                         grads, v_surfels.data_ptr<T>(), stream));
  return v_surfels;
}

}  // namespace

std::vector<torch::Tensor> forward_cuda(const torch::Tensor& Tuvw, const torch::Tensor& center,
                                        const torch::Tensor& normal, const torch::Tensor& color,
                                        const torch::Tensor& opacity, const torch::Tensor& depth,
                                        const torch::Tensor& pixel_rect, int64_t width,
                                        int64_t height, double near, double far) {
  check_surfels(Tuvw, center, normal, color, opacity, depth, pixel_rect, width, height);
  const c10::cuda::CUDAGuard device_guard(Tuvw.device());
  if (Tuvw.scalar_type() == torch::kFloat64)
    return forward_impl<double>(Tuvw, center, normal, color, opacity, depth, pixel_rect, width,
                                height, near, far);
  return forward_impl<float>(Tuvw, center, normal, color, opacity, depth, pixel_rect, width,
                             height, near, far);
}

torch::Tensor backward_cuda(const torch::Tensor& Tuvw, const torch::Tensor& center,
                            const torch::Tensor& normal, const torch::Tensor& color,
                            const torch::Tensor& opacity, const torch::Tensor& depth,
                            const torch::Tensor& pixel_rect, int64_t width, int64_t height,
                            double near, double far, const torch::Tensor& tile_offsets,
                            const torch::Tensor& point_list, const torch::Tensor& end,
                            const torch::Tensor& median_index,
                            const torch::Tensor& transmittance, const torch::Tensor& totals,
                            const torch::Tensor& v_color_sum,
                            const torch::Tensor& v_transmittance,
                            const torch::Tensor& v_depth_sum, const torch::Tensor& v_normal_sum,
                            const torch::Tensor& v_distortion,
                            const torch::Tensor& v_median_depth) {
  check_surfels(Tuvw, center, normal, color, opacity, depth, pixel_rect, width, height);
  const c10::cuda::CUDAGuard device_guard(Tuvw.device());
  const auto device = Tuvw.device();
  const auto dtype = Tuvw.scalar_type();
  const int64_t num_tiles = int64_t(tiles_along(width)) * tiles_along(height);

  // Saved forward state: must come from forward_cuda on the same inputs.
  check_tensor(tile_offsets, "tile_offsets", device, torch::kInt64);
  TORCH_CHECK(tile_offsets.dim() == 1 && tile_offsets.numel() == num_tiles + 1,
              "tile_offsets has shape ", tile_offsets.sizes(), ", expected [", num_tiles + 1,
              "] for a ", width, " x ", height, " image");
  check_tensor(point_list, "point_list", device, torch::kInt32);
  TORCH_CHECK(point_list.dim() == 1, "point_list must be 1-D, got shape ", point_list.sizes());
  check_tensor(end, "end", device, torch::kInt32);
  check_image(end, "end", height, width, 0);
  check_tensor(median_index, "median_index", device, torch::kInt32);
  check_image(median_index, "median_index", height, width, 0);
  check_tensor(transmittance, "transmittance", device, dtype);
  check_image(transmittance, "transmittance", height, width, 0);
  check_tensor(totals, "totals", device, dtype);
  check_image(totals, "totals", height, width, splat::kTotalsSize);

  // Upstream gradients: autograd may hand over expanded (stride-0) or
  // otherwise non-contiguous tensors; contiguous() is free when they are not.
  const torch::Tensor* raw[6] = {&v_color_sum, &v_transmittance, &v_depth_sum,
                                 &v_normal_sum, &v_distortion, &v_median_depth};
  const char* names[6] = {"v_color_sum", "v_transmittance", "v_depth_sum",
                          "v_normal_sum", "v_distortion", "v_median_depth"};
  const int64_t channels[6] = {kChannels, 0, 0, 3, 0, 0};
  std::vector<torch::Tensor> up;
  up.reserve(6);
  for (int i = 0; i < 6; ++i) {
    TORCH_CHECK(raw[i]->defined(), names[i], " is undefined (None)");
    auto t = raw[i]->contiguous();
    check_tensor(t, names[i], device, dtype);
    check_image(t, names[i], height, width, channels[i]);
    up.push_back(std::move(t));
  }

  if (dtype == torch::kFloat64)
    return backward_impl<double>(Tuvw, center, normal, color, opacity, depth, pixel_rect, width,
                                 height, near, far, tile_offsets, point_list, end, median_index,
                                 transmittance, totals, up);
  return backward_impl<float>(Tuvw, center, normal, color, opacity, depth, pixel_rect, width,
                              height, near, far, tile_offsets, point_list, end, median_index,
                              transmittance, totals, up);
}

}  // namespace splat
