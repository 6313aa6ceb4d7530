"""The GPU campaign of issue 25, as stages that write JSON under --out.
Run it through scripts/gpu_campaign.sh (which also stages the wheels, the
peers and the scenes); docs/testing.md says how a session with a GPU runs it.

    python bench/gpu_campaign.py --out DIR --call 1        # setup parity sanitize (the builds below start aside)
    python bench/gpu_campaign.py --out DIR --call 2        # setup peers speed fastmath
    python bench/gpu_campaign.py --out DIR --call 3        # setup train profile
    python bench/gpu_campaign.py --out DIR --stages speed  # any stages, in the order given
    python bench/gpu_campaign.py --out DIR --dry-run --stages all   # every stage on the CPU, tiny sizes

Stages (each writes DIR/STAGE.json; setup and the summary carry the call's
number, -callN, so that the three calls' files never share a name):
  setup     install the carried wheels (.gpu_campaign/wheels, peers) into
            .gpu_campaign/site, build splat with its CUDA kernels for the
            device's architecture, record the machine, the tools and the
            kernels' registers (cuobjdump); start the peers' build and the
            fast build (fastmath) in the background
  parity    tests/test_cuda.py, then the same file against splat's wheel
            (installed with the device's torch, from a folder outside the
            tree: the CUDA kernels through libsplat_cuda.so, not the
            extension built in setup), then the whole test suite
  sanitize  compute-sanitizer memcheck and racecheck over tests/test_cuda.py
            and a rasterizer workload (forward + backward of several scenes)
  peers     build gsplat (its JIT build) and diff-surfel-rasterization
  speed     bench/rasterize_peers.py: splat, gsplat packed / dense,
            diff-surfel at 1080p, 0.5M / 1M / 3M surfels
  fastmath  the --fmad=false question: splat's CUDA extension built again
            with nvcc's fast flags (SPLAT_CUDA_EXACT=0) into
            .gpu_campaign/build_fast; splat.rasterize and rasterize_3dgs at
            1M primitives, 1080p, forward and backward, exact build against
            fast build (one process each), and each build's float32 error
            against the CPU kernels on a small scene, with a tolerance
  train     train.py with configs/default.yaml on still_life and dtu_scan24
            (.gpu_campaign/scenes, else ../shared/scenes), and dtu_scan24 at
            400x300 (the CPU run's size) when time is left
  profile   torch profiler (time per kernel) and Nsight Compute (what bounds
            each of splat's kernels) at 1M surfels, 1080p

The calls follow the issue's priorities, so that a short budget still
settles the first ones: call 1 parity and the sanitizers, call 2 the speed
against the peers and the --fmad question, call 3 training and the profile.
Every call has its own time budget (--budget-s, default CALL_BUDGET_S: 280,
200 and 270 s): a session has 15 device minutes in all, the machine's start
(one to two minutes) and the gaps between calls included, and the three
budgets plus START_S fit DEVICE_BUDGET_S.  Each step gets what is left
(later stages keep STAGE_RESERVE_S), and a step that runs out is recorded as
timed out rather than losing the call's other results.

--dry-run runs every step on the CPU with tiny sizes, so that the campaign
cannot rot while no GPU is lent (tests/test_gpu_campaign.py): no build, the
peers and the sanitizers skipped with the reason, the test suite reduced to
tests/test_cuda.py, training data/sample_scene for a few steps, fastmath
timing the CPU kernels twice at a tiny size against the plain-PyTorch
reference.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from report import commit, machine, portable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(1, str(ROOT))  # this checkout's splat (the GPU machine gets a bare copy of the tree)
CAMPAIGN = ROOT / ".gpu_campaign"  # ignored by git; prepared by scripts/gpu_campaign.sh prepare
WHEELS, PEERS, SCENES = CAMPAIGN / "wheels", CAMPAIGN / "peers", CAMPAIGN / "scenes"
# splat's own wheel (scripts/build_wheels.sh at prepare), for parity alone: its own folder, carried by call 1
# only (inside wheels/ it pushed call 3, with the scenes, over what a call may carry).
SPLAT_WHEEL = CAMPAIGN / "splat_wheel"
BUILD, SITE = CAMPAIGN / "build", CAMPAIGN / "site"
# The stages' scratch files (JUnit reports, workload results, training runs).
SCRATCH = BUILD / "scratch"
DSR_BUILD = BUILD / "diff-surfel-rasterization"
# splat's CUDA extension built with nvcc's fast flags (SPLAT_CUDA_EXACT=0): build_fast/splat/_C*.so.
FAST_BUILD = CAMPAIGN / "build_fast"
STAGES = ("setup", "parity", "sanitize", "peers", "speed", "fastmath", "train", "profile")
# In the order of priority (parity and sanitizers; speed against the
# peers; the --fmad question; training; profile).  The peers' build and the
# fast build (minutes) run in the background from call 1's setup on, beside
# the tests and the sanitizers, which leave cores free; call 2 finds them done.
CALLS = {
    1: ("setup", "parity", "sanitize"),
    2: ("setup", "peers", "speed", "fastmath"),
    3: ("setup", "train", "profile"),
}
# Each call's default --budget-s.  A session has DEVICE_BUDGET_S of device
# time in all; START_S covers the machine's start (one to two minutes), the
# transfers and the gaps between three back-to-back calls.
# From the runs on H200s: setup 62-95 s cold, 17-25 s warm; call 2 on a warm
# machine needs about 25 s (speed 6 s, fastmath 10 s) once call 1's background
# builds are done; call 1 needs its cold setup, parity and about 125 s of
# sanitizers; training still_life and dtu_scan24 takes about 230 s.
CALL_BUDGET_S = {1: 340.0, 2: 140.0, 3: 270.0}
DEVICE_BUDGET_S, START_S = 900.0, 150.0
RESERVE_S = 25  # kept back from the budget for the logs archive and the summary
# Seconds kept for a stage while earlier stages of the same call run, so that
# a slow test suite cannot eat the sanitizers' time, nor the speed stage the
# fastmath stage's, nor training the profile's.
# (compute-sanitizer tool, what it watches), in order: the workload under every tool, then the tests.
SANITIZER_RUNS = (
    ("memcheck", "workload"),
    ("racecheck", "workload"),
    ("synccheck", "workload"),
    ("memcheck", "test_cuda"),
    ("racecheck", "test_cuda"),
)
STAGE_RESERVE_S = {"sanitize": 150, "speed": 45, "fastmath": 45, "profile": 60}
# fastmath: the rasterizers it times and checks, and the outputs in their loss.
FASTMATH_RASTERIZERS = ("surfels", "3dgs")
FASTMATH_OUTPUTS = ("rgb", "alpha", "depth", "median_depth", "normal", "distortion")
# splat's kernels (splat/kernels/cuda/*.cu), for Nsight Compute's filter.
KERNELS = r"regex:(depth_keys|count_tiles|duplicate|tile_offsets|forward|backward)_kernel"
SCENE_RUNS = (  # (name, scene folder, overrides): the default config as it is, and the CPU run's dtu size
    ("still_life", "still_life", ()),
    ("dtu_scan24", "dtu_scan24", ()),
    ("dtu_scan24_400x300", "dtu_scan24", ("data.downscale=2",)),
)
CPU_REFERENCE = {  # the CPU runs these compare with: (results file, key path)
    "still_life": ("bench/results/training_cpu_still_life.json", ("runs", "default_colmap")),
    "dtu_scan24_400x300": ("bench/results/training_real_scenes.json", ("runs", "dtu_scan24_default_400x300")),
}


class Campaign:
    def __init__(self, out: Path, dry_run: bool, budget_s: float, call: int | None, scenes: Path | None, stages=()):
        self.out, self.dry_run, self.call, self.stages = out, dry_run, call, tuple(stages)
        self.deadline = time.monotonic() + budget_s
        self.reserved_after = 0.0
        self.logs = out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        # The dry run writes nothing into the checkout (CI runs it).
        self.work = Path(tempfile.mkdtemp(prefix="gpu_campaign_")) if dry_run else SCRATCH
        self.work.mkdir(parents=True, exist_ok=True)
        self.scenes = scenes or (SCENES if SCENES.is_dir() else ROOT.parent / "shared" / "scenes")
        import torch

        self.gpu = torch.cuda.is_available() and not dry_run
        self.device = "cuda" if self.gpu else "cpu"

    # ------------------------------------------------------------------ helpers
    def remaining(self) -> float:
        """Seconds this stage may still use: the call's budget less what later stages keep."""
        return self.deadline - RESERVE_S - self.reserved_after - time.monotonic()

    def env(self, **extra) -> dict:
        return child_env(self.work, self.gpu, self.dry_run, **extra)

    def run(self, cmd, log: str, cap_s: float, cwd=ROOT, env=None) -> dict:
        """Runs `cmd` (its own process group, killed whole at the time limit),
        output to logs/LOG.  Returns the command, exit code, seconds and tail."""
        timeout = max(1.0, min(cap_s, self.remaining()))
        start = time.monotonic()
        path = self.logs / log
        with open(path, "w") as f:
            f.write(f"$ {shlex.join(map(str, cmd))}\n")
            f.flush()
            proc = subprocess.Popen(
                [str(c) for c in cmd],
                cwd=cwd,
                env=env or self.env(),
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                rc, timed_out = proc.wait(timeout=timeout), False
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the group: pytest's and the sanitizer's children too
                rc, timed_out = proc.wait(), True
        text = path.read_text(errors="replace")
        return dict(
            command=shlex.join(map(str, cmd)),
            rc=rc,
            timed_out=timed_out,
            limit_s=round(timeout),
            seconds=round(time.monotonic() - start, 1),
            log=f"logs/{log}",
            tail=text.splitlines()[-25:],
        )

    def write(self, name: str, data: dict) -> Path:
        path = self.out / f"{name}.json"
        path.write_text(json.dumps(portable(data), indent=2, default=str) + "\n")
        return path

    # ------------------------------------------------------------------ stages
    def setup(self) -> dict:
        import torch

        # The device's copy of the tree may have no .git: prepare wrote the commit it staged from.
        staged = WHEELS / "COMMIT"
        r = dict(
            dry_run=self.dry_run,
            python=sys.version.split()[0],
            # The staged commit first: the device copy's .git can be the session's starting checkout.
            commit=(staged.read_text().strip() if staged.is_file() else None) or commit(str(ROOT)),
            torch=torch.__version__,
            torch_cuda=torch.version.cuda,
            cpus=os.cpu_count(),
            tools={t: tool(t) for t in ("nvcc", "nvidia-smi", "compute-sanitizer", "ncu", "cuobjdump")},
        )
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            r["gpu"] = dict(
                name=p.name,
                capability=f"{p.major}.{p.minor}",
                multiprocessors=p.multi_processor_count,
                memory_gib=round(p.total_memory / 2**30, 1),
                l2_mib=round(getattr(p, "L2_cache_size", 0) / 2**20, 1),
            )
        if r["tools"]["nvidia-smi"]:
            q = "name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit"
            smi = subprocess.run(
                [r["tools"]["nvidia-smi"], f"--query-gpu={q}", "--format=csv"], capture_output=True, text=True
            )
            r["nvidia_smi"] = smi.stdout.strip().splitlines()
        if r["tools"]["nvcc"]:
            r["nvcc_version"] = (
                subprocess.run([r["tools"]["nvcc"], "--version"], capture_output=True, text=True)
                .stdout.strip()
                .splitlines()[-1:]
            )
        wheels = sorted(WHEELS.glob("*.whl")) + sorted(PEERS.glob("*.whl"))
        r["wheels"] = [w.name for w in wheels]
        if self.dry_run:
            # The same install command into a throw-away folder, when wheels are staged here.
            target = self.work / "site"
            r["install"] = self.pip_install(wheels, target) if wheels else "skipped: no wheels staged"
            r["build"] = "skipped: dry run (the CUDA build needs the device's torch and GPU)"
            r["build_command"] = shlex.join(build_command())
        else:
            if wheels:
                r["install"] = self.pip_install(wheels, SITE)
            if self.gpu and (self.call in (1, 2) or {"peers", "speed"} & set(self.stages)):
                r["peers_background"] = self.start_peers_build()  # beside splat's build: 16 cores
            if self.gpu and (self.call in (1, 2) or "fastmath" in self.stages):
                fast_done = bool(read_json(BUILD / "fast_status.json").get("ok"))
                r["fast_background"] = self.start_build("fast", fast_done, max(1, (os.cpu_count() or 4) // 4))
            r["build"] = self.run(build_command(), "setup_build.log", 420, env=self.env(SPLAT_BUILD_CUDA="1"))
            if r["tools"]["cuobjdump"]:
                r["kernel_resources"] = kernel_resources(r["tools"]["cuobjdump"])
        check = (
            "import json, torch, splat; from splat._backend import has_extension, has_cuda_kernels; "
            "print(json.dumps(dict(extension=has_extension(), cuda_kernels=has_cuda_kernels(), "
            "cuda_device=torch.cuda.is_available(), splat=splat.__file__)))"
        )
        done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=self.env(), cwd=ROOT)
        r["check"] = json.loads(done.stdout.splitlines()[-1]) if done.returncode == 0 else done.stderr[-1500:]
        ok = (
            isinstance(r["check"], dict)
            and r["check"]["extension"]
            and (self.dry_run or (r["check"]["cuda_kernels"] and r["check"]["cuda_device"]))
        )
        r["status"] = "ok" if ok else "failed"
        if not ok:
            r["reason"] = (
                f"splat's extension does not load: {r['check'][-300:]}"
                if isinstance(r["check"], str)
                else "splat's CUDA kernels or the GPU are not seen (check, build)"
            )
        return r

    def pip_install(self, wheels, target: Path, log: str = "setup_pip.log") -> dict:
        # --no-deps: the device has every dependency but these; --no-index: it has no network.
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--upgrade",
            "--target",
            target,
            *wheels,
        ]
        return self.run(cmd, log, 120)

    def parity(self) -> dict:
        junit = self.work / "junit"
        junit.mkdir(exist_ok=True)
        base = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"]
        r = {"dry_run": self.dry_run}
        # The dry run's pytest needs none of the installed plugins (hypothesis, dash, ...: seconds to load).
        env = self.env(PYTEST_DISABLE_PLUGIN_AUTOLOAD="1") if self.dry_run else self.env()
        # tests/test_cuda.py alone first: the CUDA-against-CPU answer even if the other GPU tests run out of time.
        r["test_cuda"] = self.run(
            base + ["tests/test_cuda.py", f"--junitxml={junit / 'cuda.xml'}"], "parity_test_cuda.log", 240, env=env
        )
        r["test_cuda"].update(junit_summary(junit / "cuda.xml"))
        r["wheel"] = self.wheel_tests(base, junit)
        # The suite's modules that run on CUDA when a GPU is there (the whole suite never fitted a call);
        # the dry run stands in the same file (well under a minute in CI).
        suite = ["tests/test_cuda.py"] if self.dry_run else [*gpu_test_modules(), "--continue-on-collection-errors"]
        r["suite"] = self.run(base + suite + [f"--junitxml={junit / 'suite.xml'}"], "parity_suite.log", 1e9, env=env)
        r["suite"].update(junit_summary(junit / "suite.xml"))
        gpu_skips = [s for s in r["test_cuda"].get("skip_reasons", {}) if "needs a GPU" in s]
        bad = [
            k
            for k in ("test_cuda", "wheel", "suite")
            if r[k].get("status") != "skipped"
            and (
                r[k].get("status") == "failed"
                or r[k]["timed_out"]
                or r[k].get("failures")
                or r[k].get("errors_other_than_missing_modules")
                or "junit" in r[k]
            )
        ]
        if self.gpu and gpu_skips:
            r["gpu_tests_skipped"] = gpu_skips
            bad.append("gpu_tests_skipped")
        r["status"] = "failed" if bad else "ok"
        r["failed_parts"] = bad
        if bad:
            r["reason"] = f"failed: {', '.join(bad)} (failures, errors, timeouts or skipped GPU tests)"
        return r

    def wheel_tests(self, base: list, junit: Path) -> dict:
        """tests/test_cuda.py against splat's wheel (SPLAT_WHEEL), installed
        beside the device's torch and imported from a folder outside the
        tree, so that the CUDA kernels run through the wheel's
        libsplat_cuda.so (the issue on wheels asks for this run)."""
        wheels = sorted(SPLAT_WHEEL.glob("splat-*.whl"))
        if not wheels:
            return {
                "status": "skipped",
                "reason": f"no wheel staged in {SPLAT_WHEEL} (gpu_campaign.sh prepare builds it)",
            }
        site, run_dir = self.work / "wheel_site", self.work / "wheel_run"
        shutil.rmtree(site, ignore_errors=True)
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.copytree(ROOT / "tests", run_dir / "tests")
        shutil.copytree(ROOT / "configs", run_dir / "configs", symlinks=False)
        r = {"wheel": wheels[-1].name, "install": self.pip_install([wheels[-1]], site, "parity_wheel_pip.log")}
        if r["install"]["rc"] != 0:
            return {**r, "status": "failed", "reason": "the wheel did not install"}
        # The wheel's splat first; SITE keeps the staged runtime packages (plyfile); never the tree.
        env = self.env(PYTHONPATH=os.pathsep.join(str(p) for p in (site, SITE) if p.is_dir()))
        probe = (
            "import splat, splat._native_cuda as c; k = c.cuda_kernels(); "
            "print('splat', splat.__file__); print('cuda kernels', getattr(k, '__file__', type(k).__name__))"
        )
        r["probe"] = self.run([sys.executable, "-c", probe], "parity_wheel_probe.log", 60, cwd=run_dir, env=env)
        r.update(
            self.run(
                base + ["tests/test_cuda.py", f"--junitxml={junit / 'wheel.xml'}"],
                "parity_wheel.log",
                120,
                cwd=run_dir,
                env=env,
            )
        )
        r.update(junit_summary(junit / "wheel.xml"))
        tail = "\n".join(r["probe"]["tail"])
        from_wheel = str(site) in tail and (not self.gpu or "libsplat_cuda" in tail)
        skipped_gpu = [s for s in r.get("skip_reasons", {}) if "needs a GPU" in s]
        r["status"] = "failed" if r["probe"]["rc"] or not from_wheel or (self.gpu and skipped_gpu) else "ran"
        if r["status"] == "failed":
            r["reason"] = "splat or its CUDA kernels did not come from the wheel, or the GPU tests were skipped"
        return r

    def sanitize(self) -> dict:
        san = tool("compute-sanitizer")
        r = {"dry_run": self.dry_run}
        if self.dry_run or not self.gpu or not san:
            r["sanitizer"] = (
                "skipped: dry run (no GPU)"
                if self.dry_run
                else "skipped: no CUDA device"
                if not self.gpu
                else "skipped: compute-sanitizer not found"
            )
        workloads = {
            "test_cuda": [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cuda.py"],
            "workload": [sys.executable, str(Path(__file__)), "--workload", "sanitize"]
            + (["--dry-run"] if self.dry_run else []),
        }
        # Without torch's caching allocator every tensor is its own cudaMalloc,
        # so memcheck sees an access past a tensor's end (inside a cached block it cannot).
        env = self.env(PYTORCH_NO_CUDA_MEMORY_CACHING="1")
        failed = []
        # The workload (every kernel, surfels and 3D Gaussians, small scenes) under each tool first:
        # on an H200 racecheck needed more than 85 s for tests/test_cuda.py, which comes last.
        for tool_name, name in SANITIZER_RUNS:
            cmd = workloads[name]
            key = f"{tool_name}_{name}"
            if "sanitizer" in r:  # the workload without the sanitizer, so that it stays exercised
                if tool_name != "memcheck" or name == "test_cuda":  # parity runs test_cuda.py already
                    continue
                r[name] = res = self.run(cmd, f"sanitize_{name}.log", 120, env=env)
                if res["rc"] != 0:
                    failed.append(name)
                continue
            # API errors off in memcheck: torch's own probing calls (expected failures) would count as
            # reports; splat checks every CUDA call's status itself, and the kernels' accesses are what is checked.
            api = (
                ["--report-api-errors", "no"]
                if tool_name == "memcheck"
                and "--report-api-errors" in subprocess.run([san, "--help"], capture_output=True, text=True).stdout
                else []
            )
            res = self.run(
                [san, "--tool", tool_name, "--print-limit", "50", *api] + cmd, f"sanitize_{key}.log", 100, env=env
            )
            res.update(sanitizer_summary(self.logs / f"sanitize_{key}.log", tool_name))
            r[key] = res
            if res["rc"] != 0 or res["timed_out"] or res.get("reported") != 0:
                failed.append(key)
        r["failed_parts"] = failed
        r["status"] = "failed" if failed else ("skipped" if "sanitizer" in r else "ok")
        if r["status"] == "skipped":
            r["reason"] = r["sanitizer"]
        elif failed:
            r["reason"] = f"reports, crashes or timeouts in: {', '.join(failed)}"
        return r

    def start_peers_build(self) -> dict:
        if not list(PEERS.glob("*")):
            return {"started": False, "reason": "nothing staged in .gpu_campaign/peers"}
        status = read_json(BUILD / "peers_status.json")
        done = all(status.get(k, {}).get("ok") for k in ("gsplat", "diff_surfel"))
        # Half the cores: the tests and sanitizers running beside it keep theirs.
        return self.start_build("peers", done, max(1, (os.cpu_count() or 2) // 2))

    def start_build(self, name: str, done: bool, jobs: int) -> dict:
        """Starts `gpu_campaign.py --build-NAME` (peers or fast) in its own
        session, at a lower priority with `jobs` compile jobs: it goes on after
        call 1 returns, and call 2 finds it done if the machine is still warm."""
        if done:
            return {"started": False, "reason": "built already (a warm machine)"}
        pid_file = BUILD / f"{name}_build.pid"
        if pid_file.is_file() and alive(int(pid_file.read_text())):
            return {"started": False, "reason": "a build started by an earlier call is still running"}
        BUILD.mkdir(parents=True, exist_ok=True)
        env = self.env(MAX_JOBS=str(jobs))
        with open(BUILD / f"{name}_build.log", "w") as log:  # the child keeps its own copy of the descriptor
            proc = subprocess.Popen(
                ["nice", "-n", "10", sys.executable, str(Path(__file__)), f"--build-{name}"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        pid_file.write_text(str(proc.pid))
        return {"started": True, "pid": proc.pid, "log": str(BUILD / f"{name}_build.log")}

    def wait_build(self, name: str, r: dict) -> bool:
        """Waits (within this stage's time) for an earlier call's background
        build NAME; notes it in `r`.  True if it is still running."""
        pid_file = BUILD / f"{name}_build.pid"
        if not pid_file.is_file():
            return False
        pid = int(pid_file.read_text())
        while alive(pid) and self.remaining() > 0:
            time.sleep(2)
        running = alive(pid)
        r["background_build"] = (
            "still running at the time limit (it goes on: run this call again)" if running else "finished"
        )
        if (BUILD / f"{name}_build.log").is_file():
            shutil.copy(BUILD / f"{name}_build.log", self.logs / f"{name}_build_background.log")
        return running

    def peers(self) -> dict:
        r = {"dry_run": self.dry_run, "staged": sorted(p.name for p in PEERS.glob("*"))}
        dsr = PEERS / "diff-surfel-rasterization" / "COMMIT"
        r["diff_surfel_commit"] = dsr.read_text().strip() if dsr.is_file() else None
        if self.dry_run or not self.gpu:
            r["status"], r["reason"] = (
                "skipped",
                ("dry run: the peers are CUDA extensions, built on the device" if self.dry_run else "no CUDA device"),
            )
            return r
        running = self.wait_build("peers", r)  # call 1's background build on this (still warm) machine
        status = read_json(BUILD / "peers_status.json")
        # A second build beside a running one would fight over its folders.
        if not running and not (status.get("gsplat", {}).get("ok") and status.get("diff_surfel", {}).get("ok")):
            r["foreground_build"] = self.run(
                [sys.executable, str(Path(__file__)), "--build-peers"], "peers_build.log", 1e9
            )
            status = read_json(BUILD / "peers_status.json")
        r["build"] = status
        broken = [k for k in ("gsplat", "diff_surfel") if not status.get(k, {}).get("ok")]
        r["status"] = "failed" if broken else "ok"
        if broken:
            r["reason"] = f"not built: {', '.join(broken)} (build, logs/peers_build*.log)"
        return r

    def speed(self) -> dict:
        # The peers' build output, on this process's path (the stage may follow a build into folders
        # that did not exist when Python started, whose "missing" entries the import system caches).
        for p in (str(SITE), str(DSR_BUILD)):
            if p not in sys.path:
                sys.path.insert(1, p)
            sys.path_importer_cache.pop(p, None)
        os.environ.update(
            {k: v for k, v in self.env().items() if k in ("TORCH_EXTENSIONS_DIR", "MAX_JOBS", "TORCH_CUDA_ARCH_LIST")}
        )
        import rasterize_peers

        # A peer whose build failed is not imported here: gsplat would start its JIT build again, in this process.
        built = read_json(BUILD / "peers_status.json")
        unbuilt = (
            {}
            if self.dry_run
            else {
                k: f"not built: {built.get(k, {}).get('reason') or 'its build failed'} (peers.json)"
                for k in ("gsplat", "diff_surfel")
                if not built.get(k, {}).get("ok")
            }
        )
        if self.dry_run:
            sizes, width, height, warmup, reps = (1500, 3000), 96, 64, 1, 2
        else:
            sizes, width, height, warmup, reps = rasterize_peers.SIZES, 1920, 1080, 3, 10
        with open(self.logs / "speed.log", "w") as log:

            def say(line):
                print(line, file=log, flush=True)
                print(f"speed: {line}", flush=True)

            result = rasterize_peers.run(
                list(sizes),
                width,
                height,
                self.device,
                warmup,
                reps,
                log=say,
                time_left=self.remaining,
                unavailable=unbuilt,
            )
        pid_file = BUILD / "peers_build.pid"
        if not self.dry_run and pid_file.is_file() and alive(int(pid_file.read_text())):
            result["note"] = "the peers' build was still compiling on the CPU during these timings"
        rows = result["rows"]
        failed = [r for r in rows if "error" in r or (r["impl"] == "splat" and "total_ms" not in r)]
        gpu_skipped = sorted({r["impl"] for r in rows if self.gpu and "skipped" in r})
        reason = "; ".join(
            [f"{r['impl']} at {r['surfels']}: {r.get('error', 'no time')}" for r in failed][:3]
            + ([f"skipped: {', '.join(gpu_skipped)}"] if gpu_skipped else [])
        )
        return dict(
            dry_run=self.dry_run,
            device=self.device,
            **result,
            status="failed" if reason else "ok",
            **({"reason": reason} if reason else {}),
        )

    def fastmath(self) -> dict:
        """The --fmad=false question: the exact build (setup's, in place)
        against the fast build (SPLAT_CUDA_EXACT=0, .gpu_campaign/build_fast),
        each timed and checked in its own process (fastmath_workload)."""
        r = {
            "dry_run": self.dry_run,
            "fast_build_command": shlex.join(fast_build_command()),
            "fast_build_env": {"SPLAT_BUILD_CUDA": "1", "SPLAT_CUDA_EXACT": "0", "TORCH_CUDA_ARCH_LIST": "the GPU's"},
        }
        if self.dry_run or not self.gpu:
            r["build"] = {
                "skipped": "dry run: the fast build needs nvcc and the GPU; both sides run the CPU kernels"
                if self.dry_run
                else "no CUDA device"
            }
            fast_dir = self.work / "build_fast"  # not built: the child still takes the path it would load from
        else:
            running = self.wait_build("fast", r)
            status = read_json(BUILD / "fast_status.json")
            if not running and not status.get("ok"):
                cmd = [sys.executable, str(Path(__file__)), "--build-fast"]
                r["foreground_build"] = self.run(cmd, "fastmath_build.log", self.remaining() - 40)
                status = read_json(BUILD / "fast_status.json")
            r["build"] = status
            if not status.get("ok"):
                return dict(r, status="failed", reason="the fast build failed or is unfinished (logs/fast*build*.log)")
            fast_dir = FAST_BUILD
        builds = {}
        for i, (name, ext_dir) in enumerate((("exact", None), ("fast", fast_dir))):
            out = self.work / f"fastmath_{name}.json"
            out.unlink(missing_ok=True)  # a warm machine's earlier call left one
            cmd = [sys.executable, str(Path(__file__)), "--workload", "fastmath", "--workload-out", out]
            cmd += (["--extension-dir", ext_dir] if ext_dir else []) + (["--dry-run"] if self.dry_run else [])
            res = self.run(cmd, f"fastmath_{name}.log", self.remaining() / (2 - i))
            builds[name] = dict(res, **read_json(out))
        r["builds"] = builds
        if not all(b["rc"] == 0 and "speed" in b for b in builds.values()):
            return dict(r, status="failed", reason="a build's measurement failed (logs/fastmath_*.log)")
        exact, fast = builds["exact"], builds["fast"]
        r["exact_over_fast"] = {  # > 1: the fast build is faster
            rast: {
                k: round(exact["speed"][rast][k] / fast["speed"][rast][k], 3)
                for k in ("forward_ms", "backward_ms", "total_ms")
            }
            for rast in FASTMATH_RASTERIZERS
        }
        r["suggested_float32_rtol"] = {name: b["suggested_float32_rtol"] for name, b in builds.items()}
        return dict(r, status="ok")

    def train(self) -> dict:
        r = {"dry_run": self.dry_run, "scenes_folder": str(self.scenes), "runs": {}}
        if self.dry_run:
            runs = [("sample_scene", ROOT / "data" / "sample_scene", ("train.iterations=10",))]
        else:
            runs = [(name, self.scenes / folder, extra) for name, folder, extra in SCENE_RUNS]
        failed = []
        for i, (name, data, extra) in enumerate(runs):
            if not data.is_dir():
                r["runs"][name] = {
                    "status": "skipped",
                    "reason": f"scene folder {data} not found "
                    "(carry .gpu_campaign/scenes: scripts/gpu_campaign.sh prepare)",
                }
                if name != "dtu_scan24_400x300":
                    failed.append(name)
                continue
            if self.remaining() < 60:
                r["runs"][name] = {"status": "skipped", "reason": "out of time in this call"}
                continue
            out = self.work / f"train_{name}"
            cmd = [
                sys.executable,
                "train.py",
                "--data",
                data,
                "--out",
                out,
                "--config",
                "configs/default.yaml",
                "--no-progress",
                "--overwrite",
                *extra,
            ]
            # An even share of what is left among the required runs still to come (the last one is optional).
            required_left = max(1, sum(1 for n, _, _ in runs[i:] if n != "dtu_scan24_400x300"))
            res = self.run(cmd, f"train_{name}.log", self.remaining() / required_left)
            steps = re.findall(r"step (\d+)/(\d+) .*?([\d.]+) it/s", (self.logs / f"train_{name}.log").read_text())
            if steps:  # the last progress line: the speed even of a run that ran out of time
                res["last_logged"] = dict(step=int(steps[-1][0]), of=int(steps[-1][1]), it_per_s=float(steps[-1][2]))
            metrics = read_json(out / "metrics.json")
            res["metrics"] = {k: v for k, v in metrics.items() if k != "test"}
            if metrics.get("iterations"):
                res["seconds_per_step"] = round(metrics["train_seconds"] / metrics["iterations"], 5)
            ref = CPU_REFERENCE.get(name)
            if ref:
                res["cpu_reference"] = dict(
                    file=ref[0], run=".".join(ref[1]), data=dig(read_json(ROOT / ref[0]), ref[1])
                )
            res["status"] = "ok" if res["rc"] == 0 and metrics else "failed"
            if res["status"] != "ok":
                failed.append(name)
            r["runs"][name] = res
        r["status"] = "failed" if failed else "ok"
        if failed:
            r["reason"] = f"failed or missing: {', '.join(failed)}"
        return r

    def profile(self) -> dict:
        r = {"dry_run": self.dry_run}
        cmd = [sys.executable, str(Path(__file__)), "--workload", "profile"] + (["--dry-run"] if self.dry_run else [])
        (self.work / "torch_profile.json").unlink(missing_ok=True)  # a warm machine's earlier call left one
        res = self.run(cmd + ["--torch-profile", self.work / "torch_profile.json"], "profile_torch.log", 90)
        res["kernels"] = read_json(self.work / "torch_profile.json").get("kernels")
        r["torch_profiler"] = res
        ncu = tool("ncu")
        if self.dry_run or not self.gpu or not ncu:
            r["ncu"] = {
                "skipped": "dry run (no GPU)" if self.dry_run else "no CUDA device" if not self.gpu else "ncu not found"
            }
        else:
            # --clock-control none: leave the card's clocks as found (device README); the sections give
            # each kernel's compute and memory throughput against peak, its occupancy and registers.
            ncu_cmd = [
                ncu,
                "--clock-control",
                "none",
                "--target-processes",
                "all",
                "-k",
                KERNELS,
                "-c",
                "12",
                "--section",
                "SpeedOfLight",
                "--section",
                "Occupancy",
                "--section",
                "LaunchStats",
                "--csv",
                "--page",
                "details",
            ] + cmd
            res = self.run(ncu_cmd, "profile_ncu.log", 150)
            res["kernels"] = ncu_bounds(self.logs / "profile_ncu.log")
            r["ncu"] = res
        ok = r["torch_profiler"]["rc"] == 0 and ("skipped" in r["ncu"] or (r["ncu"]["rc"] == 0 and r["ncu"]["kernels"]))
        r["status"] = "ok" if ok else "failed"
        if not ok:
            r["reason"] = "the torch profiler or ncu run failed, or ncu measured no kernel (logs/profile_*.log)"
        return r

    # ------------------------------------------------------------------ driver
    def stage(self, name: str) -> dict:
        start = time.monotonic()
        later = self.stages[self.stages.index(name) + 1 :] if name in self.stages else ()
        self.reserved_after = sum(STAGE_RESERVE_S.get(s, 0) for s in later)
        print(f"== {name} ({self.remaining():.0f} s left)", flush=True)
        if self.remaining() < 10:
            result = {"status": "skipped", "reason": "out of time in this call"}
        elif not (self.gpu or self.dry_run or name == "setup"):
            result = {"status": "failed", "reason": "torch sees no CUDA device (on a CPU machine use --dry-run)"}
        else:
            try:
                result = getattr(self, name)()
            except Exception as error:  # the stage's JSON still says what broke; the other stages go on
                import traceback

                result = {
                    "status": "failed",
                    "error": f"{type(error).__name__}: {error}",
                    "traceback": traceback.format_exc().splitlines()[-12:],
                }
        result = dict(stage=name, seconds=round(time.monotonic() - start, 1), **result)
        tag = f"-call{self.call}" if self.call and name == "setup" else ""
        self.write(name + tag, dict(result, machine=machine(call=self.call)))
        return result

    def finish(self, results: dict) -> int:
        tag = f"-call{self.call}" if self.call else ""
        with tarfile.open(self.out / f"logs{tag}.tar.gz", "w:gz") as tar:
            tar.add(self.logs, arcname=f"logs{tag}")
        shutil.rmtree(self.logs)  # the device returns at most 8 files: the logs travel as one archive
        if self.dry_run:
            shutil.rmtree(self.work, ignore_errors=True)
        summary = {
            name: {k: v for k, v in r.items() if k in ("status", "seconds", "reason", "error", "failed_parts")}
            for name, r in results.items()
        }
        self.write(f"summary{tag}", dict(call=self.call, dry_run=self.dry_run, stages=summary, machine=machine()))
        print("\nstage      status    seconds")
        for name, r in results.items():
            print(f"{name:<10} {r['status']:<9} {r['seconds']:>7}  {r.get('reason') or r.get('error') or ''}")
        if "speed" in results:
            for row in results["speed"].get("rows", []):
                print(
                    "  "
                    + " ".join(
                        f"{k}={row[k]}"
                        for k in (
                            "impl",
                            "surfels",
                            "forward_ms",
                            "backward_ms",
                            "total_ms",
                            "peak_memory_mib",
                            "skipped",
                            "error",
                        )
                        if k in row
                    )
                )
        return 0 if all(r["status"] in ("ok", "skipped") for r in results.values()) else 1


# ---------------------------------------------------------------------- helpers
def gpu_test_modules() -> list[str]:
    """tests/test_*.py that use CUDA when it is there (they ask torch.cuda.is_available(), are marked
    for a GPU or take tests/device_agreement.py's tests), tests/test_cuda.py excepted: parity runs it
    first, alone."""
    marks = ("cuda.is_available()", "needs a GPU", "has_cuda_kernels", "agreement_tests(")
    return [
        f"tests/{p.name}"
        for p in sorted((ROOT / "tests").glob("test_*.py"))
        if p.name != "test_cuda.py" and any(m in p.read_text() for m in marks)
    ]


def child_env(work: Path, gpu: bool, dry_run: bool, **extra) -> dict:
    """The children's environment: this checkout, the carried wheels and the
    diff-surfel build on PYTHONPATH; builds and caches in ignored folders."""
    paths = [str(ROOT), str(SITE), str(DSR_BUILD)] + [p for p in os.environ.get("PYTHONPATH", "").split(":") if p]
    env = dict(
        os.environ,
        PYTHONPATH=":".join(paths),
        PYTHONUNBUFFERED="1",
        TORCH_EXTENSIONS_DIR=str((work if dry_run else BUILD) / "torch_extensions"),
        SPLAT_CACHE_DIR=str(work / "cache"),
        MPLBACKEND="Agg",
    )
    if gpu:
        # A background build's share of the cores (start_build) is kept.
        env["MAX_JOBS"] = os.environ.get("MAX_JOBS") or str(os.cpu_count() or 4)
        env["TORCH_CUDA_ARCH_LIST"] = arch_list()
        env["SPLAT_NO_JIT"] = "1"  # a failed CUDA build must fail the tests, not fall back to a CPU-only JIT
    env.update(extra)
    return env


def tool(name: str) -> str | None:
    """A CUDA tool on PATH, else where CUDA and Nsight Compute usually install it."""
    found = shutil.which(name)
    if found:
        return found
    for pattern in (
        f"/usr/local/cuda/bin/{name}",
        f"/usr/local/cuda/compute-sanitizer/{name}",
        f"/usr/local/cuda-*/bin/{name}",
        f"/opt/nvidia/nsight-compute/*/{name}",
    ):
        hits = sorted(Path("/").glob(pattern.lstrip("/")))
        if hits:
            return str(hits[-1])
    return None


def arch_list() -> str:
    """TORCH_CUDA_ARCH_LIST for this GPU alone: one architecture compiles in a fraction of the time."""
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}.{minor}"


def build_command() -> list:
    # In place: splat._C lands next to the sources, found through PYTHONPATH; build/ is kept on a warm machine.
    return [sys.executable, "setup.py", "build_ext", "--inplace"]


def fast_build_command() -> list:
    # Beside the exact build, never over it: its own build and temporary folders.
    return [
        sys.executable,
        "setup.py",
        "build_ext",
        "--build-lib",
        str(FAST_BUILD),
        "--build-temp",
        str(BUILD / "fast_temp"),
    ]


def kernel_resources(cuobjdump: str) -> list:
    """Registers, shared and local memory per kernel of the built extension (cuobjdump --dump-resource-usage)."""
    so = sorted((ROOT / "splat").glob("_C*.so"))
    if not so:
        return []
    text = subprocess.run([cuobjdump, "--dump-resource-usage", so[-1]], capture_output=True, text=True).stdout
    rows, name = [], None
    demangle = shutil.which("c++filt")
    for line in text.splitlines():
        m = re.search(r"Function (\S+):", line)
        if m:
            name = m.group(1)
            if demangle:
                name = subprocess.run([demangle, name], capture_output=True, text=True).stdout.strip() or name
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line)
        if m and name and "splat" in name:
            rows.append(dict(kernel=name, registers=int(m[1]), stack=int(m[2]), shared=int(m[3]), local=int(m[4])))
    return rows


def junit_summary(path: Path) -> dict:
    """Counts, failures and skip reasons from pytest's JUnit XML.  A module
    that could not be imported for a missing optional package (viser,
    pycolmap, ... absent on the device) is listed apart from real errors."""
    if not path.is_file():
        return {"junit": "no report written (pytest did not finish)"}
    root = ET.parse(path).getroot()
    counts = dict(tests=0, failures=0, errors=0, skipped=0)
    for suite in root.iter("testsuite"):
        for k in counts:
            counts[k] += int(suite.get(k, 0))
    failed, missing, skips = [], [], {}
    for case in root.iter("testcase"):
        test = "::".join(x for x in (case.get("classname"), case.get("name")) if x)
        for child in case:
            message = (child.get("message") or child.text or "").strip()
            if child.tag == "skipped":
                skips[message[:200]] = skips.get(message[:200], 0) + 1
            elif child.tag in ("failure", "error"):
                if child.tag == "error" and re.search(r"No module named|ModuleNotFoundError", child.text or message):
                    missing.append(
                        dict(test=test, message=re.findall(r"No module named '[^']+'", child.text or message)[:1])
                    )
                else:
                    failed.append(
                        dict(test=test, kind=child.tag, message=message.splitlines()[0][:300] if message else "")
                    )
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return dict(
        counts,
        failed=failed[:50],
        errors_other_than_missing_modules=len([f for f in failed if f["kind"] == "error"]),
        not_collected_missing_modules=missing,
        skip_reasons=skips,
    )


def sanitizer_summary(path: Path, tool_name: str) -> dict:
    """The number of reports from compute-sanitizer's closing line (None if it printed none)."""
    text = path.read_text(errors="replace")
    pattern = r"RACECHECK SUMMARY: (\d+) hazard" if tool_name == "racecheck" else r"ERROR SUMMARY: (\d+) error"
    m = re.findall(pattern, text)
    reports = [line for line in text.splitlines() if line.startswith("========= ") and "SUMMARY" not in line]
    return dict(reported=int(m[-1]) if m else None, first_reports=reports[:40])


def ncu_bounds(path: Path) -> list:
    """Per kernel: duration, compute (SM) and memory throughput in % of peak,
    occupancy, registers, and what bounds it: the unit nearer its peak when
    either passes 60 % (Nsight Compute's own threshold for a well-used unit),
    else latency."""
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.startswith('"')]
    if not lines:
        return []
    kernels = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        k = kernels.setdefault(
            row.get("ID"),
            {"kernel": row.get("Kernel Name"), "grid": row.get("Grid Size"), "block": row.get("Block Size")},
        )
        try:
            k[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
            if row["Metric Name"] == "Duration":  # ncu picks the unit (nsecond, usecond, msecond)
                k["duration_unit"] = row.get("Metric Unit")
        except (KeyError, ValueError, AttributeError):
            pass
    wanted = {
        "Duration": "duration",
        "Compute (SM) Throughput": "sm_pct",
        "Memory Throughput": "memory_pct",
        "DRAM Throughput": "dram_pct",
        "Registers Per Thread": "registers",
        "Achieved Occupancy": "achieved_occupancy_pct",
        "Theoretical Occupancy": "theoretical_occupancy_pct",
    }
    rows = []
    for k in kernels.values():
        row = {"kernel": k["kernel"], "grid": k["grid"], "block": k["block"], "duration_unit": k.get("duration_unit")}
        row.update({short: k[long] for long, short in wanted.items() if long in k})
        sm, mem = row.get("sm_pct"), row.get("memory_pct")
        if sm is not None and mem is not None:
            row["bound"] = ("compute" if sm >= mem else "memory") if max(sm, mem) >= 60 else "latency"
        rows.append(row)
    return rows


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    # A finished child of an ended session lingers as a zombie: that is not running.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def dig(data, keys):
    for k in keys:
        data = data.get(k, {}) if isinstance(data, dict) else {}
    return data or None


# ------------------------------------------------------------ peers' build
def build_peers() -> int:
    """gsplat's JIT build and diff-surfel-rasterization's setup.py, into
    .gpu_campaign/build, side by side (the second run's serial build did not
    finish within a call); writes build/peers_status.json.  Exit 0 if both built."""
    BUILD.mkdir(parents=True, exist_ok=True)
    env = child_env(SCRATCH, gpu=True, dry_run=False)
    status = {}
    wheels = sorted(PEERS.glob("gsplat-*.whl"))
    if wheels and not (SITE / "gsplat").is_dir():  # setup installs it with the other carried wheels
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        subprocess.run([*pip, "--no-cache-dir", "--upgrade", "--target", str(SITE), str(wheels[-1])], check=False)
    src = PEERS / "diff-surfel-rasterization"
    dsr, dsr_start = None, time.monotonic()
    if not (src / "setup.py").is_file():
        status["diff_surfel"] = {"ok": False, "reason": "no diff-surfel-rasterization source in .gpu_campaign/peers"}
    else:
        shutil.copytree(src, DSR_BUILD, dirs_exist_ok=True)
        glm = DSR_BUILD / "third_party" / "glm"
        if not (glm / "glm").is_dir():  # its glm submodule: gsplat's wheel ships the same headers
            shutil.rmtree(glm, ignore_errors=True)
            shipped = SITE / "gsplat" / "cuda" / "csrc" / "third_party" / "glm"
            glm.symlink_to(shipped, target_is_directory=True)
        # -include cstdint: its rasterizer_impl.h uses std::uintptr_t without the header, an error with GCC 13.
        dsr = subprocess.Popen(
            [sys.executable, "setup.py", "build_ext", "--inplace"],
            cwd=DSR_BUILD,
            env=dict(env, NVCC_APPEND_FLAGS="-include cstdint"),
        )
    start = time.monotonic()
    if not wheels:
        status["gsplat"] = {"ok": False, "reason": "no gsplat wheel in .gpu_campaign/peers"}
    else:
        # Importing _C triggers gsplat's JIT build (every csrc/*.cu, for TORCH_CUDA_ARCH_LIST only).
        p = subprocess.run(
            [sys.executable, "-c", "from gsplat.cuda._backend import _C; raise SystemExit(_C is None)"],
            env=env,
            cwd=BUILD,
        )
        status["gsplat"] = {
            "ok": p.returncode == 0,
            "rc": p.returncode,
            "wheel": wheels[-1].name,
            "seconds": round(time.monotonic() - start, 1),
        }
    if dsr is not None:
        rc = dsr.wait()
        ok = (
            rc == 0
            and subprocess.run(
                [sys.executable, "-c", "import diff_surfel_rasterization"], env=env, cwd=BUILD
            ).returncode
            == 0
        )
        status["diff_surfel"] = {
            "ok": ok,
            "rc": rc,
            "seconds": round(time.monotonic() - dsr_start, 1),
            "commit": (src / "COMMIT").read_text().strip() if (src / "COMMIT").is_file() else None,
        }
    (BUILD / "peers_status.json").write_text(json.dumps(status, indent=2) + "\n")
    print(json.dumps(status), flush=True)
    return 0 if all(s.get("ok") for s in status.values()) else 1


def build_fast() -> int:
    """splat's CUDA extension with nvcc's fast flags into .gpu_campaign/build_fast;
    writes build/fast_status.json.  Exit 0 if it built."""
    BUILD.mkdir(parents=True, exist_ok=True)
    env = child_env(SCRATCH, gpu=True, dry_run=False, SPLAT_BUILD_CUDA="1", SPLAT_CUDA_EXACT="0")
    start = time.monotonic()
    p = subprocess.run(fast_build_command(), cwd=ROOT, env=env)
    so = sorted((FAST_BUILD / "splat").glob("_C*.so"))
    status = {
        "ok": p.returncode == 0 and bool(so),
        "rc": p.returncode,
        "seconds": round(time.monotonic() - start, 1),
        "extension": str(so[-1].relative_to(ROOT)) if so else None,
    }
    (BUILD / "fast_status.json").write_text(json.dumps(status, indent=2) + "\n")
    print(json.dumps(status), flush=True)
    return 0 if status["ok"] else 1


# -------------------------------------------------------------- workloads
def workload(name: str, dry_run: bool, torch_profile: str | None) -> int:
    """What the sanitizers and profilers watch: splat's forward + backward
    (every output in the loss).  sanitize: several small scenes in float32
    and float64 (many tile batches, a surfel larger than the screen, no
    surfels, all culled), as surfels and as 3D Gaussians; profile: 1M surfels
    at 1080p (tiny in a dry run)."""
    import torch

    import splat
    from splat.testing import random_scene, surface_scene

    device = "cpu" if dry_run or not torch.cuda.is_available() else "cuda"
    backend = "cuda" if device == "cuda" else "cpu"

    def step(scene, dtype=torch.float32, gaussians_3d=False):
        leaf = {
            k: scene[k].to(device, dtype).clone().requires_grad_(True)
            for k in ("means", "quats", "scales", "opacities", "colors")
        }
        rasterize = splat.rasterize
        if gaussians_3d:  # the surfels, thickened along their normals: 3D Gaussians on the same surfaces
            s = scene["scales"].to(device, dtype)
            leaf["scales"] = torch.cat([s, 0.3 * s.amin(1, keepdim=True) + 1e-3], 1).requires_grad_(True)
            rasterize = splat.rasterize_3dgs
        bg = torch.tensor([0.2, 0.3, 0.4], device=device, dtype=dtype, requires_grad=True)
        out = rasterize(
            **leaf,
            viewmat=scene["viewmat"].to(device, dtype),
            K=scene["K"].to(device, dtype),
            width=scene["width"],
            height=scene["height"],
            background=bg,
            backend=backend,
        )
        loss = sum(
            getattr(out, k).double().sum() for k in ("rgb", "alpha", "depth", "normal", "distortion", "median_depth")
        )
        loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()
        if not math.isfinite(float(loss.detach())):
            raise SystemExit(f"workload: non-finite loss on a {scene['width']}x{scene['height']} scene")

    if name == "sanitize":
        scale = 10 if dry_run else 1
        scenes = [
            (surface_scene(20_000 // scale, 256, 192, seed=2), torch.float32),
            (surface_scene(5_000 // scale, 160, 120, seed=3), torch.float64),
            (random_scene(300 // scale, 97, 61, seed=4, principal_offset=(5.0, -2.0)), torch.float32),
        ]
        big = random_scene(40, 128, 96, seed=5, scale_range=(3.0, 5.0))  # every surfel covers many tiles
        scenes.append((big, torch.float32))
        none = random_scene(0, 64, 48, seed=6)
        culled = random_scene(50, 64, 48, seed=7)
        culled["means"] = culled["means"] * 0 + torch.tensor([0.0, 0.0, -50.0], dtype=culled["means"].dtype)
        scenes += [(none, torch.float32), (culled, torch.float32)]
        for scene, dtype in scenes:
            step(scene, dtype)
            step(scene, dtype, gaussians_3d=True)
        print(f"workload sanitize: {len(scenes)} scenes on {device}, as surfels and as 3D Gaussians: ok")
        return 0
    n, width, height = (500, 64, 48) if dry_run else (1_000_000, 1920, 1080)
    scene = surface_scene(n, width, height, dtype=torch.float32, seed=0)
    step(scene)  # warm-up: the first call's allocations and module loads are not the steady state
    if not torch_profile:
        step(scene)
        return 0
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(3):
            step(scene)
    rows = []
    for e in prof.key_averages():
        # torch >= 2.4 calls it device time; older releases cuda time.
        dev = getattr(e, "self_device_time_total", None)
        if dev is None:
            dev = getattr(e, "self_cuda_time_total", 0)
        rows.append(
            dict(
                name=e.key[:200],
                calls=e.count,
                self_device_ms=round(dev / 1e3 / 3, 4),
                self_cpu_ms=round(e.self_cpu_time_total / 1e3 / 3, 4),
            )
        )
    key = "self_device_ms" if device == "cuda" else "self_cpu_ms"
    rows.sort(key=lambda r: -r[key])
    total = sum(r[key] for r in rows) or 1.0
    for r in rows:
        r["share_pct"] = round(100 * r[key] / total, 2)
    Path(torch_profile).write_text(
        json.dumps(
            dict(device=device, surfels=n, width=width, height=height, per_iteration=True, kernels=rows[:30]), indent=2
        )
    )
    print(f"workload profile: {n} surfels {width}x{height} on {device}; top: {rows[0]['name'] if rows else '-'}")
    return 0


def fastmath_renderer(rasterizer: str, scene: dict, device: str, backend: str):
    """(leaf tensors, forward, loss, rgb) as rasterize_peers.renderer returns,
    for splat.rasterize ("surfels") or splat.rasterize_3dgs ("3dgs", each
    surfel given a third scale a tenth of its smaller one), float32; the loss
    is the plain sum of every output."""
    import torch

    import splat

    leaf = {k: scene[k].to(device, torch.float32).clone() for k in ("means", "quats", "scales", "opacities", "colors")}
    if rasterizer == "3dgs":
        leaf["scales"] = torch.cat([leaf["scales"], 0.1 * leaf["scales"].min(-1, keepdim=True).values], -1)  # [N, 3]
    for t in leaf.values():
        t.requires_grad_(True)
    fn = splat.rasterize if rasterizer == "surfels" else splat.rasterize_3dgs
    camera = dict(
        viewmat=scene["viewmat"].to(device, torch.float32),
        K=scene["K"].to(device, torch.float32),
        width=scene["width"],
        height=scene["height"],
        backend=backend,
    )

    def forward():
        return fn(**leaf, **camera)

    def loss(out):
        return sum(getattr(out, k).sum() for k in FASTMATH_OUTPUTS)

    return leaf, forward, loss, lambda out: out.rgb


def parity_errors(rasterizer: str, scene: dict, device: str, backend: str, reference: str) -> dict:
    """Per output and per gradient: the largest absolute difference between
    `backend` on `device` and `reference` on the CPU, and that difference
    over the reference's largest magnitude (rel)."""
    runs = []
    for dev, be in ((device, backend), ("cpu", reference)):
        leaf, forward, loss, _ = fastmath_renderer(rasterizer, scene, dev, be)
        out = forward()
        loss(out).backward()
        tensors = {k: getattr(out, k) for k in FASTMATH_OUTPUTS}
        tensors.update({f"grad_{k}": t.grad for k, t in leaf.items()})
        runs.append({k: t.detach().double().cpu() for k, t in tensors.items()})
    errors = {}
    for k, ref in runs[1].items():
        diff = float((runs[0][k] - ref).abs().max()) if ref.numel() else 0.0
        scale = float(ref.abs().max()) if ref.numel() else 0.0
        errors[k] = {"max_abs": diff, "max_rel": diff / scale if scale > 0 else diff}
    return errors


def suggested_rtol(errors: dict) -> float | None:
    """A float32 tolerance relative to each tensor's largest magnitude: four
    times the largest error seen, up to the next power of ten (None if exact)."""
    worst = max((e["max_rel"] for per in errors.values() for e in per.values()), default=0.0)
    return 10.0 ** math.ceil(math.log10(4 * worst)) if worst > 0 else None


def fastmath_workload(dry_run: bool, extension_dir: str | None, out: str) -> int:
    """One build's side of the fastmath stage, in its own process: with
    --extension-dir DIR, splat._C is imported from DIR/splat (a fast build's
    folder) ahead of the checkout's.  Times forward and backward of both
    rasterizers at 1M primitives, 1080p (tiny on the CPU) and checks them
    against the CPU kernels on a small scene (the plain-PyTorch reference on
    the CPU); writes the JSON to `out`."""
    import importlib

    import rasterize_peers
    import torch

    import splat
    from splat.testing import surface_scene

    if extension_dir:
        # splat._C is imported by name (splat/_native.py): the first folder of the package's path wins.
        splat.__path__.insert(0, str(Path(extension_dir).resolve() / "splat"))
    device = "cpu" if dry_run or not torch.cuda.is_available() else "cuda"
    backend, reference = ("cuda", "cpu") if device == "cuda" else ("cpu", "torch")
    n, width, height, warmup, reps = (1_000_000, 1920, 1080, 3, 10) if device == "cuda" else (400, 48, 32, 1, 2)
    small = surface_scene(*((20_000, 256, 192) if device == "cuda" else (150, 40, 30)), seed=1)
    r = dict(device=device, backend=backend, reference=reference, primitives=n, width=width, height=height)
    scene = surface_scene(n, width, height, dtype=torch.float32, seed=0)
    r["speed"] = {
        rast: rasterize_peers.measure_renderer(fastmath_renderer(rast, scene, device, backend), device, warmup, reps)[0]
        for rast in FASTMATH_RASTERIZERS
    }
    r["parity_scene"] = dict(primitives=small["means"].shape[0], width=small["width"], height=small["height"])
    r["errors"] = {rast: parity_errors(rast, small, device, backend, reference) for rast in FASTMATH_RASTERIZERS}
    r["suggested_float32_rtol"] = suggested_rtol(r["errors"])
    loaded = sys.modules.get("splat._C")
    if device == "cuda" and loaded is None:
        loaded = importlib.import_module("splat._C")
    r["extension_loaded"] = getattr(loaded, "__file__", None)
    if (
        extension_dir
        and loaded is not None
        and not r["extension_loaded"].startswith(str(Path(extension_dir).resolve()))
    ):
        raise SystemExit(f"fastmath: loaded {r['extension_loaded']}, not the build in {extension_dir}")
    Path(out).write_text(json.dumps(r, indent=2) + "\n")
    print(f"fastmath {extension_dir or 'exact'}: {json.dumps(r['speed'])}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT"), help="results folder (default: $OUT)")
    pick = ap.add_mutually_exclusive_group()
    pick.add_argument("--call", type=int, choices=sorted(CALLS), help="the stages of device call 1, 2 or 3")
    pick.add_argument("--stages", nargs="+", metavar="STAGE", help=f"any of {', '.join(STAGES)}, or all")
    ap.add_argument("--dry-run", action="store_true", help="every stage on the CPU with tiny sizes")
    ap.add_argument(
        "--budget-s",
        type=float,
        help="this call's time budget in seconds (default: "
        + ", ".join(f"call {c} {b:g}" for c, b in CALL_BUDGET_S.items())
        + f", --stages {max(CALL_BUDGET_S.values()):g}; the three calls and a {START_S:g} s start"
        f" fit the {DEVICE_BUDGET_S:g} s of device time a session has)",
    )
    ap.add_argument(
        "--scenes",
        type=Path,
        help="folder holding still_life/ and dtu_scan24/ (default: .gpu_campaign/scenes, else ../shared/scenes)",
    )
    ap.add_argument("--workload", choices=("sanitize", "profile", "fastmath"), help=argparse.SUPPRESS)
    ap.add_argument("--torch-profile", help=argparse.SUPPRESS)
    ap.add_argument("--workload-out", help=argparse.SUPPRESS)
    ap.add_argument("--extension-dir", help=argparse.SUPPRESS)
    ap.add_argument("--build-peers", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--build-fast", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.workload == "fastmath":
        return fastmath_workload(args.dry_run, args.extension_dir, args.workload_out)
    if args.workload:
        return workload(args.workload, args.dry_run, args.torch_profile)
    if args.build_peers:
        return build_peers()
    if args.build_fast:
        return build_fast()
    if not args.out:
        ap.error("--out is required (or set OUT)")
    if args.call is None and not args.stages:
        ap.error("name --call 1|2|3 or --stages STAGE ...")
    stages = CALLS[args.call] if args.call else (STAGES if args.stages == ["all"] else args.stages)
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        ap.error(f"--stages: unknown stage {unknown[0]!r} (choose from {', '.join(STAGES)}, or all)")
    if args.budget_s is None:
        args.budget_s = CALL_BUDGET_S[args.call] if args.call else max(CALL_BUDGET_S.values())
    if args.budget_s < 60:
        ap.error(f"--budget-s {args.budget_s:g}: at least 60 seconds")
    if args.scenes is not None and not args.scenes.is_dir():
        ap.error(f"--scenes {args.scenes}: not a folder")
    camp = Campaign(Path(args.out).resolve(), args.dry_run, args.budget_s, args.call, args.scenes, stages)
    results = {name: camp.stage(name) for name in stages}
    return camp.finish(results)


if __name__ == "__main__":
    sys.exit(main())
