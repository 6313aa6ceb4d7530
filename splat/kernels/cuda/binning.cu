// Tile binning on the GPU: lists, per tile, the visible surfels front to back
// (by centre depth, ties by surfel index), in exactly the order of
// bin_tiles_cpu (cpu/rasterize_cpu.cpp).
//
// Why two sorts instead of one sort on (tile << 32 | depth bits) keys:
//   * the order must equal a STABLE sort of the visible surfels by depth,
//     then a per-tile listing.  Sorting the N surfels once by depth (a stable
//     radix sort, ids in index order as input) and then stable-sorting the P
//     pairs by tile id alone gives exactly that lexicographic (tile, depth,
//     index) order;
//   * it is exact for float64 too (a 64-bit depth key would not fit next to
//     the tile id in one 64-bit key, and rounding depth to float would merge
//     distinct depths into index-order ties);
//   * the big sort (P pairs, P >> N) then has only ceil(log2(num_tiles)) key
//     bits and 32-bit keys: 2 radix passes for ~8k tiles instead of ~6 for a
//     45-bit key, with half the key traffic.  The extra sort is over N only.
//
// Phase 1 (bin_count):  depth keys -> sort (N) -> tile counts in depth order
//                       -> inclusive scan -> P read back to the host (1 sync).
// Phase 2 (bin_pairs):  duplicate (N threads, P writes) -> sort by tile (P)
//                       -> tile_offsets (P threads).
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <cstdint>

#include "../core.h"
#include "rasterize_cuda.h"

namespace splat {
namespace gpu {
namespace {

constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>((n + kThreads - 1) / kThreads);
}

// The depth sort key type of a scalar type (core.h depth_sort_key).
template <typename T>
using DepthKey = decltype(depth_sort_key(T()));

template <typename T>
__global__ void depth_keys_kernel(const T* __restrict__ depth, int n,
                                  DepthKey<T>* __restrict__ keys, int32_t* __restrict__ ids) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  keys[i] = depth_sort_key(depth[i]);
  ids[i] = i;  // index order in, and the sort is stable: equal depths stay in index order
}

// counts[j]: tiles touched by the j-th surfel in depth order (0 if culled).
__global__ void count_tiles_kernel(const int32_t* __restrict__ pixel_rect,
                                   const int32_t* __restrict__ sorted_ids, int n, int tiles_x,
                                   int tiles_y, int64_t* __restrict__ counts) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n) return;
  counts[j] = tile_count(listed_tiles(pixel_rect, sorted_ids[j], tiles_x, tiles_y));
}

// Writes the pairs of the j-th surfel in depth order at [pair_end[j-1], pair_end[j]).
// Pairs therefore come out in depth order, and the stable sort by tile id that
// follows keeps that order inside each tile.
__global__ void duplicate_kernel(const int32_t* __restrict__ pixel_rect,
                                 const int32_t* __restrict__ sorted_ids,
                                 const int64_t* __restrict__ pair_end, int n, int tiles_x,
                                 int tiles_y, uint32_t* __restrict__ tile_keys,
                                 int32_t* __restrict__ values) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n) return;
  const int32_t id = sorted_ids[j];
  const PixelRect r = listed_tiles(pixel_rect, id, tiles_x, tiles_y);
  int64_t out = j == 0 ? 0 : pair_end[j - 1];
  for (int ty = r.y0; ty < r.y1; ++ty)
    for (int tx = r.x0; tx < r.x1; ++tx) {
      tile_keys[out] = static_cast<uint32_t>(ty * tiles_x + tx);
      values[out] = id;
      ++out;
    }
}

// tile_offsets from the tile-sorted keys: each pair i writes the start of every
// tile in (tile(i-1), tile(i)] (so tiles without pairs get an empty range
// ending where the next non-empty one starts), and the last pair writes P into
// every entry after its tile.  Each of the num_tiles + 1 entries is written by
// exactly one thread: no memset, no atomics.
__global__ void tile_offsets_kernel(const uint32_t* __restrict__ sorted_tiles, int64_t num_pairs,
                                    int num_tiles, int64_t* __restrict__ tile_offsets) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= num_pairs) return;
  const int tile = static_cast<int>(sorted_tiles[i]);
  const int prev = i == 0 ? -1 : static_cast<int>(sorted_tiles[i - 1]);
  for (int t = prev + 1; t <= tile; ++t) tile_offsets[t] = i;
  if (i == num_pairs - 1)
    for (int t = tile + 1; t <= num_tiles; ++t) tile_offsets[t] = num_pairs;
}

