// Torch glue of the CUDA backend in the source build's extension splat._C
// (compiled by the host C++ compiler in the CUDAExtension; the kernels in *.cu
// see raw pointers only).
//
// It calls the C ABI of the CUDA kernels (splat_cuda_api.h, capi_cuda.cpp,
// compiled into the same extension), so the call sequence (validation with
// messages that name the argument, allocation, binning, render, backward) is
// host_sequence.h's, the one libsplat_cuda.so and the CUDA emulation harness
// run.  This file only supplies the torch specifics: tensors become
// descriptors, torch's current stream of the inputs' device is where the work
// goes (so it orders correctly with the surrounding torch ops and streams
// chosen by the caller), and every buffer is allocated through torch (the
// caching allocator: no cudaMalloc, no sync, memory freed stream-ordered).
//
// Host syncs: exactly one per forward call, inside gpu::bin_count, to learn
// the number of (tile, surfel) pairs before allocating them; so a forward call
// cannot be captured in a CUDA graph.  The render and the backward pass never
// sync.
#include "bindings_cuda.h"

// c10's stream header rather than ATen/cuda/CUDAContext.h: same function
// (at::cuda::getCurrentCUDAStream is c10::cuda's), without pulling in the
// cuBLAS/cuSPARSE headers.
#include <c10/cuda/CUDAStream.h>

#include <map>
#include <string>

#include "../splat_cuda_api.h"

namespace splat {
namespace {

int32_t dtype_code(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat32:
      return SPLAT_DTYPE_FLOAT32;
    case torch::kFloat64:
      return SPLAT_DTYPE_FLOAT64;
    case torch::kInt32:
      return SPLAT_DTYPE_INT32;
    case torch::kInt64:
      return SPLAT_DTYPE_INT64;
    case torch::kUInt8:
      return SPLAT_DTYPE_UINT8;
    default:
      return SPLAT_DTYPE_OTHER;
  }
}

SplatTensorArg describe(const torch::Tensor& t, const char* name) {
  SplatTensorArg a{};
  if (!t.defined()) {
    a.ndim = -1;
    return a;
  }
  TORCH_CHECK(t.dim() <= 4, name, " has shape ", t.sizes(), ": at most 4 dimensions");
  a.data = t.data_ptr();
  a.ndim = int32_t(t.dim());
  for (int64_t i = 0; i < t.dim(); ++i) a.shape[i] = t.size(i);
  a.dtype = dtype_code(t.scalar_type());
  a.device_type = t.is_cuda() ? 2 : t.is_cpu() ? 1 : 0;
  a.device_id = t.is_cuda() ? t.device().index() : 0;
  a.contiguous = t.is_contiguous();
  return a;
}

// The buffers of one call: outputs by slot, scratch until the call returns.
struct TorchAllocation {
  torch::Device device;
  std::map<int32_t, torch::Tensor> outputs;
  std::vector<torch::Tensor> scratch;
  std::string error;
};

int allocate(void* ctx, int32_t slot, int32_t dtype, int32_t ndim, const int64_t* shape,
             void** data) {
  auto* call = static_cast<TorchAllocation*>(ctx);
  static const torch::ScalarType types[] = {torch::kFloat32, torch::kFloat64, torch::kInt32,
                                            torch::kInt64, torch::kUInt8};
  try {
    auto t = torch::empty(at::IntArrayRef(shape, size_t(ndim)),
                          torch::TensorOptions().dtype(types[dtype]).device(call->device));
    *data = t.data_ptr();
    if (slot >= 0)
      call->outputs[slot] = std::move(t);
    else
      call->scratch.push_back(std::move(t));
    return 0;
  } catch (const std::exception& e) {  // never across the C boundary: rethrown below
    call->error = e.what();
    return 1;
  }
}

template <class F>
std::vector<torch::Tensor> run(const torch::Tensor& first, F&& call_library) {
  // An undefined or misplaced first input is the library's to report.
  const bool cuda = first.defined() && first.is_cuda();
  TorchAllocation call{cuda ? first.device() : torch::Device(torch::kCPU), {}, {}, {}};
  void* stream = cuda ? c10::cuda::getCurrentCUDAStream(first.device().index()).stream() : nullptr;
  char err[512] = {0};
  const int failed = call_library(stream, &call, err);
  TORCH_CHECK(call.error.empty(), call.error);
  TORCH_CHECK(!failed, err);
  std::vector<torch::Tensor> outputs;
  for (auto& kv : call.outputs) outputs.push_back(kv.second);
  return outputs;
}

std::vector<SplatTensorArg> describe_all(std::initializer_list<const torch::Tensor*> tensors,
                                         std::initializer_list<const char*> names) {
  std::vector<SplatTensorArg> out;
  auto name = names.begin();
  for (const torch::Tensor* t : tensors) out.push_back(describe(*t, *name++));
  return out;
}

// The saved state and the upstream gradients (made contiguous: autograd may
// hand over expanded, stride-0 tensors; free when they are not).
struct BackwardArgs {
  std::vector<torch::Tensor> up;
  std::vector<SplatTensorArg> state, up_args;
};
BackwardArgs backward_args(SPLAT_BACKWARD_STATE_PARAMS) {
  BackwardArgs b;
  b.state = describe_all(
      {&tile_offsets, &point_list, &end, &median_index, &transmittance, &totals},
      {"tile_offsets", "point_list", "end", "median_index", "transmittance", "totals"});
  const char* names[6] = {"v_color_sum",  "v_transmittance", "v_depth_sum",
                          "v_normal_sum", "v_distortion",    "v_median_depth"};
  for (const torch::Tensor* t : {&v_color_sum, &v_transmittance, &v_depth_sum, &v_normal_sum,
                                 &v_distortion, &v_median_depth})
    b.up.push_back(t->defined() ? t->contiguous() : *t);
  for (int i = 0; i < 6; ++i) b.up_args.push_back(describe(b.up[i], names[i]));
  return b;
}

}  // namespace

