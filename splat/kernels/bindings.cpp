// Torch <-> raw-pointer glue: one op per entry point.  The kernels themselves
// (cpu/*.cpp, cuda/*.cu) include no torch headers.
#include <torch/extension.h>

#include <vector>

#include "core.h"
#include "op_signatures.h"
#include "cpu/gaussians_cpu.h"
#include "cpu/normal_loss_cpu.h"
#include "cpu/project_cpu.h"
#include "cpu/rasterize_cpu.h"
#include "cpu/scratch.h"
#include "cpu/simd.h"
#include "cpu/ssim_cpu.h"
#ifdef SPLAT_WITH_CUDA
#include "cuda/bindings_cuda.h"
#endif

namespace {

// An [n, cols] matrix whose rows may be strided (a column slice of a wider
// one), with unit column stride.
void check_rows(const torch::Tensor& t, const char* name, int64_t n, int64_t cols,
                torch::ScalarType dtype) {
  TORCH_CHECK(t.scalar_type() == dtype, name, " has dtype ", t.scalar_type(), ", expected ", dtype);
  TORCH_CHECK(t.dim() == 2 && t.size(0) == n && t.size(1) == cols, name, " must be [", n, ", ",
              cols, "]");
  TORCH_CHECK(t.stride(1) == 1 && t.stride(0) >= cols, name,
              " must have contiguous rows (unit column stride)");
}

void check_input(const torch::Tensor& t, const char* name, int64_t n, int64_t cols,
                 torch::ScalarType dtype) {
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == dtype, name, " has dtype ", t.scalar_type(), ", expected ", dtype);
  TORCH_CHECK(t.size(0) == n, name, " has ", t.size(0), " rows, expected ", n);
  if (cols > 0) TORCH_CHECK(t.dim() == 2 && t.size(1) == cols, name, " must be [N, ", cols, "]");
}

template <typename T>
splat::SurfelArrays<T> surfel_arrays(SPLAT_SURFEL_PARAMS) {
  const int64_t n = Tuvw.size(0);
  const auto dtype = Tuvw.scalar_type();
  check_input(Tuvw, "Tuvw", n, 9, dtype);
  check_input(center, "center", n, 2, dtype);
  check_input(normal, "normal", n, 3, dtype);
  check_input(color, "color", n, 3, dtype);
  check_input(opacity, "opacity", n, 0, dtype);
  check_input(depth, "depth", n, 0, dtype);
  check_input(pixel_rect, "pixel_rect", n, 4, torch::kInt32);
  TORCH_CHECK(n < (int64_t(1) << 31), "too many surfels");
  return splat::SurfelArrays<T>{Tuvw.data_ptr<T>(),
                                center.data_ptr<T>(),
                                normal.data_ptr<T>(),
                                color.data_ptr<T>(),
                                opacity.data_ptr<T>(),
                                depth.data_ptr<T>(),
                                pixel_rect.data_ptr<int32_t>(),
                                n,
                                static_cast<int>(width),
                                static_cast<int>(height),
                                static_cast<T>(near),
                                static_cast<T>(far)};
}

// torch::empty, in reused memory (cpu/scratch.h) when large: the kernels'
// outputs are allocated again at every call, and fresh pages are expensive.
torch::Tensor scratch_empty(c10::IntArrayRef sizes, const torch::TensorOptions& opts) {
  int64_t numel = 1;
  for (const int64_t s : sizes) numel *= s;
  const size_t bytes = size_t(numel) * opts.dtype().itemsize();
  if (bytes < splat::kScratchMinBytes) return torch::empty(sizes, opts);
  return torch::from_blob(
      splat::scratch_acquire(bytes), sizes, [](void* block) { splat::scratch_release(block); },
      opts);
}

int tiles_along(int64_t pixels) {
  return static_cast<int>((pixels + splat::kTileSize - 1) / splat::kTileSize);
}

