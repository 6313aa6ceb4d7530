// Reused host memory for the CPU kernels' large buffers.
//
// Why: fresh memory from the OS costs a page fault per 4 KiB page on first
// touch.  One rasterizer forward + backward at 1M surfels / 1080p touches
// ~120k fresh pages (outputs, packed surfel records, gradient records), a
// sizeable share of its time (docs/results.md has the measurement), and a
// training step allocates the same sizes again every step.
// Blocks of at least kScratchMinBytes are therefore kept on release and
// handed out again for requests of similar size (up to twice smaller).
//
// Bounded: at most kScratchCacheBytes are kept; a request that no cached block
// fits first frees the cached blocks smaller than itself (sizes grew, e.g.
// after densification), so the peak stays that of the live buffers plus at
// most that cap.  release_scratch_cache() frees everything cached
// (splat._C.release_cpu_scratch()).  Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

namespace splat {

constexpr size_t kScratchMinBytes = size_t(1) << 20;
constexpr size_t kScratchCacheBytes = size_t(2) << 30;

// A block of at least `bytes` (64-byte aligned); nullptr only if bytes == 0.
// Throws std::bad_alloc when memory runs out.
void* scratch_acquire(size_t bytes);
// Returns a block from scratch_acquire (nullptr is ignored).
void scratch_release(void* block);
// Frees every cached block; returns the bytes freed.
size_t release_scratch_cache();

// An array of n T in scratch memory, uninitialised, released on destruction.
template <typename T>
class ScratchArray {
 public:
  explicit ScratchArray(size_t n) : n_(n), p_(static_cast<T*>(scratch_acquire(n * sizeof(T)))) {}
  ~ScratchArray() { scratch_release(p_); }
  ScratchArray(const ScratchArray&) = delete;
  ScratchArray& operator=(const ScratchArray&) = delete;
  T* data() { return p_; }
  const T* data() const { return p_; }
  T& operator[](size_t i) { return p_[i]; }
  const T& operator[](size_t i) const { return p_[i]; }
  size_t size() const { return n_; }
  void swap(ScratchArray& other) {
    std::swap(n_, other.n_);
    std::swap(p_, other.p_);
  }

 private:
  size_t n_;
  T* p_;
};

}  // namespace splat
