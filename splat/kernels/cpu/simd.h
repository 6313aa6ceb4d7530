// 8 float32 lanes for the CPU kernels: the lane type core.h's per-pixel
// functions are instantiated with (see "lanes" in core.h).  Written with GCC /
// Clang vector extensions, so it is portable: the compiler emits one AVX2
// instruction per operation in functions compiled for AVX2 (runtime dispatch
// in rasterize_cpu.cpp) and two SSE instructions elsewhere.  Only IEEE
// operations that round exactly like their scalar counterparts are used
// (+ - * / and compares; no FMA, no approximate reciprocals), so every lane
// computes the scalar path's bits.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>  // SSE movmskps: baseline x86-64, so usable in every clone
#endif

#include "../core.h"

#pragma GCC diagnostic ignored "-Wpsabi"  // vector arguments only cross inlined calls

namespace splat {

constexpr int kLanes = 8;
typedef float f32x8 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef float f32x4 __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));

// Lane mask: all bits set (-1) or clear (0) per lane, as vector compares give.
struct VMask {
  i32x8 m;
};
struct VInt {
  i32x8 v;
  VInt() = default;
  VInt(int32_t x) : v(i32x8{} + x) {}
  explicit VInt(i32x8 x) : v(x) {}
};
struct VFloat {
  f32x8 v;
  VFloat() = default;
  VFloat(float x) : v(f32x8{} + x) {}
  explicit VFloat(f32x8 x) : v(x) {}
};

template <>
struct Lanes<VFloat> {
  using Mask = VMask;
  using Int = VInt;
};

inline VFloat operator+(VFloat a, VFloat b) { return VFloat(a.v + b.v); }
inline VFloat operator-(VFloat a, VFloat b) { return VFloat(a.v - b.v); }
inline VFloat operator*(VFloat a, VFloat b) { return VFloat(a.v * b.v); }
inline VFloat operator/(VFloat a, VFloat b) { return VFloat(a.v / b.v); }
inline VFloat operator-(VFloat a) { return VFloat(-a.v); }
inline VFloat operator+(VFloat a, float b) { return VFloat(a.v + b); }
inline VFloat operator-(VFloat a, float b) { return VFloat(a.v - b); }
inline VFloat operator*(VFloat a, float b) { return VFloat(a.v * b); }
inline VFloat operator/(VFloat a, float b) { return VFloat(a.v / b); }
inline VFloat operator+(float a, VFloat b) { return VFloat(a + b.v); }
inline VFloat operator-(float a, VFloat b) { return VFloat(a - b.v); }
inline VFloat operator*(float a, VFloat b) { return VFloat(a * b.v); }
inline VFloat operator/(float a, VFloat b) { return VFloat(a / b.v); }
inline VFloat& operator+=(VFloat& a, VFloat b) {
  a.v += b.v;
  return a;
}
inline VFloat& operator-=(VFloat& a, VFloat b) {
  a.v -= b.v;
  return a;
}
inline VMask operator<(VFloat a, VFloat b) { return VMask{a.v < b.v}; }
inline VMask operator>(VFloat a, VFloat b) { return VMask{a.v > b.v}; }
inline VMask operator>=(VFloat a, VFloat b) { return VMask{a.v >= b.v}; }
inline VMask operator<(VFloat a, float b) { return VMask{a.v < b}; }
inline VMask operator>(VFloat a, float b) { return VMask{a.v > b}; }
inline VMask operator>=(VFloat a, float b) { return VMask{a.v >= b}; }
inline VMask operator==(VFloat a, float b) { return VMask{a.v == b}; }
inline VMask operator==(VInt a, int32_t b) { return VMask{a.v == b}; }
inline VMask operator<(VInt a, VInt b) { return VMask{a.v < b.v}; }

inline VMask mask_and(VMask a, VMask b) { return VMask{a.m & b.m}; }
inline VMask mask_or(VMask a, VMask b) { return VMask{a.m | b.m}; }
inline VMask mask_not(VMask a) { return VMask{~a.m}; }
// Lane masks as bits (lane i = bit i).  The tile loops test and convert masks
// at every visit, so on x86-64 this is the movmskps instruction (on each
// 128-bit half) rather than a chain of lane extractions.
inline uint32_t lane_bits(VMask a) {
  const i32x4 lo = __builtin_shufflevector(a.m, a.m, 0, 1, 2, 3);
  const i32x4 hi = __builtin_shufflevector(a.m, a.m, 4, 5, 6, 7);
#if defined(__x86_64__)
  return uint32_t(_mm_movemask_ps((__m128)lo)) | uint32_t(_mm_movemask_ps((__m128)hi)) << 4;
#else
  uint32_t bits = 0;
  for (int i = 0; i < 4; ++i) bits |= uint32_t(lo[i] != 0) << i | uint32_t(hi[i] != 0) << (i + 4);
  return bits;
#endif
}
inline bool any_lane(VMask a) {
  const i32x4 either =
      __builtin_shufflevector(a.m, a.m, 0, 1, 2, 3) | __builtin_shufflevector(a.m, a.m, 4, 5, 6, 7);
#if defined(__x86_64__)
  return _mm_movemask_ps((__m128)either) != 0;
#else
  return (either[0] | either[1] | either[2] | either[3]) != 0;
#endif
}
inline VFloat select(VMask m, VFloat a, VFloat b) {
  // same-size vector casts reinterpret the bits
  const i32x8 r = ((i32x8)a.v & m.m) | ((i32x8)b.v & ~m.m);
  return VFloat((f32x8)r);
}
inline VInt select(VMask m, VInt a, VInt b) { return VInt((a.v & m.m) | (b.v & ~m.m)); }
inline VMask select(VMask m, VMask a, VMask b) { return VMask{(a.m & m.m) | (b.m & ~m.m)}; }