// The forward pass's per-pixel outputs (ForwardOutputs) and the tile binning
// it keeps for the backward pass, in scratch memory: one copy for surfels and
// 3D Gaussians.
struct ForwardImages {
  torch::Tensor color_sum, transmittance, depth_sum, normal_sum, distortion, median_depth, end,
      median_index, totals, point_list;
  std::vector<int64_t> offsets;
  int tiles_x, tiles_y;

  ForwardImages(const torch::TensorOptions& opts, int64_t width, int64_t height)
      : tiles_x(tiles_along(width)), tiles_y(tiles_along(height)) {
    const auto iopts = opts.dtype(torch::kInt32);
    color_sum = scratch_empty({height, width, 3}, opts);
    transmittance = scratch_empty({height, width}, opts);
    depth_sum = scratch_empty({height, width}, opts);
    normal_sum = scratch_empty({height, width, 3}, opts);
    distortion = scratch_empty({height, width}, opts);
    median_depth = scratch_empty({height, width}, opts);
    end = scratch_empty({height, width}, iopts);
    median_index = scratch_empty({height, width}, iopts);
    totals = scratch_empty({height, width, splat::kTotalsSize}, opts);
  }

  // Sorts and lists the n primitives per tile (rasterize_cpu.h bin_tiles_cpu).
  template <typename T>
  splat::TileBins bin(int64_t n, const T* depth, const int32_t* pixel_rect) {
    const auto iopts = end.options();
    splat::bin_tiles_cpu<T>(n, depth, pixel_rect, tiles_x, tiles_y, offsets, [&](int64_t count) {
      point_list = scratch_empty({count}, iopts);
      return point_list.data_ptr<int32_t>();
    });
    return splat::TileBins{offsets.data(), point_list.data_ptr<int32_t>(), tiles_x, tiles_y};
  }

  template <typename T>
  splat::ForwardOutputs<T> outputs() {
    return splat::ForwardOutputs<T>{
        color_sum.data_ptr<T>(),  transmittance.data_ptr<T>(),      depth_sum.data_ptr<T>(),
        normal_sum.data_ptr<T>(), distortion.data_ptr<T>(),         median_depth.data_ptr<T>(),
        end.data_ptr<int32_t>(),  median_index.data_ptr<int32_t>(), totals.data_ptr<T>()};
  }

  // The ops' return value: the six images, the saved state, the binning.
  std::vector<torch::Tensor> results() {
    auto tile_offsets =
        torch::from_blob(offsets.data(), {int64_t(offsets.size())}, torch::kInt64).clone();
    return {color_sum, transmittance, depth_sum, normal_sum,   distortion, median_depth,
            end,       median_index,  totals,    tile_offsets, point_list};
  }
};

std::vector<torch::Tensor> forward_cpu(SPLAT_SURFEL_PARAMS) {
  ForwardImages images(Tuvw.options(), width, height);
  torch::Tensor packed;
  AT_DISPATCH_FLOATING_TYPES(Tuvw.scalar_type(), "splat_forward_cpu", [&] {
    auto s = surfel_arrays<scalar_t>(SPLAT_SURFEL_NAMES);
    const auto bins = images.bin<scalar_t>(s.num_surfels, s.depth, s.pixel_rect);
    // The SIMD kernels' packed surfel records, returned for the backward pass.
    packed = scratch_empty({splat::packed_surfel_bytes<scalar_t>(Tuvw.size(0))},
                           Tuvw.options().dtype(torch::kUInt8));
    splat::forward_cpu<scalar_t>(s, bins, images.outputs<scalar_t>(),
                                 packed.numel() ? packed.data_ptr<uint8_t>() : nullptr);
  });
  auto results = images.results();
  results.push_back(packed);
  return results;
}

