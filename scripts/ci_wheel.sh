#!/usr/bin/env bash
# CI: the wheel works without a compiler.  Builds it from this checkout
# (scripts/build_wheels.sh), installs it into a fresh venv (torch==2.13.0 from
# pip, the wheel, the test tools) whose PATH holds no gcc, g++, cc, c++, nvcc
# or ninja and whose CC and CXX are /bin/false, then, from a folder outside
# the checkout, runs the rasterizer and trainer tests against the installed
# package and trains the bundled sample scene for a few hundred steps.
#
#   bash scripts/ci_wheel.sh                # build (needs the "wheel" extra in this Python)
#   bash scripts/ci_wheel.sh WHEEL [PYTHON]  # test a built wheel; the venv from PYTHON
#
# Environment: TORCH_SPEC (default torch==2.13.0), WHEEL_TESTS (the test
# files, default below), SPLAT_WHEEL_STEPS (training steps, default 300),
# SPLAT_CUDA_ARCHS (the wheel's CUDA part where nvcc is found, as
# scripts/build_wheels.sh; its default, all seven architectures, builds in
# about 2 min on 2 cores).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if [ $# -ge 1 ]; then
  wheel="$(realpath "$1")"
else
  bash "$root/scripts/build_wheels.sh" "$work/dist"
  wheel="$(ls "$work"/dist/splat-*.whl)"
fi

"${2:-python}" -m venv "$work/venv"
venv="$work/venv/bin"
"$venv/python" -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
start=$(date +%s.%N)
"$venv/python" -m pip install -q "$wheel"
echo "ci_wheel: wheel installed (with its dependencies, torch excluded) in $(echo "$(date +%s.%N) - $start" | bc) s"
"$venv/python" -m pip install -q pytest hypothesis

# A PATH with every tool of this one but the compilers and build tools.
mkdir "$work/path"
IFS=: read -ra dirs <<<"$PATH"
for d in "${dirs[@]}"; do
  [ -d "$d" ] || continue
  for f in "$d"/*; do
    name="$(basename "$f")"
    case "$name" in
      gcc | g++ | cc | c++ | nvcc | ninja | gcc-* | g++-* | *-gcc | *-g++ | *-gcc-* | *-g++-* | clang* | cpp) continue ;;
    esac
    [ -x "$f" ] && [ ! -e "$work/path/$name" ] && ln -s "$f" "$work/path/$name"
  done
done

mkdir "$work/run"
cp -r "$root/tests" "$work/run/tests"
# some tests read configs/*.yaml beside tests/ (links into splat/configs in a checkout: copied as files)
cp -rL "$root/configs" "$work/run/configs"
cd "$work/run"
export PATH="$venv:$work/path" CC=/bin/false CXX=/bin/false
unset PYTHONPATH
for tool in gcc g++ cc c++ nvcc ninja; do
  if command -v "$tool" >/dev/null; then
    echo "ci_wheel: $tool is still on the PATH"
    exit 1
  fi
done
python - <<'PY'
import sysconfig
from pathlib import Path

import splat
from splat._native import kernels

site = Path(sysconfig.get_paths()["purelib"]).resolve()
assert Path(splat.__file__).resolve().is_relative_to(site), f"splat imported from {splat.__file__}, not {site}"
print("splat from", splat.__file__, "kernels", kernels().__file__)
# The CUDA part (if the wheel has it) is never opened by a CPU-only torch.
import torch
from splat.testing import random_scene

splat.rasterize(**random_scene(50, 16, 16), backend="cpu")
cuda_lib = Path(splat.__file__).parent / "libsplat_cuda.so"
maps = Path("/proc/self/maps").read_text()
print("CUDA library in the wheel:", cuda_lib.is_file(), "| torch CUDA:", torch.version.cuda)
if torch.version.cuda is None:
    assert "libsplat_cuda" not in maps, "a CPU-only torch opened libsplat_cuda.so"
PY
python -c "import time; t = time.perf_counter(); import splat; from splat._native import kernels; kernels(); \
print(f'ci_wheel: import splat + load kernels {time.perf_counter() - t:.2f} s')"
# The contract of the compiled part (every op, its errors, its gradients against
# the reference) and a short training; the whole suite runs against the source
# tree earlier in CI.
tests="${WHEEL_TESTS:-tests/test_native.py tests/test_cpu_kernels.py tests/test_projection.py tests/test_rasterize_3dgs.py tests/test_losses.py}"
# shellcheck disable=SC2086
python -m pytest -q -p no:cacheprovider $tests
# the wheel's console script, from outside the checkout, with the packaged config
command -v splat >/dev/null || { echo "ci_wheel: the wheel installed no splat command"; exit 1; }
splat train --data "$root/data/sample_scene" --out "$work/out" --config fast \
  --iterations "${SPLAT_WHEEL_STEPS:-300}" --no-progress
echo "ci_wheel: the wheel passed"