std::vector<torch::Tensor> forward_cuda(SPLAT_SURFEL_PARAMS) {
  const auto in =
      describe_all({&Tuvw, &center, &normal, &color, &opacity, &depth, &pixel_rect},
                   {"Tuvw", "center", "normal", "color", "opacity", "depth", "pixel_rect"});
  return run(Tuvw, [&](void* stream, void* ctx, char* err) {
    return splat_forward_cuda(in.data(), width, height, near, far, stream, allocate, ctx, err, 512);
  });
}

torch::Tensor backward_cuda(SPLAT_SURFEL_PARAMS, SPLAT_BACKWARD_STATE_PARAMS) {
  const auto in =
      describe_all({&Tuvw, &center, &normal, &color, &opacity, &depth, &pixel_rect},
                   {"Tuvw", "center", "normal", "color", "opacity", "depth", "pixel_rect"});
  const BackwardArgs b = backward_args(SPLAT_BACKWARD_STATE_NAMES);
  return run(Tuvw, [&](void* stream, void* ctx, char* err) {
    return splat_backward_cuda(in.data(), width, height, near, far, b.state.data(),
                               b.up_args.data(), stream, allocate, ctx, err, 512);
  })[0];
}

std::vector<torch::Tensor> forward_gaussians_cuda(SPLAT_GAUSSIAN_PARAMS) {
  const auto in = describe_all({&params, &color, &depth, &pixel_rect},
                               {"params", "color", "depth", "pixel_rect"});
  return run(params, [&](void* stream, void* ctx, char* err) {
    return splat_forward_gaussians_cuda(in.data(), width, height, near, far, stream, allocate, ctx,
                                        err, 512);
  });
}

torch::Tensor backward_gaussians_cuda(SPLAT_GAUSSIAN_PARAMS, SPLAT_BACKWARD_STATE_PARAMS) {
  const auto in = describe_all({&params, &color, &depth, &pixel_rect},
                               {"params", "color", "depth", "pixel_rect"});
  const BackwardArgs b = backward_args(SPLAT_BACKWARD_STATE_NAMES);
  return run(params, [&](void* stream, void* ctx, char* err) {
    return splat_backward_gaussians_cuda(in.data(), width, height, near, far, b.state.data(),
                                         b.up_args.data(), stream, allocate, ctx, err, 512);
  })[0];
}