// The six upstream gradients of a backward pass.  Each is contiguous, or
// broadcast: one value (per channel) for every pixel, as autograd hands over
// for a sum or mean.
template <typename T>
splat::UpstreamGrads<T> upstream_grads(const torch::Tensor& v_color_sum,
                                       const torch::Tensor& v_transmittance,
                                       const torch::Tensor& v_depth_sum,
                                       const torch::Tensor& v_normal_sum,
                                       const torch::Tensor& v_distortion,
                                       const torch::Tensor& v_median_depth, int64_t width,
                                       int64_t height) {
  const torch::Tensor* ups[6] = {&v_color_sum,  &v_transmittance, &v_depth_sum,
                                 &v_normal_sum, &v_distortion,    &v_median_depth};
  const char* up_names[6] = {"v_color_sum",  "v_transmittance", "v_depth_sum",
                             "v_normal_sum", "v_distortion",    "v_median_depth"};
  int64_t pixel_stride[6], channel_stride[6];
  for (int a = 0; a < 6; ++a) {
    const torch::Tensor& t = *ups[a];
    const int64_t channels = (a == 0 || a == 3) ? 3 : 0;
    TORCH_CHECK(t.scalar_type() == c10::CppTypeToScalarType<T>::value &&
                    t.dim() == (channels ? 3 : 2) && t.size(0) == height && t.size(1) == width &&
                    (!channels || t.size(2) == channels),
                up_names[a], " must be [H, W", channels ? ", 3" : "", "] of the input dtype");
    const bool broadcast = t.stride(0) == 0 && t.stride(1) == 0 && (!channels || t.stride(2) <= 1);
    TORCH_CHECK(t.is_contiguous() || broadcast, up_names[a],
                " must be contiguous or broadcast to every pixel");
    pixel_stride[a] = broadcast ? 0 : (channels ? channels : 1);
    channel_stride[a] = channels ? t.stride(2) : 0;
  }
  splat::UpstreamGrads<T> up{v_color_sum.data_ptr<T>(),  v_transmittance.data_ptr<T>(),
                             v_depth_sum.data_ptr<T>(),  v_normal_sum.data_ptr<T>(),
                             v_distortion.data_ptr<T>(), v_median_depth.data_ptr<T>()};
  for (int a = 0; a < 6; ++a) up.pixel_stride[a] = pixel_stride[a];
  up.color_channel_stride = channel_stride[0];
  up.normal_channel_stride = channel_stride[3];
  return up;
}

// packed: forward_cpu's last result (the SIMD kernels' surfel records).
torch::Tensor backward_cpu(SPLAT_SURFEL_PARAMS, SPLAT_BACKWARD_STATE_PARAMS,
                           const torch::Tensor& packed) {
  auto v_surfels = scratch_empty({Tuvw.size(0), splat::kGradSize}, Tuvw.options());
  const int tiles_x = tiles_along(width), tiles_y = tiles_along(height);
  AT_DISPATCH_FLOATING_TYPES(Tuvw.scalar_type(), "splat_backward_cpu", [&] {
    // forward_cpu's packed records, if they match this kernel mode (else repacked)
    const bool reuse = packed.scalar_type() == torch::kUInt8 && packed.is_contiguous() &&
                       packed.numel() > 0 &&
                       packed.numel() == splat::packed_surfel_bytes<scalar_t>(Tuvw.size(0));
    const uint8_t* packed_in = reuse ? packed.data_ptr<uint8_t>() : nullptr;
    auto s = surfel_arrays<scalar_t>(SPLAT_SURFEL_NAMES);
    splat::TileBins bins{tile_offsets.data_ptr<int64_t>(), point_list.data_ptr<int32_t>(), tiles_x,
                         tiles_y};
    const auto up =
        upstream_grads<scalar_t>(v_color_sum, v_transmittance, v_depth_sum, v_normal_sum,
                                 v_distortion, v_median_depth, width, height);
    splat::backward_cpu<scalar_t>(s, bins, end.data_ptr<int32_t>(),
                                  median_index.data_ptr<int32_t>(),
                                  transmittance.data_ptr<scalar_t>(), totals.data_ptr<scalar_t>(),
                                  up, v_surfels.data_ptr<scalar_t>(), packed_in);
  });
  return v_surfels;
}

