#!/usr/bin/env bash
# Compile check of the CUDA backend without a GPU and without a CUDA build of
# torch: every splat/kernels/cuda/*.cu is compiled with `nvcc -c` for
# sm_80 and sm_90 (the .cu files include no torch header, so this works on any
# machine with nvcc), and so is the C ABI of libsplat_cuda.so
# (splat/kernels/capi_cuda.cpp, host code against the real CUDA runtime
# header, which the emulation tests replace by the shim).  Exits non-zero on
# the first failure.
#
# When the installed torch ships its C++ headers, the torch glue
# (cuda/bindings_cuda.cpp) is also syntax-checked with the host compiler;
# that step is skipped, with a note, when the headers are not there.
#
# Usage: scripts/compile_cuda_check.sh        (NVCC=/path/to/nvcc to override)
set -euo pipefail

cd "$(dirname "$0")/.."
NVCC="${NVCC:-nvcc}"
if ! command -v "$NVCC" >/dev/null 2>&1; then
  echo "compile_cuda_check: nvcc not found (set NVCC=...)" >&2
  exit 1
fi

OUT="$(mktemp -d "${TMPDIR:-/tmp}/splat_cuda_check.XXXXXX")"
trap 'rm -rf "$OUT"' EXIT

# Exact IEEE arithmetic, as the build should use: no --use_fast_math (whose
# flush-to-zero and approximate division/sqrt/exp would change results), and
# --fmad=false so that no multiply-add is contracted into an FMA.  Then the
# device does the same per-operation rounding as the CPU backend, and the
# forward and backward kernels (which both re-run core.h's intersect) take
# identical contributes/alpha decisions.
NVCC_FLAGS=(-c -std=c++17 -O3 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true
            -gencode arch=compute_80,code=sm_80
            -gencode arch=compute_90,code=sm_90
            -I splat/kernels)

status=0
shopt -s nullglob
sources=(splat/kernels/cuda/*.cu)
if [ ${#sources[@]} -eq 0 ]; then
  echo "compile_cuda_check: no .cu files found" >&2
  exit 1
fi
for src in "${sources[@]}"; do
  obj="$OUT/$(basename "$src" .cu).o"
  echo "nvcc $src"
  if ! "$NVCC" "${NVCC_FLAGS[@]}" "$src" -o "$obj"; then
    echo "compile_cuda_check: FAILED $src" >&2
    status=1
  fi
done

capi=splat/kernels/capi_cuda.cpp
echo "nvcc $capi"
if ! "$NVCC" -c -std=c++17 -O3 -I splat/kernels -DSPLAT_CUDA_ARCH_LIST='"sm_80 sm_90"' "$capi" -o "$OUT/capi_cuda.o"; then
  echo "compile_cuda_check: FAILED $capi" >&2
  status=1
fi

# Optional syntax check of the torch glue against the installed torch headers.
glue=splat/kernels/cuda/bindings_cuda.cpp
CXX="${CXX:-g++}"
torch_inc="$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))' 2>/dev/null || true)"
# CUDA headers: $CUDA_HOME, else where nvcc itself says it lives (nvcc may be a
# wrapper script, so its own path proves nothing).
cuda_top="${CUDA_HOME:-$( ("$NVCC" --dryrun -c -x cu /dev/null -o /dev/null 2>&1 || true) | sed -n 's/^#\$ TOP=//p' | head -n 1 || true)}"
cuda_inc="${cuda_top:-/usr/local/cuda}/include"
if [ -f "$glue" ] && [ -n "$torch_inc" ] && [ -f "$torch_inc/c10/cuda/CUDAGuard.h" ] &&
   [ -f "$cuda_inc/cuda_runtime_api.h" ] && command -v "$CXX" >/dev/null 2>&1; then
  # A CPU-only torch lacks c10's generated cuda_cmake_macros.h: stub it.
  stub="$OUT/stub"
  if [ ! -f "$torch_inc/c10/cuda/impl/cuda_cmake_macros.h" ]; then
    mkdir -p "$stub/c10/cuda/impl"
    printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' > "$stub/c10/cuda/impl/cuda_cmake_macros.h"
  fi
  echo "$CXX -fsyntax-only $glue"
  if ! "$CXX" -fsyntax-only -std=c++17 -DSPLAT_WITH_CUDA \
       -isystem "$torch_inc" -isystem "$torch_inc/torch/csrc/api/include" \
       -isystem "$stub" -isystem "$cuda_inc" -I splat/kernels "$glue"; then
    echo "compile_cuda_check: FAILED $glue" >&2
    status=1
  fi
else
  echo "compile_cuda_check: skipping the syntax check of $glue (torch C++ headers or CUDA headers not found)"
fi

if [ $status -eq 0 ]; then echo "compile_cuda_check: OK"; fi
exit $status