std::vector<torch::Tensor> project_forward_cuda(
    const torch::Tensor& means, const torch::Tensor& quats, const torch::Tensor& scales,
    const torch::Tensor& opacities, const torch::Tensor& coeffs, int64_t sh_degree,
    const torch::Tensor& viewmat, const torch::Tensor& K, int64_t width, int64_t height,
    double near, double far, double limit_finite, double limit_drawn) {
  const auto in = describe_all({&means, &quats, &scales, &opacities, &coeffs, &viewmat, &K},
                               {"means", "quats", "scales", "opacities", "coeffs", "viewmat", "K"});
  return run(means, [&](void* stream, void* ctx, char* err) {
    return splat_project_forward_cuda(in.data(), sh_degree, width, height, near, far, limit_finite,
                                      limit_drawn, stream, allocate, ctx, err, 512);
  });
}

std::vector<torch::Tensor> project_backward_cuda(
    const torch::Tensor& means, const torch::Tensor& quats, const torch::Tensor& scales,
    const torch::Tensor& opacities, const torch::Tensor& coeffs, int64_t sh_degree,
    const torch::Tensor& viewmat, const torch::Tensor& K, int64_t width, int64_t height,
    double near, double far, const torch::Tensor& v_Tuvw, const torch::Tensor& v_center,
    const torch::Tensor& v_normal, const torch::Tensor& v_color) {
  const auto in = describe_all({&means, &quats, &scales, &opacities, &coeffs, &viewmat, &K},
                               {"means", "quats", "scales", "opacities", "coeffs", "viewmat", "K"});
  // the rasterizer's gradients arrive as column slices of its [N, 18] records
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor* t : {&v_Tuvw, &v_center, &v_normal, &v_color})
    grads.push_back(t->defined() ? t->contiguous() : *t);
  const auto g = describe_all({&grads[0], &grads[1], &grads[2], &grads[3]},
                              {"v_Tuvw", "v_center", "v_normal", "v_color"});
  return run(means, [&](void* stream, void* ctx, char* err) {
    return splat_project_backward_cuda(in.data(), sh_degree, width, height, near, far, g.data(),
                                       stream, allocate, ctx, err, 512);
  });
}

std::vector<torch::Tensor> project_gaussians_forward_cuda(
    const torch::Tensor& means, const torch::Tensor& quats, const torch::Tensor& scales,
    const torch::Tensor& opacities, const torch::Tensor& viewmat, const torch::Tensor& K,
    const torch::Tensor& K_inv, int64_t width, int64_t height, double near, double far,
    bool antialiased) {
  // the camera contiguous, as the CPU op takes it (torch.linalg.inv's K^-1 is column-major)
  const torch::Tensor V = viewmat.contiguous(), Kc = K.contiguous(), Ki = K_inv.contiguous();
  const auto in = describe_all({&means, &quats, &scales, &opacities, &V, &Kc, &Ki},
                               {"means", "quats", "scales", "opacities", "viewmat", "K", "K_inv"});
  return run(means, [&](void* stream, void* ctx, char* err) {
    return splat_project_gaussians_forward_cuda(in.data(), width, height, near, far, antialiased,
                                                stream, allocate, ctx, err, 512);
  });
}

std::vector<torch::Tensor> project_gaussians_backward_cuda(
    const torch::Tensor& means, const torch::Tensor& quats, const torch::Tensor& scales,
    const torch::Tensor& opacities, const torch::Tensor& ids, const torch::Tensor& viewmat,
    const torch::Tensor& K, const torch::Tensor& K_inv, int64_t width, int64_t height,
    bool antialiased, const torch::Tensor& v_params, const std::optional<torch::Tensor>& v_centre,
    bool with_camera) {
  const torch::Tensor V = viewmat.contiguous(), Kc = K.contiguous(), Ki = K_inv.contiguous();
  const auto in =
      describe_all({&means, &quats, &scales, &opacities, &ids, &V, &Kc, &Ki},
                   {"means", "quats", "scales", "opacities", "ids", "viewmat", "K", "K_inv"});
  // the rasterizer's gradients may arrive as column slices of its records
  const torch::Tensor vp = v_params.contiguous();
  const torch::Tensor vc = v_centre.has_value() ? v_centre->contiguous() : torch::Tensor();
  const auto g = describe_all({&vp, &vc}, {"v_params", "v_centre"});
  return run(means, [&](void* stream, void* ctx, char* err) {
    return splat_project_gaussians_backward_cuda(in.data(), width, height, antialiased, g.data(),
                                                 with_camera, stream, allocate, ctx, err, 512);
  });
}

}  // namespace splat