// 3D Gaussians (cpu/gaussians_cpu.h): params [N, kGaussParams], color [N, 3],
// depth [N] (sort key), pixel_rect [N, 4].  Same outputs and saved state as
// forward_cpu (no packed records).
template <typename T>
splat::GaussianArrays<T> gaussian_arrays(SPLAT_GAUSSIAN_PARAMS) {
  const int64_t n = params.size(0);
  const auto dtype = params.scalar_type();
  check_input(params, "params", n, splat::kGaussParams, dtype);
  check_input(color, "color", n, 3, dtype);
  check_input(depth, "depth", n, 0, dtype);
  check_input(pixel_rect, "pixel_rect", n, 4, torch::kInt32);
  TORCH_CHECK(n < (int64_t(1) << 31), "too many Gaussians");
  return splat::GaussianArrays<T>{params.data_ptr<T>(),
                                  color.data_ptr<T>(),
                                  depth.data_ptr<T>(),
                                  pixel_rect.data_ptr<int32_t>(),
                                  n,
                                  static_cast<int>(width),
                                  static_cast<int>(height),
                                  static_cast<T>(near),
                                  static_cast<T>(far)};
}

std::vector<torch::Tensor> forward_gaussians(SPLAT_GAUSSIAN_PARAMS) {
  ForwardImages images(params.options(), width, height);
  AT_DISPATCH_FLOATING_TYPES(params.scalar_type(), "splat_forward_gaussians_cpu", [&] {
    const auto g = gaussian_arrays<scalar_t>(SPLAT_GAUSSIAN_NAMES);
    const auto bins = images.bin<scalar_t>(g.num_gaussians, g.depth, g.pixel_rect);
    splat::forward_gaussians_cpu<scalar_t>(g, bins, images.outputs<scalar_t>());
  });
  return images.results();
}

torch::Tensor backward_gaussians(SPLAT_GAUSSIAN_PARAMS, SPLAT_BACKWARD_STATE_PARAMS) {
  auto v_gaussians = scratch_empty({params.size(0), splat::kGaussGradSize}, params.options());
  const int tiles_x = tiles_along(width), tiles_y = tiles_along(height);
  AT_DISPATCH_FLOATING_TYPES(params.scalar_type(), "splat_backward_gaussians_cpu", [&] {
    const auto g = gaussian_arrays<scalar_t>(SPLAT_GAUSSIAN_NAMES);
    splat::TileBins bins{tile_offsets.data_ptr<int64_t>(), point_list.data_ptr<int32_t>(), tiles_x,
                         tiles_y};
    const auto up =
        upstream_grads<scalar_t>(v_color_sum, v_transmittance, v_depth_sum, v_normal_sum,
                                 v_distortion, v_median_depth, width, height);
    splat::backward_gaussians_cpu<scalar_t>(
        g, bins, end.data_ptr<int32_t>(), median_index.data_ptr<int32_t>(),
        transmittance.data_ptr<scalar_t>(), totals.data_ptr<scalar_t>(), up,
        v_gaussians.data_ptr<scalar_t>());
  });
  return v_gaussians;
}

