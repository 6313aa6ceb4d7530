// The host-side call sequence of the CUDA backend: validate, allocate, bin
// (bin_count, read back P, bin_pairs), render, and for the gradients check the
// saved forward state and launch the backward kernel; for surfels
// (forward/backward) and 3D Gaussians (forward_gaussians/backward_gaussians),
// which differ only in their inputs' checks and the kernels' overload.
//
// Torch-free (tensors are splat_cuda_api.h's SplatTensorArg descriptors,
// memory comes from the caller's allocator callback) and ONE copy, run by
// every caller through capi_cuda.cpp's C ABI:
//   * libsplat_cuda.so (the wheel's CUDA part, loaded by splat/_native_cuda.py),
//   * the torch extension of the source build (bindings_cuda.cpp, which calls
//     the same C functions with a torch allocator),
//   * the CUDA emulation harness (tests/cuda_emulation/), which compiles
//     capi_cuda.cpp with the cudaemu shim standing in for <cuda_runtime.h>,
// so what CI runs under emulation is the very sequence GPU users run.  The
// builds differ only in the `Dev` policy:
//
//   struct Dev {
//     static constexpr int32_t kDeviceType;  // 2 (CUDA), or 1 (CPU) when emulated
//     static constexpr bool kHostMemory;     // buffers readable from the host
//     static void on_alloc(void* data, size_t bytes);  // the emulation poisons
//     struct Guard { explicit Guard(int32_t device_id); };  // current device
//   };
//
// Errors are thrown as host_sequence::Error with a one-line message naming the
// argument; capi_cuda.cpp turns them into a return code and the message.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include "../core.h"
#include "../raster_args.h"
#include "../splat_cuda_api.h"
#include "project_cuda.h"
#include "rasterize_cuda.h"