// ---- workspace layouts -------------------------------------------------------
// One byte buffer per phase, carved into 256-byte-aligned pieces, so the glue
// makes one torch allocation per phase (from the caching allocator, no sync).
constexpr size_t kAlign = 256;
inline size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

template <typename T>
struct CountLayout {
  using Key = DepthKey<T>;
  size_t keys, keys_sorted, ids, ids_sorted, counts, pair_end, temp, temp_bytes, total;

  explicit CountLayout(int n) {
    size_t sort_bytes = 0, scan_bytes = 0;
    cub::DeviceRadixSort::SortPairs(
        nullptr, sort_bytes, static_cast<const Key*>(nullptr), static_cast<Key*>(nullptr),
        static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n);
    cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, static_cast<const int64_t*>(nullptr),
                                  static_cast<int64_t*>(nullptr), n);
    temp_bytes = sort_bytes > scan_bytes ? sort_bytes : scan_bytes;
    size_t at = 0;
    keys = at;
    at += align_up(sizeof(Key) * n);
    keys_sorted = at;
    at += align_up(sizeof(Key) * n);
    ids = at;
    at += align_up(sizeof(int32_t) * n);
    ids_sorted = at;
    at += align_up(sizeof(int32_t) * n);
    counts = at;
    at += align_up(sizeof(int64_t) * n);
    pair_end = at;
    at += align_up(sizeof(int64_t) * n);
    temp = at;
    at += align_up(temp_bytes);
    total = at;
  }
};

struct PairsLayout {
  size_t keys, keys_sorted, values, temp, temp_bytes, total;

  PairsLayout(int num_pairs, int end_bit) {
    temp_bytes = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const uint32_t*>(nullptr),
                                    static_cast<uint32_t*>(nullptr),
                                    static_cast<const int32_t*>(nullptr),
                                    static_cast<int32_t*>(nullptr), num_pairs, 0, end_bit);
    size_t at = 0;
    keys = at;
    at += align_up(sizeof(uint32_t) * num_pairs);
    keys_sorted = at;
    at += align_up(sizeof(uint32_t) * num_pairs);
    values = at;
    at += align_up(sizeof(int32_t) * num_pairs);
    temp = at;
    at += align_up(temp_bytes);
    total = at;
  }
};

// Key bits the tile sort needs: enough for num_tiles - 1 (at least 1).
inline int tile_bits(int num_tiles) {
  int bits = 1;
  while (bits < 32 && (uint64_t(1) << bits) < uint64_t(num_tiles)) ++bits;
  return bits;
}

template <typename P>
P* at_offset(void* base, size_t offset) {
  return reinterpret_cast<P*>(static_cast<char*>(base) + offset);
}
template <typename P>
const P* at_offset(const void* base, size_t offset) {
  return reinterpret_cast<const P*>(static_cast<const char*>(base) + offset);
}

#define SPLAT_RETURN_IF_ERROR(expr)       \
  do {                                    \
    const cudaError_t err_ = (expr);      \
    if (err_ != cudaSuccess) return err_; \
  } while (0)

}  // namespace

template <typename T>
size_t bin_count_workspace_bytes(int64_t n) {
  return CountLayout<T>(static_cast<int>(n)).total;
}

template <typename T>
cudaError_t bin_count(const T* depth, const int32_t* pixel_rect, int64_t n64, int tiles_x,
                      int tiles_y, void* workspace, size_t workspace_bytes, int64_t* num_pairs,
                      cudaStream_t stream) {
  using Key = DepthKey<T>;
  *num_pairs = 0;
  if (n64 <= 0) return cudaSuccess;
  if (n64 >= (int64_t(1) << 31)) return cudaErrorInvalidValue;
  const int n = static_cast<int>(n64);
  const CountLayout<T> L(n);
  if (workspace_bytes < L.total) return cudaErrorInvalidValue;
  Key* keys = at_offset<Key>(workspace, L.keys);
  Key* keys_sorted = at_offset<Key>(workspace, L.keys_sorted);
  int32_t* ids = at_offset<int32_t>(workspace, L.ids);
  int32_t* ids_sorted = at_offset<int32_t>(workspace, L.ids_sorted);
  int64_t* counts = at_offset<int64_t>(workspace, L.counts);
  int64_t* pair_end = at_offset<int64_t>(workspace, L.pair_end);
  void* temp = at_offset<char>(workspace, L.temp);

  depth_keys_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(depth, n, keys, ids);
  SPLAT_RETURN_IF_ERROR(cudaGetLastError());
  size_t temp_bytes = L.temp_bytes;
  SPLAT_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(
      temp, temp_bytes, keys, keys_sorted, ids, ids_sorted, n, 0, int(sizeof(Key) * 8), stream));
  count_tiles_kernel<<<blocks_for(n), kThreads, 0, stream>>>(pixel_rect, ids_sorted, n, tiles_x,
                                                             tiles_y, counts);
  SPLAT_RETURN_IF_ERROR(cudaGetLastError());
  temp_bytes = L.temp_bytes;
  SPLAT_RETURN_IF_ERROR(
      cub::DeviceScan::InclusiveSum(temp, temp_bytes, counts, pair_end, n, stream));
  // The one host sync: the caller must know P to allocate the pair arrays.
  SPLAT_RETURN_IF_ERROR(cudaMemcpyAsync(num_pairs, pair_end + (n - 1), sizeof(int64_t),
                                        cudaMemcpyDeviceToHost, stream));
  return cudaStreamSynchronize(stream);
}

