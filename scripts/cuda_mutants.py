"""Mutation check of the CUDA emulation harness: seeds known CUDA bug classes
into copies of the kernels and shows that the emulated-CUDA tests catch each.

    python scripts/cuda_mutants.py [--out bench/results/cuda_emulation_mutants.json] [--only NAME ...]

For every mutant, a copy of the kernel files (``splat/kernels/cuda/``
binning.cu, forward.cu, backward.cu, project.cu and the primitives' batch
headers surfel_batch.cuh, gaussian_batch.cuh) gets exactly one edit (the script refuses an edit that does not
match exactly once, so a kernel change cannot silently turn a mutant into the
original), and the emulation tests (``tests/test_cuda_emulation.py`` for
surfels, ``tests/test_cuda_emulation_3dgs.py`` for 3D Gaussians,
``tests/test_cuda_emulation_project.py`` and ``tests/test_cuda_emulation_project_3dgs.py`` for
the fused projections) run against that copy
(``SPLAT_CUDAEMU_KERNELS``).  A mutant is CAUGHT when the tests fail, by a
mismatch against the CPU backend or by a cudaemu abort naming the .cu line.
Out-of-bounds reads whose value is never used change no output; those
mutants run in the ASan+UBSan build of the harness and are caught by the
sanitizer's report.
The unmutated kernels must pass first, or nothing here means anything.

Exit status 0 only if the baseline passes and every mutant is caught.
Cost on the 2-core machine: the first build ~1.5 min, then ~10 s a mutant
(only the rewritten .cu objects recompile, see tests/cuda_emulation/build.py);
the three sanitizer mutants need the ASan build (~4 min more the first time).
.ci/run runs it with --no-sanitizers; run it whole after any change to a .cu
file or to the harness.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from cuda_emulation.build import KERNEL_FILES, KERNELS as _KERNEL_ROOT  # noqa: E402
from report import portable  # noqa: E402

KERNELS = _KERNEL_ROOT / "cuda"
# The projection's tests first: quick, so that its mutants fail fast under -x.
TEST_FILES = (
    "tests/test_cuda_emulation_project.py",
    "tests/test_cuda_emulation_project_3dgs.py",
    "tests/test_cuda_emulation.py",
    "tests/test_cuda_emulation_3dgs.py",
)
LOAD_FWD = "    if (tid < P::kBatch && k_load < count) P::store(batch, tid, s, list[k_load]);  // coalesced list read\n"
LOAD_BWD = "    if (k_load >= batch_start) P::store(batch, tid, s, list[k_load]);\n"

# name: (file, bug class, exact text, replacement[, "asan": run under the sanitizers])
MUTANTS = {
    # Every plain __syncthreads() of forward.cu and backward.cu deleted, one at a time.
    "fwd_delete_barrier_after_load": ("forward.cu", "missing barrier", LOAD_FWD + "    __syncthreads();\n", LOAD_FWD),
    "bwd_delete_barrier_after_init": (
        "backward.cu",
        "missing barrier",
        "  if (tid == 0) block_end = 0;\n  __syncthreads();\n",
        "  if (tid == 0) block_end = 0;\n",
    ),
    "bwd_delete_barrier_after_max": (
        "backward.cu",
        "missing barrier",
        "  if (pixel_end > 0) atomicMax(&block_end, pixel_end);\n  __syncthreads();\n",
        "  if (pixel_end > 0) atomicMax(&block_end, pixel_end);\n",
    ),
    "bwd_delete_barrier_before_reload": (
        "backward.cu",
        "missing barrier",
        "    __syncthreads();  // every thread is done with the previous batch\n",
        "",
    ),
    "bwd_delete_barrier_after_load": ("backward.cu", "missing barrier", LOAD_BWD + "    __syncthreads();\n", LOAD_BWD),
    # The barrier-and-vote at the top of the forward batch loop, without its barrier.
    "fwd_vote_without_barrier": (
        "forward.cu",
        "missing barrier",
        "if (__syncthreads_count(done) == kBlockThreads) break;",
        "if (false) break;",
    ),
    "fwd_barrier_in_branch": (
        "forward.cu",
        "barrier inside a branch",
        LOAD_FWD + "    __syncthreads();\n",
        LOAD_FWD + "    if (!done) __syncthreads();\n",
    ),
    "bwd_barrier_in_branch": (
        "backward.cu",
        "barrier inside a branch",
        "    __syncthreads();  // every thread is done with the previous batch\n",
        "    if (pixel_end > 0) __syncthreads();\n",
    ),
    "bwd_uninitialised_shared": ("backward.cu", "uninitialised shared value", "  if (tid == 0) block_end = 0;\n", ""),
    "bwd_partial_warp_mask": (
        "backward.cu",
        "partial warp mask",
        "__shfl_xor_sync(kFullMask, send, Half)",
        "__shfl_xor_sync(0x0000ffffu, send, Half)",
    ),
    "bwd_vote_in_branch": (
        "backward.cu",
        "vote inside a branch",
        "if (__any_sync(kFullMask, touched)) {",
        "if (touched && __any_sync(kFullMask, touched)) {",
    ),
    # Out-of-bounds reads whose value is never used change no output, so
    # only AddressSanitizer sees them: these run in the ASan+UBSan build.
    "fwd_read_one_past_end": (
        "forward.cu",
        "read one past the end",
        "k_load < count) P::store",
        "k_load <= count) P::store",
        "asan",
    ),
    "bwd_read_one_before_start": (
        "backward.cu",
        "read one past the end",
        "if (k_load >= batch_start) P::store",
        "if (k_load >= batch_start - 1) P::store",
        "asan",
    ),
    # The key function itself is core.h's depth_sort_key, shared with the CPU;
    # this breaks how binning.cu applies it (negative depths sort by magnitude).
    "bin_depth_key_ignores_sign": (
        "binning.cu",
        "broken depth key",
        "keys[i] = depth_sort_key(depth[i]);",
        "keys[i] = depth_sort_key(fabs(depth[i]));",
    ),
    # 3D Gaussians: the shared kernels' Gaussian-only paths.
    "fwd_every_thread_loads": (
        "forward.cu",
        "write past a shared array (float64 Gaussian batch of 128)",
        "if (tid < P::kBatch && k_load < count)",
        "if (k_load < count)",
    ),
    "bwd_surfel_record_size": (
        "backward.cu",
        "gradient record cut to the surfels' size",
        "if (lane < static_cast<unsigned>(P::kRecord))",
        "if (lane < static_cast<unsigned>(kGradSize))",
    ),
    "gauss_batch_too_large": (
        "gaussian_batch.cuh",
        "over the static shared-memory limit",
        "return sizeof(T) == 8 ? kBlockThreads / 2 : kBlockThreads;",
        "return kBlockThreads;",
    ),
    "gauss_store_drops_last_param": (
        "gaussian_batch.cuh",
        "uninitialised shared value",
        "for (int k = 0; k < kGaussParams; ++k) b.params[k][slot] = __ldg(",
        "for (int k = 0; k < kGaussParams - 1; ++k) b.params[k][slot] = __ldg(",
    ),
    "gauss_rect_off_by_one": (
        "gaussian_batch.cuh",
        "off-by-one in the pixel rectangle",
        "px < b.rect[2][slot] && py < b.rect[3][slot]",
        "px <= b.rect[2][slot] && py < b.rect[3][slot]",
    ),
    # The fused surfel projection (project.cu).
    "proj_count_stored_not_added": (
        "project.cu",
        "a plain store where an atomic add is needed",
        "if (bad) atomicAdd(over_limit, static_cast<unsigned long long>(bad));",
        "if (bad) *over_limit = static_cast<unsigned long long>(bad);",
    ),
    "proj_camera_partly_loaded": (
        "project.cu",
        "uninitialised value (a loop bound one short)",
        "for (int k = 0; k < 9; ++k) in.K[k] = K[k];",
        "for (int k = 0; k < 8; ++k) in.K[k] = K[k];",
    ),
    "proj_last_thread_writes_past_end": (
        "project.cu",
        "write one past the end",
        # the forward kernel's bounds check (the text up to its first use of `bad`)
        "if (i >= args.n) return; ProjectInputs<T> in = args; T campos[3]; "
        "load_camera(in, viewmat, K, campos); const int64_t bad",
        "if (i > args.n) return;\n  ProjectInputs<T> in = args;\n  T campos[3];\n  "
        "load_camera(in, viewmat, K, campos);\n  const int64_t bad",
        "asan",
    ),
    # The fused projection of 3D Gaussians (project.cu).
    "gauss_proj_ids_rank_off_by_one": (
        "project.cu",
        "off-by-one in a compaction (inclusive scan used as exclusive)",
        "ids[rank[i] - 1] = i;",
        "ids[rank[i]] = i;",
    ),
    "gauss_proj_count_stored_not_added": (
        "project.cu",
        "a plain store where an atomic add is needed",
        "if (!ok) atomicAdd(bad, 1ull);",
        "if (!ok) *bad = 1ull;",
    ),
    "gauss_proj_camera_sum_skips_last": (
        "project.cu",
        "off-by-one in a reduction (each block's last share dropped)",
        "for (int64_t j = first; j < end; ++j) sum +=",
        "for (int64_t j = first; j < end - 1; ++j) sum +=",
    ),
}


def mutant_pattern(old: str) -> re.Pattern:
    """``old`` as a regex that matches it whatever the whitespace between its
    tokens, so that a formatter's line breaks (scripts/lint.sh) do not stop a
    mutant applying."""
    return re.compile(r"\s*".join(re.escape(tok) for tok in re.findall(r"\w+|\S", old)))


def apply_mutant(text: str, fname: str, old: str, new: str) -> str:
    """``text`` with the one occurrence of ``old`` (modulo whitespace) replaced by ``new``."""
    found = list(mutant_pattern(old).finditer(text))
    if len(found) != 1:
        raise SystemExit(f"error: mutant text found {len(found)} times in {fname} (expected once): {old!r}")
    m = found[0]
    return text[: m.start()] + new.strip() + text[m.end() :]


def make_copy(folder: Path, edit=None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in KERNEL_FILES:
        shutil.copy(KERNELS / name, folder / name)
    if edit is not None:
        fname, _, old, new = edit[:4]
        (folder / fname).write_text(apply_mutant((folder / fname).read_text(), fname, old, new))


def sanitizer_env() -> dict:
    """The environment of an ASan+UBSan run (as scripts/cuda_emulation_asan.sh)."""
    libs = [
        subprocess.run(["gcc", f"-print-file-name={lib}"], capture_output=True, text=True).stdout.strip()
        for lib in ("libasan.so", "libubsan.so")
    ]
    return dict(
        SPLAT_CUDAEMU_SANITIZE="1",
        LD_PRELOAD=":".join(libs),
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
    )


def run_tests(kernel_dir: Path, timeout: int, sanitize: bool = False):
    env = dict(
        os.environ, SPLAT_CUDAEMU_KERNELS=str(kernel_dir), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1")
    )
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *TEST_FILES]
    if sanitize:
        env.update(sanitizer_env())
        cmd.insert(4, "-s")  # the sanitizer aborts the process: its report must not sit in pytest's capture
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:  # a deadlock the harness failed to report is still a catch, but say so
        rc, out = -1, f"TIMEOUT after {timeout} s\n" + (e.stdout or b"").decode(errors="replace")
    return rc, out, time.perf_counter() - t0


def evidence(out: str) -> str:
    """The first line that says why the run failed (a cudaemu abort or an assertion)."""
    for pattern in (
        r"ERROR: AddressSanitizer: [\w-]+[^\n]*",
        r"runtime error: [^\n]*",
        r"cudaemu: [^\n]*",
        r"Fatal Python error: [^\n]*",
        r"^E\s+\w*(Error|Exception)\b[^\n]*",
        r"^E\s+[^\n]+",
        r"FAILED[^\n]*",
        r"TIMEOUT[^\n]*",
    ):
        m = re.search(pattern, out, re.M)
        if m:
            return m.group(0).strip()[:300]
    return out.strip().splitlines()[-1][:300] if out.strip() else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the JSON result here too")
    ap.add_argument("--only", nargs="*", help="run only these mutants")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per test run")
    ap.add_argument(
        "--no-sanitizers",
        action="store_true",
        help="leave out the mutants that need the ASan+UBSan build (as .ci/run does, for time)",
    )
    args = ap.parse_args()
    names = args.only or [n for n in MUTANTS if not (args.no_sanitizers and MUTANTS[n][4:] == ("asan",))]
    unknown = [n for n in names if n not in MUTANTS]
    if unknown:
        raise SystemExit(f"error: unknown mutant(s): {', '.join(unknown)}")

    work = Path(tempfile.mkdtemp(prefix="splat_mutants_"))
    results = {}
    try:
        base = work / "baseline"
        make_copy(base)
        rc, out, secs = run_tests(base, args.timeout)
        results["baseline"] = {"passed": rc == 0, "seconds": round(secs, 1)}
        print(f"{'PASS' if rc == 0 else 'FAIL'}  baseline ({secs:.0f} s)", flush=True)
        if rc != 0:
            print(out[-3000:])
        for name in names:
            folder = work / name
            make_copy(folder, MUTANTS[name])
            sanitize = MUTANTS[name][4:] == ("asan",)
            rc, out, secs = run_tests(folder, args.timeout, sanitize)
            # A timeout is a hang the harness failed to report: not counted as caught.
            caught = rc not in (0, -1)
            why = evidence(out) if caught else ""
            results[name] = {
                "file": MUTANTS[name][0],
                "bug_class": MUTANTS[name][1],
                "sanitizers": sanitize,
                "caught": caught,
                "evidence": why,
                "seconds": round(secs, 1),
            }
            print(f"{'CAUGHT' if caught else 'MISSED'}  {name} ({secs:.0f} s)  {why}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    mutants = [v for k, v in results.items() if k != "baseline"]
    summary = {
        "baseline_passed": results["baseline"]["passed"],
        "caught": sum(v["caught"] for v in mutants),
        "total": len(mutants),
        "results": results,
    }
    text = json.dumps(portable(summary), indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    ok = summary["baseline_passed"] and summary["caught"] == summary["total"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
