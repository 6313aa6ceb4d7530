// Run-time dispatch of the CPU entry points over instruction sets.
//
// On x86-64 ELF targets built with GCC, an entry point marked SPLAT_CLONES_V4
// or SPLAT_CLONES_AVX2 is compiled once per listed target and the loader picks
// the best one for the running CPU (an ifunc).  Every clone computes the same
// bits: the kernels use only IEEE + - * / sqrt and compares, and no FMA
// (-ffp-contract=off in _compile_flags.py), so a wider instruction set changes
// how many lanes run at once, never a result.
//
// Elsewhere (aarch64, macOS, Windows, or any compiler that is not GCC) the
// macros are empty and each entry point is compiled once for the target's
// baseline (on aarch64: NEON, which the 8-lane vector type of simd.h maps
// onto).  SPLAT_NO_CLONES forces that path on x86-64 too, so that it can be
// built and compared bitwise here (scripts/cross_compile_check.sh).
//
// target_clones needs external linkage: the marked functions are never in an
// anonymous namespace.
#pragma once

#if defined(__x86_64__) && defined(__ELF__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(SPLAT_NO_CLONES)
#define SPLAT_CLONES_V4 __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#define SPLAT_CLONES_AVX2 __attribute__((target_clones("avx2", "default")))
#else
#define SPLAT_CLONES_V4
#define SPLAT_CLONES_AVX2
#endif
