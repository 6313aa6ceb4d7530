// The CPU half of the C ABI (splat_api.h): argument blocks from plain
// pointers, outputs in the kernels' scratch memory handed out as DLPack
// tensors, exceptions turned into error codes.  Shapes, dtypes and strides are
// validated by the caller (splat/_native.py, which knows the tensors); this
// file checks the scalars and never lets an exception cross the C boundary.
#include "splat_api.h"

#ifdef _OPENMP  // absent where the library is built serial (_native_build.py)
#include <omp.h>
#endif

#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "core.h"
#include "cpu/gaussians_cpu.h"
#include "cpu/normal_loss_cpu.h"
#include "cpu/project_gaussians_cpu.h"
#include "cpu/project_cpu.h"
#include "cpu/rasterize_cpu.h"
#include "cpu/scratch.h"
#include "cpu/simd.h"
#include "cpu/ssim_cpu.h"

namespace {

// A DLPack tensor over a scratch block; the deleter returns the block.
struct Owned {
  SplatDLManagedTensor managed;
  int64_t shape[4];
  int64_t strides[4];
};

void release_owned(SplatDLManagedTensor* m) {
  Owned* o = static_cast<Owned*>(m->manager_ctx);
  splat::scratch_release(m->dl_tensor.data);
  delete o;
}

// code: DLPack's 0 int, 1 uint, 2 float; bits per element.
SplatDLManagedTensor* scratch_tensor(std::initializer_list<int64_t> sizes, uint8_t code,
                                     uint8_t bits) {
  Owned* o = new Owned();
  int64_t numel = 1;
  int d = 0;
  for (const int64_t s : sizes) {
    o->shape[d++] = s;
    numel *= s;
  }
  int64_t stride = 1;
  for (int k = d - 1; k >= 0; --k) {
    o->strides[k] = stride;
    stride *= o->shape[k];
  }
  // An empty tensor still gets a (small, never cached) block: DLPack wants data.
  const size_t bytes = size_t(numel) * (bits / 8);
  void* data = nullptr;
  try {
    data = splat::scratch_acquire(bytes ? bytes : 64);
  } catch (...) {
    delete o;
    throw;
  }
  SplatDLTensor& t = o->managed.dl_tensor;
  t.data = data;
  t.device = SplatDLDevice{1, 0};
  t.ndim = d;
  t.dtype = SplatDLDataType{code, bits, 1};
  t.shape = o->shape;
  t.strides = o->strides;
  t.byte_offset = 0;
  o->managed.manager_ctx = o;
  o->managed.deleter = release_owned;
  return &o->managed;
}

template <typename T>
SplatDLManagedTensor* real_tensor(std::initializer_list<int64_t> sizes) {
  return scratch_tensor(sizes, 2, sizeof(T) * 8);
}
SplatDLManagedTensor* int32_tensor(std::initializer_list<int64_t> sizes) {
  return scratch_tensor(sizes, 0, 32);
}

// A 0-d tensor holding value (as torch::tensor(value, options) made it).
template <typename T>
SplatDLManagedTensor* scalar_tensor(T value, uint8_t code) {
  SplatDLManagedTensor* t = scratch_tensor({}, code, sizeof(T) * 8);
  *static_cast<T*>(t->dl_tensor.data) = value;
  return t;
}

// The outputs of one call: freed together unless handed over.
struct Outputs {
  std::vector<SplatDLManagedTensor*> list;
  SplatDLManagedTensor* add(SplatDLManagedTensor* t) {
    list.push_back(t);
    return t;
  }
  template <typename T>
  T* data(size_t i) {
    return static_cast<T*>(list[i]->dl_tensor.data);
  }
  void hand_over(SplatDLManagedTensor** outs) {
    for (size_t i = 0; i < list.size(); ++i) outs[i] = list[i];
    list.clear();
  }
  ~Outputs() {
    for (auto* t : list) t->deleter(t);
  }
};

void set_message(char* err, size_t err_len, const char* text) {
  if (err && err_len) {
    std::strncpy(err, text, err_len - 1);
    err[err_len - 1] = '\0';
  }
}

// Runs body (which may throw) and maps any exception to an error code.
template <class F>
int guarded(char* err, size_t err_len, int num_threads, F&& body) {
  try {
#ifdef _OPENMP
    if (num_threads > 0) omp_set_num_threads(num_threads);
#else
    (void)num_threads;
#endif
    body();
    return 0;
  } catch (const std::bad_alloc&) {
    set_message(err, err_len, "out of memory");
  } catch (const std::exception& e) {
    set_message(err, err_len, e.what());
  } catch (...) {
    set_message(err, err_len, "unknown C++ exception");
  }
  return 1;
}

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

void check_dtype(int dtype) { require(dtype == 0 || dtype == 1, "dtype must be 0 or 1"); }

void check_image_size(int64_t n, int64_t width, int64_t height, const char* what) {
  require(n >= 0 && n < (int64_t(1) << 31), std::string("too many ") + what);
  require(width >= 0 && height >= 0 && width < (int64_t(1) << 30) && height < (int64_t(1) << 30),
          "invalid image size " + std::to_string(width) + " x " + std::to_string(height));
}

int tiles_along(int64_t pixels) {
  return static_cast<int>((pixels + splat::kTileSize - 1) / splat::kTileSize);
}

// Today's ForwardImages (bindings.cpp): the per-pixel outputs, then the binning.
template <typename T>
splat::ForwardOutputs<T> forward_images(Outputs& o, int64_t width, int64_t height) {
  o.add(real_tensor<T>({height, width, 3}));
  o.add(real_tensor<T>({height, width}));
  o.add(real_tensor<T>({height, width}));
  o.add(real_tensor<T>({height, width, 3}));
  o.add(real_tensor<T>({height, width}));
  o.add(real_tensor<T>({height, width}));
  o.add(int32_tensor({height, width}));
  o.add(int32_tensor({height, width}));
  o.add(real_tensor<T>({height, width, splat::kTotalsSize}));
  return splat::ForwardOutputs<T>{o.data<T>(0),       o.data<T>(1),       o.data<T>(2),
                                  o.data<T>(3),       o.data<T>(4),       o.data<T>(5),
                                  o.data<int32_t>(6), o.data<int32_t>(7), o.data<T>(8)};
}

// Sorts and lists the primitives per tile; appends tile_offsets and point_list.
template <typename T>
splat::TileBins bin(Outputs& o, int64_t n, const T* depth, const int32_t* pixel_rect, int64_t width,
                    int64_t height) {
  const int tx = tiles_along(width), ty = tiles_along(height);
  std::vector<int64_t> offsets;
  SplatDLManagedTensor* list = nullptr;
  splat::bin_tiles_cpu<T>(n, depth, pixel_rect, tx, ty, offsets, [&](int64_t count) {
    list = int32_tensor({count});
    return static_cast<int32_t*>(list->dl_tensor.data);
  });
  // bin_tiles_cpu always allocates; keep the order tile_offsets, point_list
  auto* offs = o.add(scratch_tensor({int64_t(offsets.size())}, 0, 64));
  std::memcpy(offs->dl_tensor.data, offsets.data(), offsets.size() * sizeof(int64_t));
  if (!list) list = int32_tensor({0});
  o.add(list);
  return splat::TileBins{static_cast<const int64_t*>(offs->dl_tensor.data),
                         static_cast<const int32_t*>(list->dl_tensor.data), tx, ty};
}

template <typename T>
splat::SurfelArrays<T> surfel_arrays(const void* const* in, int64_t n, int64_t width,
                                     int64_t height, double near_plane, double far_plane) {
  return splat::SurfelArrays<T>{static_cast<const T*>(in[0]),
                                static_cast<const T*>(in[1]),
                                static_cast<const T*>(in[2]),
                                static_cast<const T*>(in[3]),
                                static_cast<const T*>(in[4]),
                                static_cast<const T*>(in[5]),
                                static_cast<const int32_t*>(in[6]),
                                n,
                                static_cast<int>(width),
                                static_cast<int>(height),
                                static_cast<T>(near_plane),
                                static_cast<T>(far_plane)};
}

template <typename T>
splat::GaussianArrays<T> gaussian_arrays(const void* const* in, int64_t n, int64_t width,
                                         int64_t height, double near_plane, double far_plane) {
  return splat::GaussianArrays<T>{static_cast<const T*>(in[0]),
                                  static_cast<const T*>(in[1]),
                                  static_cast<const T*>(in[2]),
                                  static_cast<const int32_t*>(in[3]),
                                  n,
                                  static_cast<int>(width),
                                  static_cast<int>(height),
                                  static_cast<T>(near_plane),
                                  static_cast<T>(far_plane)};
}

template <typename T>
splat::UpstreamGrads<T> upstream(const void* const* up, const int64_t* strides) {
  splat::UpstreamGrads<T> u{static_cast<const T*>(up[0]), static_cast<const T*>(up[1]),
                            static_cast<const T*>(up[2]), static_cast<const T*>(up[3]),
                            static_cast<const T*>(up[4]), static_cast<const T*>(up[5])};
  for (int a = 0; a < 6; ++a) u.pixel_stride[a] = strides[a];
  u.color_channel_stride = strides[6];
  u.normal_channel_stride = strides[7];
  return u;
}

splat::TileBins saved_bins(const void* const* state, int64_t width, int64_t height) {
  return splat::TileBins{static_cast<const int64_t*>(state[0]),
                         static_cast<const int32_t*>(state[1]), tiles_along(width),
                         tiles_along(height)};
}

// Calls body.template operator()<T>() for the dtype code.
template <class F>
void dispatch(int dtype, F&& body) {
  check_dtype(dtype);
  if (dtype == 0)
    body(float{});
  else
    body(double{});
}

template <typename T>
splat::ProjectInputs<T> project_inputs(const void* const* in, int64_t n, int64_t num_coeffs,
                                       int64_t sh_degree, const void* viewmat, const void* K,
                                       int64_t width, int64_t height, double near_plane,
                                       double far_plane) {
  require(in[4] == nullptr ||
              (sh_degree >= 0 && sh_degree <= 3 && num_coeffs >= (sh_degree + 1) * (sh_degree + 1)),
          "coeffs has too few SH coefficients for sh_degree " + std::to_string(sh_degree));
  splat::ProjectInputs<T> p{};
  p.means = static_cast<const T*>(in[0]);
  p.quats = static_cast<const T*>(in[1]);
  p.scales = static_cast<const T*>(in[2]);
  p.opacities = static_cast<const T*>(in[3]);
  p.coeffs = static_cast<const T*>(in[4]);
  p.num_coeffs = in[4] ? num_coeffs : 0;
  p.sh_degree = static_cast<int>(sh_degree);
  for (int k = 0; k < 16; ++k) p.viewmat[k] = static_cast<const T*>(viewmat)[k];
  for (int k = 0; k < 9; ++k) p.K[k] = static_cast<const T*>(K)[k];
  p.n = n;
  p.width = static_cast<int>(width);
  p.height = static_cast<int>(height);
  p.near = near_plane;
  p.far = far_plane;
  return p;
}

// ---- The fused projection of 3D Gaussians: its argument block ----
template <typename T>
splat::GaussProjectArgs<T> gauss_project_args(const void* const* in, int64_t n, int64_t m,
                                              const void* viewmat, const void* K, const void* K_inv,
                                              int64_t width, int64_t height, int antialiased) {
  require(m >= 0 && m <= n, "ids: more Gaussians projected than given");
  splat::GaussProjectArgs<T> a{};
  a.means = static_cast<const T*>(in[0]);
  a.quats = static_cast<const T*>(in[1]);
  a.scales = static_cast<const T*>(in[2]);
  a.opacities = static_cast<const T*>(in[3]);
  a.ids = static_cast<const int64_t*>(in[4]);
  // the kernels index the inputs (and write the gradients) by id
  bool in_range = true;
  for (int64_t j = 0; j < m; ++j) in_range = in_range && a.ids[j] >= 0 && a.ids[j] < n;
  require(in_range, "ids: every id must be in [0, N)");
  a.n = n;
  a.m = m;
  for (int k = 0; k < 16; ++k) a.viewmat[k] = static_cast<const T*>(viewmat)[k];
  for (int k = 0; k < 9; ++k) {
    a.K[k] = static_cast<const T*>(K)[k];
    a.K_inv[k] = static_cast<const T*>(K_inv)[k];
  }
  a.width = static_cast<int>(width);
  a.height = static_cast<int>(height);
  a.antialiased = antialiased ? 1 : 0;
  return a;
}
// ---- end ----

template <typename T>
splat::SsimArgs<T> ssim_args(const void* x, const void* y, const void* window, int64_t window_size,
                             int64_t height, int64_t width, int64_t channels, double c1,
                             double c2) {
  require(window_size > 0 && window_size % 2 == 1, "ssim: window must be [K], K odd");
  require(height >= 0 && width >= 0 && channels >= 0, "ssim: x and y must both be [H, W, C]");
  return splat::SsimArgs<T>{static_cast<const T*>(x),
                            static_cast<const T*>(y),
                            static_cast<const T*>(window),
                            static_cast<int>(window_size),
                            height,
                            width,
                            channels,
                            c1,
                            c2};
}

template <typename T>
splat::NormalLossArgs<T> normal_loss_args(const void* depth, const void* normal, const void* alpha,
                                          const double* K, const double* viewmat, int64_t height,
                                          int64_t width) {
  require(height >= 0 && width >= 0, "normal loss: depth must be [H, W]");
  splat::NormalLossArgs<T> a{};
  a.depth = static_cast<const T*>(depth);
  a.normal = static_cast<const T*>(normal);
  a.alpha = static_cast<const T*>(alpha);
  a.fx = K[0], a.fy = K[4], a.cx = K[2], a.cy = K[5];
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c) a.R[3 * r + c] = viewmat[4 * r + c];
  a.height = height;
  a.width = width;
  return a;
}

}  // namespace

