"""One wheel, several torch releases and CPython versions: for each
(Python, torch) pair a fresh venv gets that torch, then the wheel (timed,
torch excluded), then runs the contract tests against the installed package
from outside the checkout and prints a SHA-256 of every output and gradient of
a fixed render (surfels and 3D Gaussians, float32 and float64, CPU).  The
hashes must agree across pairs (bitwise equal outputs).  Prints JSON (and
writes it with --out).  Not a test, not CI: it downloads torch builds.

    python bench/wheel_versions.py --wheel dist/splat-*.whl \\
        --pairs python3.11:torch==2.13.0 python3.11:torch==2.14.1 python3.12:torch==2.13.0 \\
        --out bench/results/wheel_versions.json

Also times ``import splat`` plus loading the kernels in each venv.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTRACT_TESTS = ["tests/test_cpu_kernels.py", "tests/test_projection.py", "tests/test_rasterize_3dgs.py"]

PROBE = r"""
import hashlib, json, sys, time
t = time.perf_counter()
import torch, splat, splat.losses
from splat._native import kernels
kernels()
import_s = time.perf_counter() - t
from splat.testing import surface_scene
digest = hashlib.sha256()
for dtype in (torch.float32, torch.float64):
    for prim in ("2dgs", "3dgs"):
        s = surface_scene(2000, 64, 48, dtype=dtype, seed=0)
        if prim == "3dgs":
            s["scales"] = torch.cat([s["scales"], 0.3 * s["scales"].amin(-1, keepdim=True)], -1)
        leaves = {k: s[k].clone().requires_grad_(True) for k in ("means", "quats", "scales", "opacities", "colors")}
        fn = splat.rasterize if prim == "2dgs" else splat.rasterize_3dgs
        out = fn(**{**s, **leaves}, backend="cpu")
        loss = out.rgb.square().sum() + out.depth.sum() + out.normal.sum() + out.distortion.sum()
        loss = loss + out.median_depth.sum() + (1 - splat.losses.ssim(out.rgb, torch.zeros_like(out.rgb)))
        loss.backward()
        for t in (out.rgb, out.alpha, out.depth, out.median_depth, out.normal, out.distortion, out.radii,
                  *(v.grad for v in leaves.values())):
            digest.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
print("PROBE" + json.dumps({"torch": torch.__version__, "python": sys.version.split()[0],
                            "sha256": digest.hexdigest(), "import_s": import_s}))
"""


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def one_pair(python: str, torch_spec: str, wheel: Path, work: Path) -> dict:
    venv = work / "venv"
    run([python, "-m", "venv", str(venv)])
    py = str(venv / "bin" / "python")
    t = time.perf_counter()
    run([py, "-m", "pip", "install", "-q", torch_spec])
    torch_s = time.perf_counter() - t
    t = time.perf_counter()
    run([py, "-m", "pip", "install", "-q", str(wheel)])
    wheel_s = time.perf_counter() - t
    run([py, "-m", "pip", "install", "-q", "pytest", "hypothesis"])
    shutil.copytree(ROOT / "tests", work / "tests")
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(Path.home())}
    tests = subprocess.run(
        [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CONTRACT_TESTS],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    probe = run([py, "-c", PROBE], cwd=work, env=env).stdout
    result = json.loads(probe.split("PROBE", 1)[1])
    result.update(
        torch_spec=torch_spec,
        torch_install_s=round(torch_s, 1),
        wheel_install_s=round(wheel_s, 1),
        contract_tests=tests.stdout.strip().splitlines()[-1] if tests.stdout.strip() else tests.stderr[-500:],
        contract_tests_passed=tests.returncode == 0,
    )
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", required=True)
    ap.add_argument("--pairs", nargs="+", required=True, help="PYTHON:TORCH_SPEC, e.g. python3.12:torch==2.13.0")
    ap.add_argument("--out")
    args = ap.parse_args()
    wheel = Path(args.wheel).resolve()
    rows = []
    for pair in args.pairs:
        python, spec = pair.split(":", 1)
        with tempfile.TemporaryDirectory() as work:
            try:
                rows.append({"pair": f"{Path(python).name}:{spec}", **one_pair(python, spec, wheel, Path(work))})
            except subprocess.CalledProcessError as error:
                rows.append({"pair": f"{Path(python).name}:{spec}", "error": (error.stderr or "")[-800:]})
        print(json.dumps(rows[-1]), flush=True)
    hashes = {r["sha256"] for r in rows if "sha256" in r}
    result = {
        "what": "one wheel under several (CPython, torch) pairs: contract tests and a SHA-256 of every output",
        "command": "python bench/wheel_versions.py --wheel WHEEL --pairs " + " ".join(r["pair"] for r in rows),
        "wheel": wheel.name,
        "rows": rows,
        "bitwise_equal_across_pairs": len(hashes) == 1,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if len(hashes) == 1 and all(r.get("contract_tests_passed") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
