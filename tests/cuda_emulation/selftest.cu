// Kernels with known synchronisation bugs, to check that cudaemu reports each
// one with its file and line (tests/test_cuda_emulation.py).  Compiled like the
// project's .cu files: rewritten by rewrite.py, against the shim.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace {

constexpr unsigned kFull = 0xffffffffu;

__global__ void block_sum(const int* in, int* out) {  // correct: barriers + a warp reduction
  __shared__ int partial[8];
  const int tid = threadIdx.x;
  int v = in[blockIdx.x * blockDim.x + tid];
  for (int d = 16; d > 0; d /= 2) v += __shfl_down_sync(kFull, v, d);
  if ((tid & 31) == 0) partial[tid / 32] = v;
  __syncthreads();
  if (tid == 0) {
    int s = 0;
    for (int w = 0; w < int(blockDim.x / 32); ++w) s += partial[w];
    out[blockIdx.x] = s;
  }
}

__global__ void count_kernel(int* out) {  // correct: __syncthreads_count / __ballot_sync
  const int c = __syncthreads_count(threadIdx.x % 3 == 0);
  const unsigned b = __ballot_sync(kFull, threadIdx.x & 1);
  if (threadIdx.x == 0) out[0] = c, out[1] = int(b);
}

__global__ void divergent_barrier() {
  if (threadIdx.x < 16) {
    __syncthreads();  // SELFTEST divergent_barrier A
  } else {
    __syncthreads();  // SELFTEST divergent_barrier B
  }
}

__global__ void deadlock() {
  if (threadIdx.x < 16) {
    (void)__shfl_sync(kFull, 1, 0);  // SELFTEST deadlock
  } else {
    __syncthreads();
  }
}

__global__ void exited_lane(int* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(kFull, int(threadIdx.x), 1);  // SELFTEST exited_lane
}

__global__ void partial_warp(int* out) {  // launched with 48 threads: warp 1 has 16 lanes
  out[threadIdx.x] = __shfl_xor_sync(kFull, int(threadIdx.x), 1);  // SELFTEST partial_warp
}

__global__ void lane_not_in_mask(int* out) {
  out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, int(threadIdx.x), 1);  // SELFTEST lane_not_in_mask
}

__global__ void vote_in_branch(int* out) {
  if (threadIdx.x < 8) out[threadIdx.x] = __any_sync(kFull, 1);  // SELFTEST vote_in_branch
  __syncthreads();
}

__global__ void too_much_shared(double* out) {
  __shared__ double big[7 * 1024];  // SELFTEST too_much_shared (56 KiB)
  big[threadIdx.x] = 1.0;
  __syncthreads();
  out[threadIdx.x] = big[(threadIdx.x + 1) % blockDim.x];
}

__global__ void uninitialised_shared(int* out) {
  __shared__ int value;  // never written: the poison is read
  out[threadIdx.x] = value;
}

__global__ void empty_kernel() {}

}  // namespace

cudaError_t cudaemu_selftest(const std::string& name) {
  static int ibuf[4096];
  static double dbuf[4096];
  if (name == "good") {
    for (int i = 0; i < 512; ++i) ibuf[i] = i;
    block_sum<<<2, 256>>>(ibuf, ibuf + 1024);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    count_kernel<<<1, 64>>>(ibuf + 2048);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    // sum(0..255) = 32640, sum(256..511) = 98176; 22 of 64 ids are 0 mod 3; odd lanes.
    if (ibuf[1024] != 32640 || ibuf[1025] != 98176 || ibuf[2048] != 22 ||
        unsigned(ibuf[2049]) != 0xaaaaaaaau)
      return cudaErrorInvalidValue;
    return cudaSuccess;
  }
  if (name == "divergent_barrier") divergent_barrier<<<1, 32>>>();
  else if (name == "deadlock") deadlock<<<1, 32>>>();
  else if (name == "exited_lane") exited_lane<<<1, 32>>>(ibuf);
  else if (name == "partial_warp") partial_warp<<<1, 48>>>(ibuf);
  else if (name == "lane_not_in_mask") lane_not_in_mask<<<1, 32>>>(ibuf);
  else if (name == "vote_in_branch") vote_in_branch<<<1, 32>>>(ibuf);
  else if (name == "too_much_shared") too_much_shared<<<1, 64>>>(dbuf);
  else if (name == "uninitialised_shared") {
    uninitialised_shared<<<1, 1>>>(ibuf);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    return ibuf[0] == 0 ? cudaErrorInvalidValue : cudaSuccess;  // poisoned, so not 0
  }
  else if (name == "block_too_large") empty_kernel<<<1, 2048>>>();
  else if (name == "grid_y_too_large") empty_kernel<<<dim3(1, 65536), 32>>>();
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}
