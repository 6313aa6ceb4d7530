// See scratch.h.
#include "scratch.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <unordered_map>

#if defined(_WIN32)
#include <malloc.h>  // _aligned_malloc
#endif

namespace splat {

namespace {

constexpr size_t kAlign = 64;

// 64-byte aligned blocks of a multiple of 64 bytes.  The Windows C runtime has
// no aligned_alloc: its aligned blocks come from _aligned_malloc and go back
// through _aligned_free.
void* aligned_block(size_t size) {
#if defined(_WIN32)
  void* p = _aligned_malloc(size, kAlign);
#else
  void* p = std::aligned_alloc(kAlign, size);
#endif
  if (!p) throw std::bad_alloc();
  return p;
}

void free_aligned_block(void* p) {
#if defined(_WIN32)
  _aligned_free(p);
#else
  std::free(p);
#endif
}

struct ScratchCache {
  std::mutex mutex;
  std::multimap<size_t, void*> free_blocks;  // by size
  std::unordered_map<void*, size_t> sizes;   // every block from the cache, live or free
  size_t cached_bytes = 0;

  void free_block(std::multimap<size_t, void*>::iterator it) {
    cached_bytes -= it->first;
    sizes.erase(it->second);
    free_aligned_block(it->second);
    free_blocks.erase(it);
  }
};

// Never destroyed: tensors holding scratch memory may be freed after static
// destructors have run.
ScratchCache& cache() {
  static ScratchCache* c = new ScratchCache;
  return *c;
}

}  // namespace

void* scratch_acquire(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (bytes < kScratchMinBytes) {
    return aligned_block((bytes + kAlign - 1) / kAlign * kAlign);
  }
  ScratchCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  // the smallest cached block that fits, if it is at most twice the request
  auto it = c.free_blocks.lower_bound(bytes);
  if (it != c.free_blocks.end() && it->first / 2 <= bytes) {
    void* p = it->second;
    c.cached_bytes -= it->first;
    c.free_blocks.erase(it);
    return p;
  }
  // none fits: the smaller cached blocks are likely stale sizes
  while (!c.free_blocks.empty() && c.free_blocks.begin()->first < bytes)
    c.free_block(c.free_blocks.begin());
  const size_t size = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = aligned_block(size);
  c.sizes.emplace(p, size);
  return p;
}

void scratch_release(void* block) {
  if (!block) return;
  ScratchCache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    const auto found = c.sizes.find(block);
    if (found != c.sizes.end()) {
      const size_t size = found->second;
      c.free_blocks.emplace(size, block);
      c.cached_bytes += size;
      // over the cap: free the largest cached blocks first
      while (c.cached_bytes > kScratchCacheBytes) c.free_block(std::prev(c.free_blocks.end()));
      return;
    }
  }
  free_aligned_block(block);  // a small block, never cached
}

size_t release_scratch_cache() {
  ScratchCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  const size_t freed = c.cached_bytes;
  while (!c.free_blocks.empty()) c.free_block(c.free_blocks.begin());
  return freed;
}

}  // namespace splat