extern "C" {

int splat_api_version(void) { return SPLAT_API_VERSION; }

void splat_constants(int64_t* out6) {
  out6[0] = splat::kGradSize;
  out6[1] = splat::kGaussParams;
  out6[2] = splat::kGaussGradSize;
  out6[3] = splat::kTileSize;
  out6[4] = splat::kTotalsSize;
  out6[5] = splat::kLanes;
}

int splat_forward_cpu(int dtype, const void* const* inputs, int64_t n, int64_t width,
                      int64_t height, double near_plane, double far_plane, int num_threads,
                      SplatDLManagedTensor** outs, char* err, size_t err_len) {
  return guarded(err, err_len, num_threads, [&] {
    check_image_size(n, width, height, "surfels");
    dispatch(dtype, [&](auto zero) {
      using T = decltype(zero);
      Outputs o;
      const auto images = forward_images<T>(o, width, height);
      const auto s = surfel_arrays<T>(inputs, n, width, height, near_plane, far_plane);
      const auto bins = bin<T>(o, n, s.depth, s.pixel_rect, width, height);
      const int64_t packed_bytes = splat::packed_surfel_bytes<T>(n);
      auto* packed = o.add(scratch_tensor({packed_bytes}, 1, 8));
      splat::forward_cpu<T>(s, bins, images,
                            packed_bytes ? static_cast<uint8_t*>(packed->dl_tensor.data) : nullptr);
      o.hand_over(outs);
    });
  });
}

int splat_backward_cpu(int dtype, const void* const* inputs, int64_t n, int64_t width,
                       int64_t height, double near_plane, double far_plane,
                       const void* const* state, const void* const* up, const int64_t* up_strides,
                       const void* packed, int64_t packed_bytes, int num_threads,
                       SplatDLManagedTensor** out, char* err, size_t err_len) {
  return guarded(err, err_len, num_threads, [&] {
    check_image_size(n, width, height, "surfels");
    dispatch(dtype, [&](auto zero) {
      using T = decltype(zero);
      Outputs o;
      o.add(real_tensor<T>({n, splat::kGradSize}));
      // forward's packed records, if they match this kernel mode (else repacked)
      const bool reuse =
          packed && packed_bytes > 0 && packed_bytes == splat::packed_surfel_bytes<T>(n);
      const auto s = surfel_arrays<T>(inputs, n, width, height, near_plane, far_plane);
      splat::backward_cpu<T>(s, saved_bins(state, width, height),
                             static_cast<const int32_t*>(state[2]),
                             static_cast<const int32_t*>(state[3]), static_cast<const T*>(state[4]),
                             static_cast<const T*>(state[5]), upstream<T>(up, up_strides),
                             o.data<T>(0), reuse ? static_cast<const uint8_t*>(packed) : nullptr);
      o.hand_over(out);
    });
  });
}

int splat_forward_gaussians_cpu(int dtype, const void* const* inputs, int64_t n, int64_t width,
                                int64_t height, double near_plane, double far_plane,
                                int num_threads, SplatDLManagedTensor** outs, char* err,
                                size_t err_len) {
  return guarded(err, err_len, num_threads, [&] {
    check_image_size(n, width, height, "Gaussians");
    dispatch(dtype, [&](auto zero) {
      using T = decltype(zero);
      Outputs o;
      const auto images = forward_images<T>(o, width, height);
      const auto g = gaussian_arrays<T>(inputs, n, width, height, near_plane, far_plane);
      const auto bins = bin<T>(o, n, g.depth, g.pixel_rect, width, height);
      splat::forward_gaussians_cpu<T>(g, bins, images);
      o.hand_over(outs);
    });
  });
}

int splat_backward_gaussians_cpu(int dtype, const void* const* inputs, int64_t n, int64_t width,
                                 int64_t height, double near_plane, double far_plane,
                                 const void* const* state, const void* const* up,
                                 const int64_t* up_strides, int num_threads,
                                 SplatDLManagedTensor** out, char* err, size_t err_len) {
  return guarded(err, err_len, num_threads, [&] {
    check_image_size(n, width, height, "Gaussians");
    dispatch(dtype, [&](auto zero) {
      using T = decltype(zero);
      Outputs o;
      o.add(real_tensor<T>({n, splat::kGaussGradSize}));
      const auto g = gaussian_arrays<T>(inputs, n, width, height, near_plane, far_plane);
      splat::backward_gaussians_cpu<T>(
          g, saved_bins(state, width, height), static_cast<const int32_t*>(state[2]),
          static_cast<const int32_t*>(state[3]), static_cast<const T*>(state[4]),
          static_cast<const T*>(state[5]), upstream<T>(up, up_strides), o.data<T>(0));
      o.hand_over(out);
    });
  });
}

int splat_project_forward_cpu(int dtype, const void* const* inputs, int64_t n, int64_t num_coeffs,
                              int64_t sh_degree, const void* viewmat, const void* K, int64_t width,
                              int64_t height, double near_plane, double far_plane,
                              double limit_finite, double limit_drawn, int num_threads,
                              SplatDLManagedTensor** outs, char* err, size_t err_len) {
  return guarded(err, err_len, num_threads, [&] {
    check_image_size(n, width, height, "surfels");
    dispatch(dtype, [&](auto zero) {
      using T = decltype(zero);
      Outputs o;
      o.add(real_tensor<T>({n, 9}));
      o.add(real_tensor<T>({n, 2}));
      o.add(real_tensor<T>({n, 3}));
      o.add(real_tensor<T>({inputs[4] ? n : 0, 3}));
      o.add(real_tensor<T>({n}));
      o.add(int32_tensor({n, 4}));
      o.add(int32_tensor({n}));
      auto in = project_inputs<T>(inputs, n, num_coeffs, sh_degree, viewmat, K, width, height,
                                  near_plane, far_plane);
      in.limit_finite = limit_finite;
      in.limit_drawn = limit_drawn;
      splat::ProjectOutputs<T> out{o.data<T>(0),      o.data<T>(1), o.data<T>(2),
                                   o.data<T>(3),      o.data<T>(4), o.data<int32_t>(5),
                                   o.data<int32_t>(6)};
      o.add(scalar_tensor<int64_t>(splat::project_forward_cpu<T>(in, out), 0));
      o.hand_over(outs);
    });
  });
}

int splat_project_backward_cpu(int dtype, const void* const* inputs, int64_t n, int64_t num_coeffs,
                               int64_t sh_degree, const void* viewmat, const void* K, int64_t width,
                               int64_t height, double near_plane, double far_plane,
                               const void* const* grads_in, const int64_t* row_strides,
                               void* v_coeffs, int num_threads, SplatDLManagedTensor** outs,
                               char* err, size_t err_len) {
  return guarded(err, err_len, num_threads, [&] {
    check_image_size(n, width, height, "surfels");
    dispatch(dtype, [&](auto zero) {
      using T = decltype(zero);
      Outputs o;
      o.add(real_tensor<T>({n, 3}));
      o.add(real_tensor<T>({n, 4}));
      o.add(real_tensor<T>({n, 2}));
      o.add(real_tensor<T>({n, 2}));
      const auto in = project_inputs<T>(inputs, n, num_coeffs, sh_degree, viewmat, K, width, height,
                                        near_plane, far_plane);
      const bool with_sh = inputs[4] != nullptr;
      splat::ProjectGrads<T> g{static_cast<const T*>(grads_in[0]),
                               static_cast<const T*>(grads_in[1]),
                               static_cast<const T*>(grads_in[2]),
                               with_sh ? static_cast<const T*>(grads_in[3]) : nullptr,
                               o.data<T>(0),
                               o.data<T>(1),
                               o.data<T>(2),
                               with_sh ? static_cast<T*>(v_coeffs) : nullptr,
                               o.data<T>(3)};
      g.v_Tuvw_row_stride = row_strides[0];
      g.v_center_row_stride = row_strides[1];
      g.v_normal_row_stride = row_strides[2];
      g.v_color_row_stride = with_sh ? row_strides[3] : 3;
      splat::project_backward_cpu<T>(in, g);
      o.hand_over(outs);
    });
  });
}

// ---- The fused projection of 3D Gaussians (splat_api.h) ----
int splat_project_gaussians_forward_cpu(int dtype, const void* const* inputs, int64_t n,
                                        const void* viewmat, const void* K, const void* K_inv,
                                        int64_t width, int64_t height, double near_plane,
                                        double far_plane, int antialiased, int num_threads,
                                        SplatDLManagedTensor** outs, char* err, size_t err_len) {
  return guarded(err, err_len, num_threads, [&] {
    check_image_size(n, width, height, "Gaussians");
    dispatch(dtype, [&](auto zero) {
      using T = decltype(zero);
      const void* given[5] = {inputs[0], inputs[1], inputs[2], inputs[3], nullptr};
      auto in = gauss_project_args<T>(given, n, 0, viewmat, K, K_inv, width, height, antialiased);
      Outputs o;
      const int64_t m = splat::cull_gaussians_cpu<T>(in, near_plane, far_plane, [&](int64_t count) {
        return static_cast<int64_t*>(o.add(scratch_tensor({count}, 0, 64))->dl_tensor.data);
      });
      in.ids = o.data<int64_t>(0);
      in.m = m;
      o.add(real_tensor<T>({m, splat::kGaussParams}));
      o.add(real_tensor<T>({m, 2}));
      o.add(real_tensor<T>({m}));
      o.add(int32_tensor({m, 4}));
      o.add(int32_tensor({m}));
      const splat::GaussProjectOutputs<T> out{o.data<T>(1), o.data<T>(2), o.data<T>(3),
                                              o.data<int32_t>(4), o.data<int32_t>(5)};
      o.add(scalar_tensor<int64_t>(splat::project_gaussians_forward_cpu<T>(in, out), 0));
      o.hand_over(outs);
    });
  });
}

int splat_project_gaussians_backward_cpu(int dtype, const void* const* inputs, int64_t n, int64_t m,
                                         const void* viewmat, const void* K, const void* K_inv,
                                         int64_t width, int64_t height, int antialiased,
                                         const void* const* grads_in, const int64_t* row_strides,
                                         int with_camera, int num_threads,
                                         SplatDLManagedTensor** outs, char* err, size_t err_len) {
  return guarded(err, err_len, num_threads, [&] {
    check_image_size(n, width, height, "Gaussians");
    dispatch(dtype, [&](auto zero) {
      using T = decltype(zero);
      const auto in =
          gauss_project_args<T>(inputs, n, m, viewmat, K, K_inv, width, height, antialiased);
      Outputs o;
      o.add(real_tensor<T>({n, 3}));
      o.add(real_tensor<T>({n, 4}));
      o.add(real_tensor<T>({n, 3}));
      o.add(real_tensor<T>({n}));
      o.add(real_tensor<T>({n, 2}));
      if (with_camera) {
        o.add(real_tensor<T>({4, 4}));
        o.add(real_tensor<T>({3, 3}));
        o.add(real_tensor<T>({3, 3}));
      }
      splat::GaussProjectGrads<T> g{};
      g.v_params = static_cast<const T*>(grads_in[0]);
      g.v_centre = static_cast<const T*>(grads_in[1]);
      g.v_params_row_stride = row_strides[0];
      g.v_centre_row_stride = row_strides[1];
      g.v_means = o.data<T>(0);
      g.v_quats = o.data<T>(1);
      g.v_scales = o.data<T>(2);
      g.v_opacities = o.data<T>(3);
      g.v_means2d = o.data<T>(4);
      if (with_camera) {
        g.v_viewmat = o.data<T>(5);
        g.v_K = o.data<T>(6);
        g.v_K_inv = o.data<T>(7);
      }
      splat::project_gaussians_backward_cpu<T>(in, g);
      o.hand_over(outs);
    });
  });
}
// ---- end of the 3D Gaussians' projection ----

int splat_ssim_forward_cpu(int dtype, const void* x, const void* y, const void* window,
                           int64_t window_size, int64_t height, int64_t width, int64_t channels,
                           double c1, double c2, int with_grad, int num_threads,
                           SplatDLManagedTensor** outs, char* err, size_t err_len) {
  return guarded(err, err_len, num_threads, [&] {
    dispatch(dtype, [&](auto zero) {
      using T = decltype(zero);
      Outputs o;
      if (with_grad)
        o.add(real_tensor<T>({3, height, width, channels}));
      else
        o.add(real_tensor<T>({0}));
      const double mean = splat::ssim_forward_cpu(
          ssim_args<T>(x, y, window, window_size, height, width, channels, c1, c2),
          with_grad ? o.data<T>(0) : nullptr);
      o.list.insert(o.list.begin(), scalar_tensor<T>(static_cast<T>(mean), 2));
      o.hand_over(outs);
    });
  });
}

int splat_ssim_backward_cpu(int dtype, const void* x, const void* y, const void* window,
                            int64_t window_size, int64_t height, int64_t width, int64_t channels,
                            double c1, double c2, const void* maps, double scale, int num_threads,
                            SplatDLManagedTensor** dx, char* err, size_t err_len) {
  return guarded(err, err_len, num_threads, [&] {
    dispatch(dtype, [&](auto zero) {
      using T = decltype(zero);
      Outputs o;
      o.add(real_tensor<T>({height, width, channels}));
      splat::ssim_backward_cpu(
          ssim_args<T>(x, y, window, window_size, height, width, channels, c1, c2),
          static_cast<const T*>(maps), scale, o.data<T>(0));
      o.hand_over(dx);
    });
  });
}

int splat_normal_loss_forward_cpu(int dtype, const void* depth, const void* normal,
                                  const void* alpha, const double* K, const double* viewmat,
                                  int64_t height, int64_t width, int num_threads,
                                  SplatDLManagedTensor** loss, char* err, size_t err_len) {
  return guarded(err, err_len, num_threads, [&] {
    dispatch(dtype, [&](auto zero) {
      using T = decltype(zero);
      Outputs o;
      o.add(scalar_tensor<T>(static_cast<T>(splat::normal_loss_forward_cpu<T>(normal_loss_args<T>(
                                 depth, normal, alpha, K, viewmat, height, width))),
                             2));
      o.hand_over(loss);
    });
  });
}

int splat_normal_loss_backward_cpu(int dtype, const void* depth, const void* normal,
                                   const void* alpha, const double* K, const double* viewmat,
                                   int64_t height, int64_t width, double scale, int num_threads,
                                   SplatDLManagedTensor** outs, char* err, size_t err_len) {
  return guarded(err, err_len, num_threads, [&] {
    dispatch(dtype, [&](auto zero) {
      using T = decltype(zero);
      Outputs o;
      o.add(real_tensor<T>({height, width}));
      o.add(real_tensor<T>({height, width, 3}));
      splat::normal_loss_backward_cpu<T>(
          normal_loss_args<T>(depth, normal, alpha, K, viewmat, height, width), scale, o.data<T>(0),
          o.data<T>(1));
      o.hand_over(outs);
    });
  });
}

int splat_exp_float32(const float* x, int64_t n, float* scalar_out, float* lanes_out, char* err,
                      size_t err_len) {
  return guarded(err, err_len, 0, [&] {
    require(n >= 0 && n % splat::kLanes == 0,
            "x must be a contiguous float32 vector whose length is a multiple of 8");
    for (int64_t i = 0; i < n; ++i) scalar_out[i] = splat::exp_of(x[i]);
    for (int64_t i = 0; i < n; i += splat::kLanes)
      splat::store8(lanes_out + i, splat::exp_of(splat::load8(x + i)));
  });
}

int splat_set_cpu_kernel_mode(int mode, char* err, size_t err_len) {
  return guarded(err, err_len, 0, [&] {
    require(mode >= 0 && mode <= 2,
            "CPU kernel mode must be 0 (reference), 1 (scalar) or 2 (simd)");
    splat::set_cpu_kernel_mode(mode);
  });
}

int splat_cpu_kernel_mode(void) { return splat::cpu_kernel_mode(); }

int64_t splat_release_cpu_scratch(void) { return int64_t(splat::release_scratch_cache()); }

}  // extern "C"