// The fused projection (cpu/project_cpu.h).  coeffs: [N, K, 3] SH
// coefficients, or an empty tensor for no colour output.
template <typename T>
splat::ProjectInputs<T> project_inputs(const torch::Tensor& means, const torch::Tensor& quats,
                                       const torch::Tensor& scales, const torch::Tensor& opacities,
                                       const torch::Tensor& coeffs, int64_t sh_degree,
                                       const torch::Tensor& viewmat, const torch::Tensor& K,
                                       int64_t width, int64_t height, double near, double far) {
  const int64_t n = means.size(0);
  const auto dtype = means.scalar_type();
  check_input(means, "means", n, 3, dtype);
  check_input(quats, "quats", n, 4, dtype);
  check_input(scales, "scales", n, 2, dtype);
  check_input(opacities, "opacities", n, 0, dtype);
  const bool with_sh = coeffs.numel() > 0;
  if (with_sh) {
    check_input(coeffs, "coeffs", n, 0, dtype);
    TORCH_CHECK(coeffs.dim() == 3 && coeffs.size(2) == 3, "coeffs must be [N, K, 3]");
    TORCH_CHECK(
        sh_degree >= 0 && sh_degree <= 3 && coeffs.size(1) >= (sh_degree + 1) * (sh_degree + 1),
        "coeffs has too few SH coefficients for sh_degree ", sh_degree);
  }
  TORCH_CHECK(viewmat.numel() == 16 && K.numel() == 9, "viewmat must be [4, 4] and K [3, 3]");
  splat::ProjectInputs<T> in{};
  in.means = means.data_ptr<T>();
  in.quats = quats.data_ptr<T>();
  in.scales = scales.data_ptr<T>();
  in.opacities = opacities.data_ptr<T>();
  in.coeffs = with_sh ? coeffs.data_ptr<T>() : nullptr;
  in.num_coeffs = with_sh ? coeffs.size(1) : 0;
  in.sh_degree = static_cast<int>(sh_degree);
  const auto V = viewmat.to(torch::kCPU).contiguous(), Kc = K.to(torch::kCPU).contiguous();
  for (int k = 0; k < 16; ++k) in.viewmat[k] = V.data_ptr<T>()[k];
  for (int k = 0; k < 9; ++k) in.K[k] = Kc.data_ptr<T>()[k];
  in.n = n;
  in.width = static_cast<int>(width);
  in.height = static_cast<int>(height);
  in.near = near;
  in.far = far;
  return in;
}

std::vector<torch::Tensor> project_forward(const torch::Tensor& means, const torch::Tensor& quats,
                                           const torch::Tensor& scales,
                                           const torch::Tensor& opacities,
                                           const torch::Tensor& coeffs, int64_t sh_degree,
                                           const torch::Tensor& viewmat, const torch::Tensor& K,
                                           int64_t width, int64_t height, double near, double far,
                                           double limit_finite, double limit_drawn) {
  const int64_t n = means.size(0);
  const auto opts = means.options();
  auto Tuvw = scratch_empty({n, 9}, opts), center = scratch_empty({n, 2}, opts);
  auto normal = scratch_empty({n, 3}, opts), depth = scratch_empty({n}, opts);
  auto color = scratch_empty({coeffs.numel() > 0 ? n : 0, 3}, opts);
  auto rect = scratch_empty({n, 4}, opts.dtype(torch::kInt32));
  auto radii = scratch_empty({n}, opts.dtype(torch::kInt32));
  int64_t bad = 0;
  AT_DISPATCH_FLOATING_TYPES(means.scalar_type(), "splat_project_forward", [&] {
    auto in = project_inputs<scalar_t>(means, quats, scales, opacities, coeffs, sh_degree, viewmat,
                                       K, width, height, near, far);
    in.limit_finite = limit_finite;
    in.limit_drawn = limit_drawn;
    splat::ProjectOutputs<scalar_t> out{Tuvw.data_ptr<scalar_t>(),   center.data_ptr<scalar_t>(),
                                        normal.data_ptr<scalar_t>(), color.data_ptr<scalar_t>(),
                                        depth.data_ptr<scalar_t>(),  rect.data_ptr<int32_t>(),
                                        radii.data_ptr<int32_t>()};
    bad = splat::project_forward_cpu<scalar_t>(in, out);
  });
  return {Tuvw, center, normal, color, depth, rect, radii, torch::tensor(bad)};
}