size_t bin_pairs_workspace_bytes(int64_t num_pairs, int num_tiles) {
  return PairsLayout(static_cast<int>(num_pairs), tile_bits(num_tiles)).total;
}

template <typename T>
cudaError_t bin_pairs(const int32_t* pixel_rect, int64_t n64, int tiles_x, int tiles_y,
                      const void* count_workspace, int64_t num_pairs64, void* workspace,
                      size_t workspace_bytes, int32_t* point_list, int64_t* tile_offsets,
                      cudaStream_t stream) {
  const int num_tiles = tiles_x * tiles_y;
  if (num_pairs64 <= 0 || n64 <= 0) {
    // No pairs: every tile gets the empty range [0, 0).
    return cudaMemsetAsync(tile_offsets, 0, sizeof(int64_t) * (num_tiles + 1), stream);
  }
  if (num_pairs64 >= (int64_t(1) << 31) || n64 >= (int64_t(1) << 31)) return cudaErrorInvalidValue;
  const int n = static_cast<int>(n64);
  const int num_pairs = static_cast<int>(num_pairs64);
  const int end_bit = tile_bits(num_tiles);
  const CountLayout<T> C(n);
  const PairsLayout L(num_pairs, end_bit);
  if (workspace_bytes < L.total) return cudaErrorInvalidValue;
  const int32_t* ids_sorted = at_offset<int32_t>(count_workspace, C.ids_sorted);
  const int64_t* pair_end = at_offset<int64_t>(count_workspace, C.pair_end);
  uint32_t* keys = at_offset<uint32_t>(workspace, L.keys);
  uint32_t* keys_sorted = at_offset<uint32_t>(workspace, L.keys_sorted);
  int32_t* values = at_offset<int32_t>(workspace, L.values);
  void* temp = at_offset<char>(workspace, L.temp);

  duplicate_kernel<<<blocks_for(n), kThreads, 0, stream>>>(pixel_rect, ids_sorted, pair_end, n,
                                                           tiles_x, tiles_y, keys, values);
  SPLAT_RETURN_IF_ERROR(cudaGetLastError());
  // Stable LSD radix sort on the tile bits only: inside a tile the pairs keep
  // the depth order (then index order) in which duplicate_kernel wrote them.
  size_t temp_bytes = L.temp_bytes;
  SPLAT_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, keys_sorted, values,
                                                        point_list, num_pairs, 0, end_bit, stream));
  tile_offsets_kernel<<<blocks_for(num_pairs), kThreads, 0, stream>>>(keys_sorted, num_pairs,
                                                                      num_tiles, tile_offsets);
  return cudaGetLastError();
}

#define SPLAT_INSTANTIATE(T)                                                                    \
  template size_t bin_count_workspace_bytes<T>(int64_t);                                        \
  template cudaError_t bin_count<T>(const T*, const int32_t*, int64_t, int, int, void*, size_t, \
                                    int64_t*, cudaStream_t);                                    \
  template cudaError_t bin_pairs<T>(const int32_t*, int64_t, int, int, const void*, int64_t,    \
                                    void*, size_t, int32_t*, int64_t*, cudaStream_t);
SPLAT_INSTANTIATE(float)
SPLAT_INSTANTIATE(double)
#undef SPLAT_INSTANTIATE

}  // namespace gpu
}  // namespace splat
