// Python module of the CUDA emulation harness: the UNCHANGED binning.cu,
// forward.cu and backward.cu (surfels and 3D Gaussians), compiled against the cudaemu shim, driven by the
// very host call sequence of the real CUDA bindings (host_sequence.h) on CPU
// tensors, so the results can be compared with splat._C.forward_cpu /
// backward_cpu.
#include <torch/extension.h>

#include <cstring>
#include <string>
#include <vector>

#include "cuda/host_sequence.h"  // -> <cuda_runtime.h> = the cudaemu shim

cudaError_t cudaemu_selftest(const std::string& name);  // selftest.cu

namespace {

// Device memory comes from torch::empty filled with garbage, as memory from
// the caching allocator would be: nothing may rely on it being zero.
struct EmulatedDevice {
  static constexpr c10::DeviceType kType = c10::DeviceType::CPU;
  static constexpr bool kHostMemory = true;
  static torch::Tensor empty(at::IntArrayRef shape, const torch::TensorOptions& opts) {
    auto t = torch::empty(shape, opts);
    if (t.numel()) std::memset(t.data_ptr(), 0xCD, t.numel() * t.element_size());
    return t;
  }
  static cudaStream_t stream() { return nullptr; }
  struct Guard {
    explicit Guard(const torch::Device&) {}
  };
};

cudaemu::Order order(const std::string& name) {
  if (name == "fwd") return cudaemu::Order::Forward;
  if (name == "rev") return cudaemu::Order::Reverse;
  TORCH_CHECK(name == "rand", "order must be fwd, rev or rand, got ", name);
  return cudaemu::Order::Random;
}

void configure(const std::string& thread_order, const std::string& block_order, int64_t poison,
               int64_t seed) {
  TORCH_CHECK(poison >= 0 && poison <= 255, "poison is a byte value, got ", poison);
  cudaemu::configure(order(thread_order), order(block_order), int(poison), unsigned(seed));
}

std::vector<int64_t> stats() {
  const auto& s = cudaemu::st().stats;
  return {int64_t(s.launches), int64_t(s.blocks), int64_t(s.switches)};
}

std::string selftest(const std::string& name) {
  const cudaError_t e = cudaemu_selftest(name);
  return e == cudaSuccess ? "ok" : cudaGetErrorString(e);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &splat::host_sequence::forward<EmulatedDevice>,
        "forward_cuda's sequence, kernels emulated on the CPU");
  m.def("backward", &splat::host_sequence::backward<EmulatedDevice>,
        "backward_cuda's sequence, kernels emulated on the CPU");
  m.def("forward_gaussians", &splat::host_sequence::forward_gaussians<EmulatedDevice>,
        "forward_gaussians_cuda's sequence, kernels emulated on the CPU");
  m.def("backward_gaussians", &splat::host_sequence::backward_gaussians<EmulatedDevice>,
        "backward_gaussians_cuda's sequence, kernels emulated on the CPU");
  m.def("configure", &configure, "thread order, block order (fwd|rev|rand), poison byte, seed");
  m.def("stats", &stats, "[launches, blocks, fiber switches] so far");
  m.def("selftest", &selftest, "runs a known-bad (or good) kernel of selftest.cu");
}