std::vector<torch::Tensor> project_backward(
    const torch::Tensor& means, const torch::Tensor& quats, const torch::Tensor& scales,
    const torch::Tensor& opacities, const torch::Tensor& coeffs, int64_t sh_degree,
    const torch::Tensor& viewmat, const torch::Tensor& K, int64_t width, int64_t height,
    double near, double far, const torch::Tensor& v_Tuvw, const torch::Tensor& v_center,
    const torch::Tensor& v_normal, const torch::Tensor& v_color) {
  const int64_t n = means.size(0);
  const auto opts = means.options();
  check_rows(v_Tuvw, "v_Tuvw", n, 9, means.scalar_type());
  check_rows(v_center, "v_center", n, 2, means.scalar_type());
  check_rows(v_normal, "v_normal", n, 3, means.scalar_type());
  if (coeffs.numel() > 0) check_rows(v_color, "v_color", n, 3, means.scalar_type());
  auto v_means = scratch_empty({n, 3}, opts), v_quats = scratch_empty({n, 4}, opts);
  auto v_scales = scratch_empty({n, 2}, opts), v_means2d = scratch_empty({n, 2}, opts);
  auto v_coeffs = torch::empty_like(coeffs);
  AT_DISPATCH_FLOATING_TYPES(means.scalar_type(), "splat_project_backward", [&] {
    auto in = project_inputs<scalar_t>(means, quats, scales, opacities, coeffs, sh_degree, viewmat,
                                       K, width, height, near, far);
    const bool with_sh = coeffs.numel() > 0;
    splat::ProjectGrads<scalar_t> g{
        v_Tuvw.data_ptr<scalar_t>(),   v_center.data_ptr<scalar_t>(),
        v_normal.data_ptr<scalar_t>(), with_sh ? v_color.data_ptr<scalar_t>() : nullptr,
        v_means.data_ptr<scalar_t>(),  v_quats.data_ptr<scalar_t>(),
        v_scales.data_ptr<scalar_t>(), with_sh ? v_coeffs.data_ptr<scalar_t>() : nullptr,
        v_means2d.data_ptr<scalar_t>()};
    g.v_Tuvw_row_stride = v_Tuvw.stride(0);
    g.v_center_row_stride = v_center.stride(0);
    g.v_normal_row_stride = v_normal.stride(0);
    g.v_color_row_stride = with_sh ? v_color.stride(0) : 3;
    splat::project_backward_cpu<scalar_t>(in, g);
  });
  return {v_means, v_quats, v_scales, v_coeffs, v_means2d};
}

// The fused SSIM (cpu/ssim_cpu.h).  x, y: [H, W, C] of one floating dtype;
// window: [K] (K odd) of that dtype.
template <typename T>
splat::SsimArgs<T> ssim_args(const torch::Tensor& x, const torch::Tensor& y,
                             const torch::Tensor& window, double c1, double c2) {
  TORCH_CHECK(x.dim() == 3 && y.sizes() == x.sizes(), "ssim: x and y must both be [H, W, C]");
  TORCH_CHECK(x.is_contiguous() && y.is_contiguous() && window.is_contiguous() &&
                  y.scalar_type() == x.scalar_type() && window.scalar_type() == x.scalar_type(),
              "ssim: x, y and window must be contiguous and of one dtype");
  TORCH_CHECK(window.dim() == 1 && window.size(0) % 2 == 1, "ssim: window must be [K], K odd");
  splat::SsimArgs<T> a{x.data_ptr<T>(),
                       y.data_ptr<T>(),
                       window.data_ptr<T>(),
                       static_cast<int>(window.size(0)),
                       x.size(0),
                       x.size(1),
                       x.size(2),
                       c1,
                       c2};
  return a;
}

// Returns (mean SSIM as a 0-d tensor, the [3, H, W, C] gradient maps or an empty tensor).
std::vector<torch::Tensor> ssim_forward(const torch::Tensor& x, const torch::Tensor& y,
                                        const torch::Tensor& window, double c1, double c2,
                                        bool with_grad) {
  auto maps = scratch_empty(with_grad ? std::vector<int64_t>{3, x.size(0), x.size(1), x.size(2)}
                                      : std::vector<int64_t>{0},
                            x.options());
  double mean = 0.0;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "splat_ssim_forward", [&] {
    mean = splat::ssim_forward_cpu(ssim_args<scalar_t>(x, y, window, c1, c2),
                                   with_grad ? maps.data_ptr<scalar_t>() : nullptr);
  });
  return {torch::tensor(mean, x.options()), maps};
}