namespace splat {
namespace host_sequence {

using Arg = SplatTensorArg;
constexpr int64_t kMaxInt32 = (int64_t(1) << 31) - 1;

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  throw Error(message.str());
}

#define SPLAT_CHECK(cond, ...)                              \
  do {                                                      \
    if (!(cond)) ::splat::host_sequence::fail(__VA_ARGS__); \
  } while (0)

// ---- how a message prints a tensor's parts (torch's C++ wording) -------------------
struct Sizes {
  const Arg& t;
};
inline std::ostream& operator<<(std::ostream& o, Sizes s) {
  o << '[';
  for (int32_t i = 0; i < s.t.ndim; ++i) o << (i ? ", " : "") << s.t.shape[i];
  return o << ']';
}
struct DType {
  int32_t code;
};
inline std::ostream& operator<<(std::ostream& o, DType d) {
  switch (d.code) {
    case SPLAT_DTYPE_FLOAT32:
      return o << "Float";
    case SPLAT_DTYPE_FLOAT64:
      return o << "Double";
    case SPLAT_DTYPE_INT32:
      return o << "Int";
    case SPLAT_DTYPE_INT64:
      return o << "Long";
    case SPLAT_DTYPE_UINT8:
      return o << "Byte";
  }
  return o << "an unsupported dtype";
}
struct Device {
  int32_t type, id;
  bool operator==(const Device& d) const { return type == d.type && id == d.id; }
};
inline const char* device_type_name(int32_t type) {
  return type == 2 ? "CUDA" : type == 1 ? "CPU" : "unknown-device";
}
inline std::ostream& operator<<(std::ostream& o, Device d) {
  if (d.type == 1) return o << "cpu";
  if (d.type == 2) return o << "cuda:" << d.id;
  return o << "device type " << d.type;
}
inline Device device_of(const Arg& t) { return Device{t.device_type, t.device_id}; }
inline int64_t numel(const Arg& t) {
  int64_t n = 1;
  for (int32_t i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}
template <typename T>
constexpr int32_t dtype_of();
template <>
constexpr int32_t dtype_of<float>() {
  return SPLAT_DTYPE_FLOAT32;
}
template <>
constexpr int32_t dtype_of<double>() {
  return SPLAT_DTYPE_FLOAT64;
}
inline size_t element_size(int32_t dtype) {
  return dtype == SPLAT_DTYPE_FLOAT64 || dtype == SPLAT_DTYPE_INT64 ? 8
         : dtype == SPLAT_DTYPE_UINT8                               ? 1
                                                                    : 4;
}

inline void check_cuda(cudaError_t e, const char* what) {
  SPLAT_CHECK(e == cudaSuccess, "CUDA rasterizer: ", what, " failed: ", cudaGetErrorString(e));
}

// ---- memory: the caller's allocator ----------------------------------------------
struct Buffer {
  void* data;
  int64_t numel;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

struct Allocator {
  SplatAllocFn fn;
  void* ctx;

  // A contiguous [shape] of dtype on the inputs' device; output `slot`, or
  // scratch when slot < 0.
  template <class Dev>
  Buffer get(int32_t slot, int32_t dtype, std::initializer_list<int64_t> shape,
             const char* what) const {
    int64_t dims[4] = {0, 0, 0, 0}, count = 1;
    int32_t ndim = 0;
    for (int64_t d : shape) count *= (dims[ndim++] = d);
    void* data = nullptr;
    SPLAT_CHECK(fn(ctx, slot, dtype, ndim, dims, &data) == 0, "allocating ", what, " (",
                count * int64_t(element_size(dtype)), " bytes) failed");
    SPLAT_CHECK(data != nullptr || count == 0, "the allocator returned no memory for ", what);
    if (count) Dev::on_alloc(data, size_t(count) * element_size(dtype));
    return Buffer{data, count};
  }
};

// ---- validation ---------------------------------------------------------------------
template <class Dev>
void check_tensor(const Arg& t, const char* name, const Device& device, int32_t dtype) {
  SPLAT_CHECK(t.ndim >= 0, name, " is undefined (None)");
  SPLAT_CHECK(t.device_type == Dev::kDeviceType, name, " must be a ",
              device_type_name(Dev::kDeviceType), " tensor for the CUDA backend, got one on ",
              device_of(t));
  SPLAT_CHECK(device_of(t) == device, name, " is on ", device_of(t), " but the first input is on ",
              device, ": all inputs must be on one device");
  SPLAT_CHECK(t.dtype == dtype, name, " has dtype ", DType{t.dtype}, ", expected ", DType{dtype});
  SPLAT_CHECK(t.contiguous, name, " must be contiguous");
}

// [n, cols] when cols > 0; n elements with n rows (e.g. [N] or [N, 1]) when cols == 0.
inline void check_rows(const Arg& t, const char* name, int64_t n, int64_t cols) {
  SPLAT_CHECK(t.ndim >= 1 && t.shape[0] == n, name, " has shape ", Sizes{t}, ", expected ", n,
              " rows");
  if (cols > 0) {
    SPLAT_CHECK(t.ndim == 2 && t.shape[1] == cols, name, " has shape ", Sizes{t}, ", expected [", n,
                ", ", cols, "]");
  } else {
    SPLAT_CHECK(numel(t) == n, name, " has shape ", Sizes{t}, ", expected [", n, "]");
  }
}

inline void check_image(const Arg& t, const char* name, int64_t height, int64_t width,
                        int64_t channels) {
  const bool ok = channels > 0 ? (t.ndim == 3 && t.shape[0] == height && t.shape[1] == width &&
                                  t.shape[2] == channels)
                               : (t.ndim == 2 && t.shape[0] == height && t.shape[1] == width);
  if (channels > 0) {
    SPLAT_CHECK(ok, name, " has shape ", Sizes{t}, ", expected [", height, ", ", width, ", ",
                channels, "]");
  } else {
    SPLAT_CHECK(ok, name, " has shape ", Sizes{t}, ", expected [", height, ", ", width, "]");
  }
}

inline int tiles_along(int64_t pixels) {
  return static_cast<int>((pixels + kTileSize - 1) / kTileSize);
}

// Checks the first input (its device and dtype set the others') and the
// image size; returns N, the first input's rows.
template <class Dev>
int64_t check_first_input(const Arg& first, const char* name, const char* shape, int64_t width,
                          int64_t height) {
  SPLAT_CHECK(first.ndim >= 0, name, " is undefined (None)");
  SPLAT_CHECK(first.device_type == Dev::kDeviceType, name, " must be a ",
              device_type_name(Dev::kDeviceType), " tensor for the CUDA backend, got one on ",
              device_of(first));
  SPLAT_CHECK(first.dtype == SPLAT_DTYPE_FLOAT32 || first.dtype == SPLAT_DTYPE_FLOAT64,
              "the CUDA rasterizer supports float32 and float64 inputs, got ", DType{first.dtype});
  SPLAT_CHECK(first.ndim == 2, name, " has shape ", Sizes{first}, ", expected ", shape);
  const int64_t n = first.shape[0];
  SPLAT_CHECK(n <= kMaxInt32, "too many primitives for the CUDA rasterizer: ", n);
  SPLAT_CHECK(width >= 0 && height >= 0 && width <= kMaxInt32 && height <= kMaxInt32,
              "invalid image size ", width, " x ", height);
  // The kernels index tiles with int (and the launch grid is 1-D over tiles).
  SPLAT_CHECK(int64_t(tiles_along(width)) * tiles_along(height) <= kMaxInt32 / 2,
              "image too large: ", width, " x ", height);
  return n;
}

// Checks the per-surfel inputs (in[7], splat_forward_cuda's order) and image size; returns N.
template <class Dev>
int64_t check_surfels(const Arg* in, int64_t width, int64_t height) {
  const int64_t n = check_first_input<Dev>(in[0], "Tuvw", "[N, 9]", width, height);
  const Device device = device_of(in[0]);
  const int32_t dtype = in[0].dtype;
  const char* names[7] = {"Tuvw", "center", "normal", "color", "opacity", "depth", "pixel_rect"};
  const int64_t cols[7] = {9, 2, 3, kChannels, 0, 0, 4};
  for (int i = 0; i < 7; ++i) {
    check_tensor<Dev>(in[i], names[i], device, i == 6 ? SPLAT_DTYPE_INT32 : dtype);
    check_rows(in[i], names[i], n, cols[i]);
  }
  return n;
}

// Checks the per-Gaussian inputs (in[4]: core.h "3D Gaussians") and image size; returns N.
template <class Dev>
int64_t check_gaussians(const Arg* in, int64_t width, int64_t height) {
  const int64_t n = check_first_input<Dev>(in[0], "params", "[N, 27]", width, height);
  const Device device = device_of(in[0]);
  const int32_t dtype = in[0].dtype;
  const char* names[4] = {"params", "color", "depth", "pixel_rect"};
  const int64_t cols[4] = {kGaussParams, kChannels, 0, 4};
  for (int i = 0; i < 4; ++i) {
    check_tensor<Dev>(in[i], names[i], device, i == 3 ? SPLAT_DTYPE_INT32 : dtype);
    check_rows(in[i], names[i], n, cols[i]);
  }
  return n;
}

template <typename T>
SurfelArrays<T> surfel_arrays(const Arg* in, int64_t width, int64_t height, double near,
                              double far) {
  return SurfelArrays<T>{static_cast<const T*>(in[0].data),
                         static_cast<const T*>(in[1].data),
                         static_cast<const T*>(in[2].data),
                         static_cast<const T*>(in[3].data),
                         static_cast<const T*>(in[4].data),
                         static_cast<const T*>(in[5].data),
                         static_cast<const int32_t*>(in[6].data),
                         in[0].shape[0],
                         static_cast<int>(width),
                         static_cast<int>(height),
                         static_cast<T>(near),
                         static_cast<T>(far)};
}

template <typename T>
GaussianArrays<T> gaussian_arrays(const Arg* in, int64_t width, int64_t height, double near,
                                  double far) {
  return GaussianArrays<T>{static_cast<const T*>(in[0].data),
                           static_cast<const T*>(in[1].data),
                           static_cast<const T*>(in[2].data),
                           static_cast<const int32_t*>(in[3].data),
                           in[0].shape[0],
                           static_cast<int>(width),
                           static_cast<int>(height),
                           static_cast<T>(near),
                           static_cast<T>(far)};
}

// Allocates the outputs (slots 0..10, splat_forward_cuda's order), bins and
// renders `a` (SurfelArrays or GaussianArrays: binning reads only depth and
// pixel_rect; the render launcher is the primitive's overload).
template <class Dev, typename T, class Arrays>
void forward_impl(const Arrays& a, int64_t n, int64_t width, int64_t height, const Allocator& alloc,
                  cudaStream_t stream) {
  constexpr int32_t F = dtype_of<T>();
  constexpr int32_t I32 = SPLAT_DTYPE_INT32;
  const Buffer color_sum = alloc.get<Dev>(0, F, {height, width, kChannels}, "color_sum");
  const Buffer transmittance = alloc.get<Dev>(1, F, {height, width}, "transmittance");
  const Buffer depth_sum = alloc.get<Dev>(2, F, {height, width}, "depth_sum");
  const Buffer normal_sum = alloc.get<Dev>(3, F, {height, width, 3}, "normal_sum");
  const Buffer distortion = alloc.get<Dev>(4, F, {height, width}, "distortion");
  const Buffer median_depth = alloc.get<Dev>(5, F, {height, width}, "median_depth");
  const Buffer end = alloc.get<Dev>(6, I32, {height, width}, "end");
  const Buffer median_index = alloc.get<Dev>(7, I32, {height, width}, "median_index");
  const Buffer totals = alloc.get<Dev>(8, F, {height, width, kTotalsSize}, "totals");
  const int tiles_x = tiles_along(width), tiles_y = tiles_along(height);
  const int num_tiles = tiles_x * tiles_y;
  const Buffer tile_offsets =
      alloc.get<Dev>(9, SPLAT_DTYPE_INT64, {int64_t(num_tiles) + 1}, "tile_offsets");
  Buffer point_list{};

  if (n > 0 && num_tiles > 0) {
    // Scratch (slot -1): the caller keeps it alive until this call returns.
    const Buffer count_ws = alloc.get<Dev>(
        -1, SPLAT_DTYPE_UINT8, {int64_t(gpu::bin_count_workspace_bytes<T>(n))}, "binning scratch");
    int64_t num_pairs = 0;
    check_cuda(gpu::bin_count<T>(a.depth, a.pixel_rect, n, tiles_x, tiles_y, count_ws.data,
                                 size_t(count_ws.numel), &num_pairs, stream),
               "binning (bin_count)");
    SPLAT_CHECK(num_pairs <= kMaxInt32,
                "too many (tile, primitive) pairs for the CUDA rasterizer: ", num_pairs);
    point_list = alloc.get<Dev>(10, I32, {num_pairs}, "point_list");
    const Buffer pairs_ws = alloc.get<Dev>(
        -1, SPLAT_DTYPE_UINT8, {int64_t(gpu::bin_pairs_workspace_bytes(num_pairs, num_tiles))},
        "binning scratch");
    check_cuda(gpu::bin_pairs<T>(a.pixel_rect, n, tiles_x, tiles_y, count_ws.data, num_pairs,
                                 pairs_ws.data, size_t(pairs_ws.numel), point_list.as<int32_t>(),
                                 tile_offsets.as<int64_t>(), stream),
               "binning (bin_pairs)");
  } else {
    // No primitives (or no pixels): every tile has the empty list, and the
    // render below writes the background state (transmittance 1, sums 0,
    // end 0, median_index -1).
    check_cuda(cudaMemsetAsync(tile_offsets.data, 0, sizeof(int64_t) * (num_tiles + 1), stream),
               "zeroing tile_offsets");
    point_list = alloc.get<Dev>(10, I32, {0}, "point_list");
  }

  TileBins bins{tile_offsets.as<int64_t>(), point_list.as<int32_t>(), tiles_x, tiles_y};
  ForwardOutputs<T> out{color_sum.as<T>(),  transmittance.as<T>(),      depth_sum.as<T>(),
                        normal_sum.as<T>(), distortion.as<T>(),         median_depth.as<T>(),
                        end.as<int32_t>(),  median_index.as<int32_t>(), totals.as<T>()};
  check_cuda(gpu::launch_forward<T>(a, bins, out, stream), "the forward kernel");
}

// The saved forward state and the upstream gradients, as backward_impl takes them.
struct BackwardInputs {
  const Arg *tile_offsets, *point_list, *end, *median_index, *transmittance, *totals;
  const Arg* up;  // 6, contiguous
};

// Accumulates the gradient records [N, record_size] of `a` into output slot 0
// (zeroed first: the kernel adds with atomics).
template <class Dev, typename T, class Arrays>
void backward_impl(const Arrays& a, int64_t n, int64_t record_size, int64_t width, int64_t height,
                   const BackwardInputs& in, const Allocator& alloc, cudaStream_t stream) {
  const Buffer v_params = alloc.get<Dev>(0, dtype_of<T>(), {n, record_size}, "the gradients");
  if (v_params.numel)
    check_cuda(cudaMemsetAsync(v_params.data, 0, sizeof(T) * size_t(v_params.numel), stream),
               "zeroing the gradients");
  const int tiles_x = tiles_along(width), tiles_y = tiles_along(height);
  if (n == 0 || tiles_x == 0 || tiles_y == 0) return;

  TileBins bins{static_cast<const int64_t*>(in.tile_offsets->data),
                static_cast<const int32_t*>(in.point_list->data), tiles_x, tiles_y};
  const Arg* up = in.up;
  UpstreamGrads<T> grads{static_cast<const T*>(up[0].data), static_cast<const T*>(up[1].data),
                         static_cast<const T*>(up[2].data), static_cast<const T*>(up[3].data),
                         static_cast<const T*>(up[4].data), static_cast<const T*>(up[5].data)};
  check_cuda(gpu::launch_backward<T>(a, bins, static_cast<const int32_t*>(in.end->data),
                                     static_cast<const int32_t*>(in.median_index->data),
                                     static_cast<const T*>(in.transmittance->data),
                                     static_cast<const T*>(in.totals->data), grads,
                                     v_params.as<T>(), stream),
             "the backward kernel");
}

// The binning saved by forward must belong to these inputs: shapes always;
// where the buffers are host-readable (the emulated build), also the contents
// the kernels index with (offsets monotone from 0 to P, ids in [0, N)), which
// on a GPU would cost a host sync per backward call.
template <class Dev>
void check_binning(const Arg& tile_offsets, const Arg& point_list, int64_t n, int64_t num_tiles,
                   int64_t width, int64_t height, const Device& device) {
  check_tensor<Dev>(tile_offsets, "tile_offsets", device, SPLAT_DTYPE_INT64);
  SPLAT_CHECK(tile_offsets.ndim == 1 && numel(tile_offsets) == num_tiles + 1,
              "tile_offsets has shape ", Sizes{tile_offsets}, ", expected [", num_tiles + 1,
              "] for a ", width, " x ", height,
              " image: the saved forward state does not "
              "belong to these inputs");
  check_tensor<Dev>(point_list, "point_list", device, SPLAT_DTYPE_INT32);
  SPLAT_CHECK(point_list.ndim == 1, "point_list must be 1-D, got shape ", Sizes{point_list});
  if constexpr (Dev::kHostMemory) {
    const int64_t* off = static_cast<const int64_t*>(tile_offsets.data);
    const int64_t count = numel(point_list);
    SPLAT_CHECK(off[0] == 0 && off[num_tiles] == count, "tile_offsets run from ", off[0], " to ",
                off[num_tiles], " but point_list has ", count,
                " entries: the saved forward state does not belong to "
                "these inputs");
    for (int64_t t = 0; t < num_tiles; ++t)
      SPLAT_CHECK(off[t] <= off[t + 1], "tile_offsets decrease at tile ", t,
                  ": the saved forward state is corrupt");
    const int32_t* ids = static_cast<const int32_t*>(point_list.data);
    for (int64_t i = 0; i < count; ++i)
      SPLAT_CHECK(ids[i] >= 0 && ids[i] < n, "point_list[", i, "] = ", ids[i],
                  " is not a primitive index in [0, ", n,
                  "): the saved forward state does not "
                  "belong to these inputs");
  }
}

// Checks the saved forward state (state[6]: it must come from forward on the
// same inputs) and the upstream gradients (up[6], contiguous: the caller makes
// autograd's expanded ones so), whose device and dtype must be `like`'s.
template <class Dev>
BackwardInputs check_backward_inputs(const Arg& like, int64_t n, int64_t width, int64_t height,
                                     const Arg* state, const Arg* up) {
  const Device device = device_of(like);
  const int32_t dtype = like.dtype;
  const int64_t num_tiles = int64_t(tiles_along(width)) * tiles_along(height);
  check_binning<Dev>(state[0], state[1], n, num_tiles, width, height, device);
  check_tensor<Dev>(state[2], "end", device, SPLAT_DTYPE_INT32);
  check_image(state[2], "end", height, width, 0);
  check_tensor<Dev>(state[3], "median_index", device, SPLAT_DTYPE_INT32);
  check_image(state[3], "median_index", height, width, 0);
  check_tensor<Dev>(state[4], "transmittance", device, dtype);
  check_image(state[4], "transmittance", height, width, 0);
  check_tensor<Dev>(state[5], "totals", device, dtype);
  check_image(state[5], "totals", height, width, splat::kTotalsSize);

  const char* names[6] = {"v_color_sum",  "v_transmittance", "v_depth_sum",
                          "v_normal_sum", "v_distortion",    "v_median_depth"};
  const int64_t channels[6] = {kChannels, 0, 0, 3, 0, 0};
  for (int i = 0; i < 6; ++i) {
    check_tensor<Dev>(up[i], names[i], device, dtype);
    check_image(up[i], names[i], height, width, channels[i]);
  }
  return BackwardInputs{&state[0], &state[1], &state[2], &state[3], &state[4], &state[5], up};
}

// ---- entry points (capi_cuda.cpp) ---------------------------------------------------
// Surfels: core.h's surfel record, v_surfels [N, kGradSize].
template <class Dev>
void forward(const Arg* in, int64_t width, int64_t height, double near, double far,
             cudaStream_t stream, const Allocator& alloc) {
  const int64_t n = check_surfels<Dev>(in, width, height);
  const typename Dev::Guard device_guard(in[0].device_id);
  if (in[0].dtype == SPLAT_DTYPE_FLOAT64)
    return forward_impl<Dev, double>(surfel_arrays<double>(in, width, height, near, far), n, width,
                                     height, alloc, stream);
  forward_impl<Dev, float>(surfel_arrays<float>(in, width, height, near, far), n, width, height,
                           alloc, stream);
}

template <class Dev>
void backward(const Arg* in, int64_t width, int64_t height, double near, double far,
              const Arg* state, const Arg* up, cudaStream_t stream, const Allocator& alloc) {
  const int64_t n = check_surfels<Dev>(in, width, height);
  const typename Dev::Guard device_guard(in[0].device_id);
  const BackwardInputs b = check_backward_inputs<Dev>(in[0], n, width, height, state, up);
  if (in[0].dtype == SPLAT_DTYPE_FLOAT64)
    return backward_impl<Dev, double>(surfel_arrays<double>(in, width, height, near, far), n,
                                      kGradSize, width, height, b, alloc, stream);
  backward_impl<Dev, float>(surfel_arrays<float>(in, width, height, near, far), n, kGradSize, width,
                            height, b, alloc, stream);
}

// 3D Gaussians: params [N, kGaussParams] (core.h), v_gaussians [N, kGaussGradSize].
template <class Dev>
void forward_gaussians(const Arg* in, int64_t width, int64_t height, double near, double far,
                       cudaStream_t stream, const Allocator& alloc) {
  const int64_t n = check_gaussians<Dev>(in, width, height);
  const typename Dev::Guard device_guard(in[0].device_id);
  if (in[0].dtype == SPLAT_DTYPE_FLOAT64)
    return forward_impl<Dev, double>(gaussian_arrays<double>(in, width, height, near, far), n,
                                     width, height, alloc, stream);
  forward_impl<Dev, float>(gaussian_arrays<float>(in, width, height, near, far), n, width, height,
                           alloc, stream);
}

template <class Dev>
void backward_gaussians(const Arg* in, int64_t width, int64_t height, double near, double far,
                        const Arg* state, const Arg* up, cudaStream_t stream,
                        const Allocator& alloc) {
  const int64_t n = check_gaussians<Dev>(in, width, height);
  const typename Dev::Guard device_guard(in[0].device_id);
  const BackwardInputs b = check_backward_inputs<Dev>(in[0], n, width, height, state, up);
  if (in[0].dtype == SPLAT_DTYPE_FLOAT64)
    return backward_impl<Dev, double>(gaussian_arrays<double>(in, width, height, near, far), n,
                                      kGaussGradSize, width, height, b, alloc, stream);
  backward_impl<Dev, float>(gaussian_arrays<float>(in, width, height, near, far), n, kGaussGradSize,
                            width, height, b, alloc, stream);
}

// ---- the fused surfel projection (project_cuda.h) ------------------------------------
// in[7]: means [N,3], quats [N,4], scales [N,2], opacities [N], coeffs
// [N,K,3] (undefined or no elements: no SH colour), viewmat [4,4], K [3,3].
struct ProjectArgs {
  int64_t n;
  bool with_sh;
};

template <class Dev>
ProjectArgs check_project_inputs(const Arg* in, int64_t sh_degree, int64_t width, int64_t height) {
  const int64_t n = check_first_input<Dev>(in[0], "means", "[N, 3]", width, height);
  const Device device = device_of(in[0]);
  const int32_t dtype = in[0].dtype;
  const char* names[4] = {"means", "quats", "scales", "opacities"};
  const int64_t cols[4] = {3, 4, 2, 0};
  for (int i = 0; i < 4; ++i) {
    check_tensor<Dev>(in[i], names[i], device, dtype);
    check_rows(in[i], names[i], n, cols[i]);
  }
  const Arg& coeffs = in[4];
  const bool with_sh = coeffs.ndim >= 0 && numel(coeffs) > 0;
  if (with_sh) {
    check_tensor<Dev>(coeffs, "coeffs", device, dtype);
    SPLAT_CHECK(coeffs.ndim == 3 && coeffs.shape[0] == n && coeffs.shape[2] == 3,
                "coeffs has shape ", Sizes{coeffs}, ", expected [", n, ", K, 3]");
    SPLAT_CHECK(
        sh_degree >= 0 && sh_degree <= 3 && coeffs.shape[1] >= (sh_degree + 1) * (sh_degree + 1),
        "coeffs has too few SH coefficients for sh_degree ", sh_degree);
  }
  check_tensor<Dev>(in[5], "viewmat", device, dtype);
  SPLAT_CHECK(in[5].ndim == 2 && in[5].shape[0] == 4 && in[5].shape[1] == 4, "viewmat has shape ",
              Sizes{in[5]}, ", expected [4, 4]");
  check_tensor<Dev>(in[6], "K", device, dtype);
  SPLAT_CHECK(in[6].ndim == 2 && in[6].shape[0] == 3 && in[6].shape[1] == 3, "K has shape ",
              Sizes{in[6]}, ", expected [3, 3]");
  return ProjectArgs{n, with_sh};
}

// ProjectInputs without the camera (the kernels read viewmat and K from the device).
template <typename T>
ProjectInputs<T> project_inputs(const Arg* in, const ProjectArgs& a, int64_t sh_degree,
                                int64_t width, int64_t height, double near, double far) {
  ProjectInputs<T> p{};
  p.means = static_cast<const T*>(in[0].data);
  p.quats = static_cast<const T*>(in[1].data);
  p.scales = static_cast<const T*>(in[2].data);
  p.opacities = static_cast<const T*>(in[3].data);
  p.coeffs = a.with_sh ? static_cast<const T*>(in[4].data) : nullptr;
  p.num_coeffs = a.with_sh ? in[4].shape[1] : 0;
  p.sh_degree = a.with_sh ? static_cast<int>(sh_degree) : 0;
  p.n = a.n;
  p.width = static_cast<int>(width);
  p.height = static_cast<int>(height);
  p.near = near;
  p.far = far;
  return p;
}

// Outputs (slots 0..7): Tuvw [N,9], center [N,2], normal [N,3], color [N,3]
// ([0,3] without SH), depth [N], pixel_rect int32 [N,4], radii int32 [N], and
// the number of surfels over the magnitude limits, int64 [] (one count, added
// to atomically on the device; the caller reads it).
template <class Dev, typename T>
void project_forward_impl(const Arg* in, const ProjectArgs& a, int64_t sh_degree, int64_t width,
                          int64_t height, double near, double far, double limit_finite,
                          double limit_drawn, const Allocator& alloc, cudaStream_t stream) {
  constexpr int32_t F = dtype_of<T>();
  constexpr int32_t I32 = SPLAT_DTYPE_INT32;
  const int64_t n = a.n;
  const Buffer Tuvw = alloc.get<Dev>(0, F, {n, 9}, "Tuvw");
  const Buffer center = alloc.get<Dev>(1, F, {n, 2}, "center");
  const Buffer normal = alloc.get<Dev>(2, F, {n, 3}, "normal");
  const Buffer color = alloc.get<Dev>(3, F, {a.with_sh ? n : 0, 3}, "color");
  const Buffer depth = alloc.get<Dev>(4, F, {n}, "depth");
  const Buffer rect = alloc.get<Dev>(5, I32, {n, 4}, "pixel_rect");
  const Buffer radii = alloc.get<Dev>(6, I32, {n}, "radii");
  const Buffer bad = alloc.get<Dev>(7, SPLAT_DTYPE_INT64, {}, "the over-limit count");
  check_cuda(cudaMemsetAsync(bad.data, 0, sizeof(int64_t), stream), "zeroing the over-limit count");
  ProjectInputs<T> p = project_inputs<T>(in, a, sh_degree, width, height, near, far);
  p.limit_finite = limit_finite;
  p.limit_drawn = limit_drawn;
  const ProjectOutputs<T> out{Tuvw.as<T>(),  center.as<T>(),     normal.as<T>(),     color.as<T>(),
                              depth.as<T>(), rect.as<int32_t>(), radii.as<int32_t>()};
  check_cuda(gpu::launch_project_forward<T>(p, static_cast<const T*>(in[5].data),
                                            static_cast<const T*>(in[6].data), out,
                                            bad.as<unsigned long long>(), stream),
             "the projection kernel");
}

// grads[4]: v_Tuvw [N,9], v_center [N,2], v_normal [N,3], v_color [N,3]
// (undefined without SH), contiguous.  Outputs (slots 0..4): v_means [N,3],
// v_quats [N,4], v_scales [N,2], v_coeffs (coeffs' shape; [0,0,3] when
// coeffs is undefined), v_means2d [N,2].
template <class Dev, typename T>
void project_backward_impl(const Arg* in, const ProjectArgs& a, int64_t sh_degree, int64_t width,
                           int64_t height, double near, double far, const Arg* grads,
                           const Allocator& alloc, cudaStream_t stream) {
  constexpr int32_t F = dtype_of<T>();
  const int64_t n = a.n;
  const Buffer v_means = alloc.get<Dev>(0, F, {n, 3}, "v_means");
  const Buffer v_quats = alloc.get<Dev>(1, F, {n, 4}, "v_quats");
  const Buffer v_scales = alloc.get<Dev>(2, F, {n, 2}, "v_scales");
  // coeffs' shape, as the CPU op's empty_like(coeffs)
  const Arg& coeffs = in[4];
  const Buffer v_coeffs =
      coeffs.ndim == 3
          ? alloc.get<Dev>(3, F, {coeffs.shape[0], coeffs.shape[1], coeffs.shape[2]}, "v_coeffs")
          : alloc.get<Dev>(3, F, {0, 0, 3}, "v_coeffs");
  const Buffer v_means2d = alloc.get<Dev>(4, F, {n, 2}, "v_means2d");
  const ProjectInputs<T> p = project_inputs<T>(in, a, sh_degree, width, height, near, far);
  ProjectGrads<T> g{static_cast<const T*>(grads[0].data),
                    static_cast<const T*>(grads[1].data),
                    static_cast<const T*>(grads[2].data),
                    a.with_sh ? static_cast<const T*>(grads[3].data) : nullptr,
                    v_means.as<T>(),
                    v_quats.as<T>(),
                    v_scales.as<T>(),
                    a.with_sh ? v_coeffs.as<T>() : nullptr,
                    v_means2d.as<T>()};
  check_cuda(gpu::launch_project_backward<T>(p, static_cast<const T*>(in[5].data),
                                             static_cast<const T*>(in[6].data), g, stream),
             "the projection backward kernel");
}

template <class Dev>
void project_forward(const Arg* in, int64_t sh_degree, int64_t width, int64_t height, double near,
                     double far, double limit_finite, double limit_drawn, cudaStream_t stream,
                     const Allocator& alloc) {
  const ProjectArgs a = check_project_inputs<Dev>(in, sh_degree, width, height);
  const typename Dev::Guard device_guard(in[0].device_id);
  if (in[0].dtype == SPLAT_DTYPE_FLOAT64)
    return project_forward_impl<Dev, double>(in, a, sh_degree, width, height, near, far,
                                             limit_finite, limit_drawn, alloc, stream);
  project_forward_impl<Dev, float>(in, a, sh_degree, width, height, near, far, limit_finite,
                                   limit_drawn, alloc, stream);
}

template <class Dev>
void project_backward(const Arg* in, int64_t sh_degree, int64_t width, int64_t height, double near,
                      double far, const Arg* grads, cudaStream_t stream, const Allocator& alloc) {
  const ProjectArgs a = check_project_inputs<Dev>(in, sh_degree, width, height);
  const Device device = device_of(in[0]);
  const char* names[4] = {"v_Tuvw", "v_center", "v_normal", "v_color"};
  const int64_t cols[4] = {9, 2, 3, 3};
  for (int i = 0; i < (a.with_sh ? 4 : 3); ++i) {
    check_tensor<Dev>(grads[i], names[i], device, in[0].dtype);
    check_rows(grads[i], names[i], a.n, cols[i]);
  }
  const typename Dev::Guard device_guard(in[0].device_id);
  if (in[0].dtype == SPLAT_DTYPE_FLOAT64)
    return project_backward_impl<Dev, double>(in, a, sh_degree, width, height, near, far, grads,
                                              alloc, stream);
  project_backward_impl<Dev, float>(in, a, sh_degree, width, height, near, far, grads, alloc,
                                    stream);
}

// ---- the fused projection of 3D Gaussians (project_cuda.h) ---------------------------
// in: means [N,3], quats [N,4], scales [N,3], opacities [N], then (backward
// only) ids int64 [M], then viewmat [4,4], K [3,3], K_inv [3,3].
template <class Dev, typename T>
gpu::GaussCudaInputs<T> gauss_project_inputs(const Arg* in, bool with_ids, int64_t width,
                                             int64_t height, int64_t antialiased) {
  const int64_t n = check_first_input<Dev>(in[0], "means", "[N, 3]", width, height);
  const Device device = device_of(in[0]);
  const int32_t dtype = in[0].dtype;
  const char* names[4] = {"means", "quats", "scales", "opacities"};
  const int64_t cols[4] = {3, 4, 3, 0};
  for (int i = 0; i < 4; ++i) {
    check_tensor<Dev>(in[i], names[i], device, dtype);
    check_rows(in[i], names[i], n, cols[i]);
  }
  int64_t m = 0;
  const Arg* cam = in + 4;
  if (with_ids) {
    check_tensor<Dev>(in[4], "ids", device, SPLAT_DTYPE_INT64);
    SPLAT_CHECK(in[4].ndim == 1 && in[4].shape[0] <= n, "ids has shape ", Sizes{in[4]},
                ", expected [M] with M <= ", n);
    m = in[4].shape[0];
    cam = in + 5;
  }
  const char* cam_names[3] = {"viewmat", "K", "K_inv"};
  const int64_t side[3] = {4, 3, 3};
  for (int i = 0; i < 3; ++i) {
    check_tensor<Dev>(cam[i], cam_names[i], device, dtype);
    SPLAT_CHECK(cam[i].ndim == 2 && cam[i].shape[0] == side[i] && cam[i].shape[1] == side[i],
                cam_names[i], " has shape ", Sizes{cam[i]}, ", expected [", side[i], ", ", side[i],
                "]");
  }
  gpu::GaussCudaInputs<T> g{};
  g.means = static_cast<const T*>(in[0].data);
  g.quats = static_cast<const T*>(in[1].data);
  g.scales = static_cast<const T*>(in[2].data);
  g.opacities = static_cast<const T*>(in[3].data);
  g.ids = with_ids ? static_cast<const int64_t*>(in[4].data) : nullptr;
  g.n = n;
  g.m = m;
  g.viewmat = static_cast<const T*>(cam[0].data);
  g.K = static_cast<const T*>(cam[1].data);
  g.K_inv = static_cast<const T*>(cam[2].data);
  g.width = static_cast<int>(width);
  g.height = static_cast<int>(height);
  g.antialiased = antialiased ? 1 : 0;
  return g;
}

// Outputs (slots 0..6): ids int64 [M], params [M, kGaussParams], centre [M,2],
// depth [M], pixel_rect int32 [M,4], radii int32 [M], and the number of rows
// with a non-finite parameter, int64 [] on the device.  One host sync (M).
template <class Dev, typename T>
void project_gaussians_forward_impl(const Arg* in, int64_t width, int64_t height, double near,
                                    double far, int64_t antialiased, const Allocator& alloc,
                                    cudaStream_t stream) {
  constexpr int32_t F = dtype_of<T>();
  constexpr int32_t I32 = SPLAT_DTYPE_INT32;
  gpu::GaussCudaInputs<T> g = gauss_project_inputs<Dev, T>(in, false, width, height, antialiased);
  const Buffer ws = alloc.get<Dev>(-1, SPLAT_DTYPE_UINT8,
                                   {g.n > 0 ? int64_t(gpu::gauss_cull_workspace_bytes(g.n)) : 0},
                                   "the cull's scratch");
  int64_t m = 0;
  check_cuda(gpu::gauss_cull<T>(g, near, far, ws.data, size_t(ws.numel), &m, stream), "the cull");
  const Buffer ids = alloc.get<Dev>(0, SPLAT_DTYPE_INT64, {m}, "ids");
  const Buffer params = alloc.get<Dev>(1, F, {m, kGaussParams}, "params");
  const Buffer centre = alloc.get<Dev>(2, F, {m, 2}, "centre");
  const Buffer depth = alloc.get<Dev>(3, F, {m}, "depth");
  const Buffer rect = alloc.get<Dev>(4, I32, {m, 4}, "pixel_rect");
  const Buffer radii = alloc.get<Dev>(5, I32, {m}, "radii");
  const Buffer bad = alloc.get<Dev>(6, SPLAT_DTYPE_INT64, {}, "the non-finite row count");
  check_cuda(cudaMemsetAsync(bad.data, 0, sizeof(int64_t), stream), "zeroing the row count");
  check_cuda(gpu::gauss_cull_ids(ws.data, g.n, ids.as<int64_t>(), stream), "the cull's ids");
  g.ids = ids.as<int64_t>();
  g.m = m;
  const gpu::GaussCudaOutputs<T> out{params.as<T>(), centre.as<T>(), depth.as<T>(),
                                     rect.as<int32_t>(), radii.as<int32_t>()};
  check_cuda(gpu::launch_gauss_project_forward<T>(g, out, bad.as<unsigned long long>(), stream),
             "the Gaussians' projection kernel");
}

// grads[2]: v_params [M, kGaussParams], v_centre [M, 2] (undefined: zero),
// contiguous.  Outputs (slots 0..4): v_means [N,3], v_quats [N,4], v_scales
// [N,3], v_opacities [N], v_means2d [N,2]; zero for the Gaussians not in ids;
// with_camera, also (slots 5..7) v_viewmat [4,4], v_K [3,3], v_K_inv [3,3].
template <class Dev, typename T>
void project_gaussians_backward_impl(const Arg* in, int64_t width, int64_t height,
                                     int64_t antialiased, const Arg* grads, int64_t with_camera,
                                     const Allocator& alloc, cudaStream_t stream) {
  constexpr int32_t F = dtype_of<T>();
  const gpu::GaussCudaInputs<T> g =
      gauss_project_inputs<Dev, T>(in, true, width, height, antialiased);
  const Device device = device_of(in[0]);
  check_tensor<Dev>(grads[0], "v_params", device, F);
  check_rows(grads[0], "v_params", g.m, kGaussParams);
  const bool with_centre = grads[1].ndim >= 0;
  if (with_centre) {
    check_tensor<Dev>(grads[1], "v_centre", device, F);
    check_rows(grads[1], "v_centre", g.m, 2);
  }
  const int64_t n = g.n;
  const Buffer v_means = alloc.get<Dev>(0, F, {n, 3}, "v_means");
  const Buffer v_quats = alloc.get<Dev>(1, F, {n, 4}, "v_quats");
  const Buffer v_scales = alloc.get<Dev>(2, F, {n, 3}, "v_scales");
  const Buffer v_opacities = alloc.get<Dev>(3, F, {n}, "v_opacities");
  const Buffer v_means2d = alloc.get<Dev>(4, F, {n, 2}, "v_means2d");
  // the Gaussians not kept get exactly zero (all-zero bits: +0.0, as the CPU's T(0))
  for (const Buffer* b : {&v_means, &v_quats, &v_scales, &v_opacities, &v_means2d})
    if (b->numel)
      check_cuda(cudaMemsetAsync(b->data, 0, size_t(b->numel) * sizeof(T), stream),
                 "zeroing the gradients");
  gpu::GaussCudaGrads<T> out{};
  out.v_params = static_cast<const T*>(grads[0].data);
  out.v_centre = with_centre ? static_cast<const T*>(grads[1].data) : nullptr;
  out.v_means = v_means.as<T>();
  out.v_quats = v_quats.as<T>();
  out.v_scales = v_scales.as<T>();
  out.v_opacities = v_opacities.as<T>();
  out.v_means2d = v_means2d.as<T>();
  if (with_camera) {
    const Buffer v_viewmat = alloc.get<Dev>(5, F, {4, 4}, "v_viewmat");
    const Buffer v_K = alloc.get<Dev>(6, F, {3, 3}, "v_K");
    const Buffer v_K_inv = alloc.get<Dev>(7, F, {3, 3}, "v_K_inv");
    // every Gaussian's share, then the per-block sums (the CPU's blocks)
    const int64_t blocks = (g.m + kGaussCameraBlock - 1) / kGaussCameraBlock;
    const Buffer shares =
        alloc.get<Dev>(-1, F, {g.m, kGaussCameraGradSize}, "the camera gradient's scratch");
    const Buffer partial = alloc.get<Dev>(-1, SPLAT_DTYPE_FLOAT64, {blocks, kGaussCameraGradSize},
                                          "the camera gradient's scratch");
    out.v_viewmat = v_viewmat.as<T>();
    out.v_K = v_K.as<T>();
    out.v_K_inv = v_K_inv.as<T>();
    out.v_camera = shares.as<T>();
    out.partial = partial.as<double>();
  }
  check_cuda(gpu::launch_gauss_project_backward<T>(g, out, stream),
             "the Gaussians' projection backward kernel");
}

template <class Dev>
void project_gaussians_forward(const Arg* in, int64_t width, int64_t height, double near,
                               double far, int64_t antialiased, cudaStream_t stream,
                               const Allocator& alloc) {
  check_first_input<Dev>(in[0], "means", "[N, 3]", width, height);
  const typename Dev::Guard device_guard(in[0].device_id);
  if (in[0].dtype == SPLAT_DTYPE_FLOAT64)
    return project_gaussians_forward_impl<Dev, double>(in, width, height, near, far, antialiased,
                                                       alloc, stream);
  project_gaussians_forward_impl<Dev, float>(in, width, height, near, far, antialiased, alloc,
                                             stream);
}

template <class Dev>
void project_gaussians_backward(const Arg* in, int64_t width, int64_t height, int64_t antialiased,
                                const Arg* grads, int64_t with_camera, cudaStream_t stream,
                                const Allocator& alloc) {
  check_first_input<Dev>(in[0], "means", "[N, 3]", width, height);
  const typename Dev::Guard device_guard(in[0].device_id);
  if (in[0].dtype == SPLAT_DTYPE_FLOAT64)
    return project_gaussians_backward_impl<Dev, double>(in, width, height, antialiased, grads,
                                                        with_camera, alloc, stream);
  project_gaussians_backward_impl<Dev, float>(in, width, height, antialiased, grads, with_camera,
                                              alloc, stream);
}

}  // namespace host_sequence
}  // namespace splat