// For exp_float (core.h).
inline VInt trunc_to_int(VFloat x) { return VInt(__builtin_convertvector(x.v, i32x8)); }
inline VFloat to_float(VInt n) { return VFloat(__builtin_convertvector(n.v, f32x8)); }
inline VFloat pow2i(VInt n) { return VFloat((f32x8)((n.v + 127) << 23)); }
inline VFloat exp_of(VFloat x) { return exp_float(x); }
// Correctly rounded per lane, like the scalar sqrtf (one sqrtps / vsqrtps).
inline VFloat sqrt_of(VFloat x) {
  VFloat r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = __builtin_sqrtf(x.v[i]);
  return r;
}

inline VFloat load8(const float* p) {
  VFloat r;
  std::memcpy(&r.v, p, sizeof r.v);
  return r;
}
inline void store8(float* p, VFloat x) { std::memcpy(p, &x.v, sizeof x.v); }
inline VInt load8(const int32_t* p) {
  VInt r;
  std::memcpy(&r.v, p, sizeof r.v);
  return r;
}
inline void store8(int32_t* p, VInt x) { std::memcpy(p, &x.v, sizeof x.v); }

// The inverse of lane_bits.
inline VMask mask_from_bits(uint32_t bits) {
  return VMask{((i32x8{} + int32_t(bits)) & i32x8{1, 2, 4, 8, 16, 32, 64, 128}) != 0};
}

// Two 4-lane halves from two addresses: lanes 0-3 from a, 4-7 from b.
inline VFloat load_halves(const float* a, const float* b) {
  f32x4 lo, hi;
  std::memcpy(&lo, a, sizeof lo);
  std::memcpy(&hi, b, sizeof hi);
  return VFloat(__builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7));
}
inline VInt load_halves(const int32_t* a, const int32_t* b) {
  i32x4 lo, hi;
  std::memcpy(&lo, a, sizeof lo);
  std::memcpy(&hi, b, sizeof hi);
  return VInt(__builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7));
}
inline void store_halves(float* a, float* b, VFloat x) {
  const f32x4 lo = __builtin_shufflevector(x.v, x.v, 0, 1, 2, 3);
  const f32x4 hi = __builtin_shufflevector(x.v, x.v, 4, 5, 6, 7);
  std::memcpy(a, &lo, sizeof lo);
  std::memcpy(b, &hi, sizeof hi);
}
inline void store_halves(int32_t* a, int32_t* b, VInt x) {
  const i32x4 lo = __builtin_shufflevector(x.v, x.v, 0, 1, 2, 3);
  const i32x4 hi = __builtin_shufflevector(x.v, x.v, 4, 5, 6, 7);
  std::memcpy(a, &lo, sizeof lo);
  std::memcpy(b, &hi, sizeof hi);
}

// Transposes the 8 x 8 block r[0..7] (vector i, lane l) in place, so that
// afterwards r[l] lane i holds what r[i] lane l held: three rounds of
// shuffles, moving values only (no arithmetic).
inline void transpose8(VFloat* r) {
  f32x8 a[kLanes], b[kLanes];
  for (int i = 0; i < kLanes; i += 2) {
    a[i] = __builtin_shufflevector(r[i].v, r[i + 1].v, 0, 8, 2, 10, 4, 12, 6, 14);
    a[i + 1] = __builtin_shufflevector(r[i].v, r[i + 1].v, 1, 9, 3, 11, 5, 13, 7, 15);
  }
  for (int i = 0; i < kLanes; i += 4) {
    for (int k = 0; k < 2; ++k) {
      b[i + k] = __builtin_shufflevector(a[i + k], a[i + k + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      b[i + k + 2] = __builtin_shufflevector(a[i + k], a[i + k + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  }
  for (int k = 0; k < 4; ++k) {
    r[k].v = __builtin_shufflevector(b[k], b[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    r[k + 4].v = __builtin_shufflevector(b[k], b[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

// Sum of the lanes as a fixed tree ((0+4) + (2+6)) + ((1+5) + (3+7)), written
// as vector operations so that every instruction set computes the same bits
// (and cheaply: three vector adds instead of seven scalar ones).
inline float lane_sum(VFloat x) {
  const f32x4 a =
      __builtin_shufflevector(x.v, x.v, 0, 1, 2, 3) + __builtin_shufflevector(x.v, x.v, 4, 5, 6, 7);
  const f32x4 b = a + __builtin_shufflevector(a, a, 2, 3, 2, 3);
  return b[0] + b[1];
}

}  // namespace splat