torch::Tensor ssim_backward(const torch::Tensor& x, const torch::Tensor& y,
                            const torch::Tensor& window, double c1, double c2,
                            const torch::Tensor& maps, double scale) {
  TORCH_CHECK(maps.is_contiguous() && maps.dim() == 4 && maps.size(0) == 3 &&
                  maps.sizes().slice(1) == x.sizes() && maps.scalar_type() == x.scalar_type(),
              "ssim: gradient maps must be [3, H, W, C] of x's dtype");
  auto dx = scratch_empty(x.sizes(), x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "splat_ssim_backward", [&] {
    splat::ssim_backward_cpu(ssim_args<scalar_t>(x, y, window, c1, c2), maps.data_ptr<scalar_t>(),
                             scale, dx.data_ptr<scalar_t>());
  });
  return dx;
}

// The fused depth-normal consistency loss (cpu/normal_loss_cpu.h).
template <typename T>
splat::NormalLossArgs<T> normal_loss_args(const torch::Tensor& depth, const torch::Tensor& normal,
                                          const torch::Tensor& alpha, const torch::Tensor& K,
                                          const torch::Tensor& viewmat) {
  TORCH_CHECK(depth.dim() == 2, "normal loss: depth must be [H, W]");
  const int64_t H = depth.size(0), W = depth.size(1);
  TORCH_CHECK(
      normal.dim() == 3 && normal.size(0) == H && normal.size(1) == W && normal.size(2) == 3,
      "normal loss: normal must be [H, W, 3]");
  TORCH_CHECK(alpha.dim() == 2 && alpha.size(0) == H && alpha.size(1) == W,
              "normal loss: alpha must be [H, W]");
  for (const auto* t : {&depth, &normal, &alpha})
    TORCH_CHECK(t->is_contiguous() && t->scalar_type() == depth.scalar_type(),
                "normal loss: depth, normal and alpha must be contiguous and of one dtype");
  TORCH_CHECK(K.numel() == 9 && viewmat.numel() == 16,
              "normal loss: K must be [3, 3] and viewmat [4, 4]");
  const auto Kd = K.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  const auto Vd = viewmat.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  splat::NormalLossArgs<T> a{};
  a.depth = depth.data_ptr<T>();
  a.normal = normal.data_ptr<T>();
  a.alpha = alpha.data_ptr<T>();
  const double* k = Kd.data_ptr<double>();
  a.fx = k[0], a.fy = k[4], a.cx = k[2], a.cy = k[5];
  const double* v = Vd.data_ptr<double>();
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c) a.R[3 * r + c] = v[4 * r + c];
  a.height = H;
  a.width = W;
  return a;
}

torch::Tensor normal_loss_forward(const torch::Tensor& depth, const torch::Tensor& normal,
                                  const torch::Tensor& alpha, const torch::Tensor& K,
                                  const torch::Tensor& viewmat) {
  double loss = 0.0;
  AT_DISPATCH_FLOATING_TYPES(depth.scalar_type(), "splat_normal_loss_forward", [&] {
    loss = splat::normal_loss_forward_cpu<scalar_t>(
        normal_loss_args<scalar_t>(depth, normal, alpha, K, viewmat));
  });
  return torch::tensor(loss, depth.options());
}

std::vector<torch::Tensor> normal_loss_backward(const torch::Tensor& depth,
                                                const torch::Tensor& normal,
                                                const torch::Tensor& alpha, const torch::Tensor& K,
                                                const torch::Tensor& viewmat, double scale) {
  auto v_depth = scratch_empty(depth.sizes(), depth.options());
  auto v_normal = scratch_empty(normal.sizes(), normal.options());
  AT_DISPATCH_FLOATING_TYPES(depth.scalar_type(), "splat_normal_loss_backward", [&] {
    splat::normal_loss_backward_cpu<scalar_t>(
        normal_loss_args<scalar_t>(depth, normal, alpha, K, viewmat), scale,
        v_depth.data_ptr<scalar_t>(), v_normal.data_ptr<scalar_t>());
  });
  return {v_depth, v_normal};
}

// core.h's float32 exp, one element at a time and 8 lanes at a time (tests).
std::vector<torch::Tensor> exp_float32(const torch::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.is_contiguous() && x.dim() == 1 &&
                  x.size(0) % splat::kLanes == 0,
              "x must be a contiguous float32 vector whose length is a multiple of 8");
  auto scalar = torch::empty_like(x), lanes = torch::empty_like(x);
  const float* src = x.data_ptr<float>();
  for (int64_t i = 0; i < x.size(0); ++i) scalar.data_ptr<float>()[i] = splat::exp_of(src[i]);
  for (int64_t i = 0; i < x.size(0); i += splat::kLanes)
    splat::store8(lanes.data_ptr<float>() + i, splat::exp_of(splat::load8(src + i)));
  return {scalar, lanes};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "splat rasterizer kernels (CPU always; CUDA when built with it)";
  m.def("forward_cpu", &forward_cpu, "rasterize forward on the CPU");
  m.def("backward_cpu", &backward_cpu, "rasterize backward on the CPU");
  m.def("forward_gaussians_cpu", &forward_gaussians, "rasterize 3D Gaussians forward on the CPU");
  m.def("backward_gaussians_cpu", &backward_gaussians, "its backward: [N, gauss_grad_record_size]");
  m.def("project_forward_cpu", &project_forward, "fused per-surfel projection on the CPU");
  m.def("project_backward_cpu", &project_backward, "its exact backward");
  m.def("ssim_forward_cpu", &ssim_forward, "fused SSIM (mean) and its gradient maps on the CPU");
  m.def("ssim_backward_cpu", &ssim_backward, "its backward: d mean(SSIM) / dx, scaled");
  m.def("normal_loss_forward_cpu", &normal_loss_forward,
        "fused depth-normal consistency loss on the CPU");
  m.def("normal_loss_backward_cpu", &normal_loss_backward,
        "its backward: (d/ddepth, d/dnormal), scaled");
  m.def(
      "set_cpu_kernel_mode",
      [](int64_t mode) {
        TORCH_CHECK(mode >= 0 && mode <= 2,
                    "CPU kernel mode must be 0 (reference), 1 (scalar) or 2 (simd)");
        splat::set_cpu_kernel_mode(static_cast<int>(mode));
      },
      "0: pixel by pixel over rectangles, 1: over exact spans, 2: 8 float32 lanes (default)");
  m.def("cpu_kernel_mode", &splat::cpu_kernel_mode);
  m.def(
      "release_cpu_scratch", [] { return int64_t(splat::release_scratch_cache()); },
      "frees the CPU kernels' cached buffers (cpu/scratch.h); returns the bytes freed");
  m.def("exp_float32", &exp_float32, "core.h's float32 exp: (scalar, 8 lanes)");
#ifdef SPLAT_WITH_CUDA
  m.def("forward_cuda", &splat::forward_cuda, "rasterize forward on the GPU");
  m.def("backward_cuda", &splat::backward_cuda, "rasterize backward on the GPU");
  m.def("forward_gaussians_cuda", &splat::forward_gaussians_cuda,
        "rasterize 3D Gaussians forward on the GPU");
  m.def("backward_gaussians_cuda", &splat::backward_gaussians_cuda,
        "its backward: [N, gauss_grad_record_size]");
  m.def("project_forward_cuda", &splat::project_forward_cuda,
        "fused per-surfel projection on the GPU");
  m.def("project_backward_cuda", &splat::project_backward_cuda, "its exact backward");
  m.def("project_gaussians_forward_cuda", &splat::project_gaussians_forward_cuda,
        "fused culling and projection of 3D Gaussians on the GPU");
  m.def("project_gaussians_backward_cuda", &splat::project_gaussians_backward_cuda,
        "its exact backward");
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  m.attr("grad_record_size") = splat::kGradSize;
  m.attr("gauss_params_size") = splat::kGaussParams;
  m.attr("gauss_grad_record_size") = splat::kGaussGradSize;
  m.attr("tile_size") = splat::kTileSize;
}
