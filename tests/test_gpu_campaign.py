"""The GPU campaign (scripts/gpu_campaign.sh, bench/gpu_campaign.py) cannot
rot while no GPU is lent: its --dry-run runs every stage on the CPU with tiny
sizes, and this checks the JSON it writes.  Also the parsers of the tools'
outputs that only a GPU machine produces (pytest's JUnit XML is produced
here; Nsight Compute's CSV and compute-sanitizer's summary are fed samples).
About 25 s on 2 idle cores; needs nothing outside the checkout."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_campaign.sh"
STAGE_FILES = ("setup", "parity", "sanitize", "peers", "speed", "fastmath", "train", "profile")


def _campaign_module():
    sys.path.insert(0, str(ROOT / "bench"))  # it imports bench/report.py as its siblings do
    spec = importlib.util.spec_from_file_location("gpu_campaign", ROOT / "bench" / "gpu_campaign.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _finite_numbers(value, where=""):
    """Every number anywhere in a JSON value is finite (bools aside)."""
    if isinstance(value, dict):
        for k, v in value.items():
            _finite_numbers(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _finite_numbers(v, f"{where}[{i}]")
    elif isinstance(value, float):
        assert math.isfinite(value), f"{where} = {value}"


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("campaign_out")
    env = dict(os.environ, OUT=str(out))
    proc = subprocess.run(
        ["bash", str(SCRIPT), "run", "--dry-run", "--stages", "all", "--budget-s", "900"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, {name: json.loads((out / f"{name}.json").read_text()) for name in STAGE_FILES + ("summary",)}


def test_dry_run_writes_every_stage(dry_run):
    out, r = dry_run
    for name in STAGE_FILES:
        assert r[name]["stage"] == name and r[name]["status"] in ("ok", "skipped"), r[name]
        assert r[name]["dry_run"] is True and r[name]["machine"]["cpus"] >= 1
        _finite_numbers(r[name], name)
    assert {k: v["status"] for k, v in r["summary"]["stages"].items()} == {k: r[k]["status"] for k in STAGE_FILES}
    # The logs come back as one archive (the device returns at most 8 files).
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"{n}.json" for n in STAGE_FILES + ("summary",)] + ["logs.tar.gz"]
    )
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = tar.getnames()
    assert "logs/parity_test_cuda.log" in names and "logs/train_sample_scene.log" in names


def test_dry_run_stage_contents(dry_run):
    _, r = dry_run
    assert r["setup"]["check"]["extension"] is True and "build_ext" in r["setup"]["build_command"]
    cuda = r["parity"]["test_cuda"]
    assert cuda["rc"] == 0 and cuda["tests"] >= 1 and cuda["passed"] >= 1 and cuda["failures"] == 0
    assert r["sanitize"]["status"] == "skipped" and "no GPU" in r["sanitize"]["reason"]
    assert r["sanitize"]["workload"]["rc"] == 0
    assert r["peers"]["status"] == "skipped" and r["peers"]["reason"]

    rows = r["speed"]["rows"]
    mine = [row for row in rows if row["impl"] in ("splat", "compat_gsplat", "splat_3dgs")]  # measured on the CPU
    assert len(mine) == 6
    for row in mine:
        for key in ("forward_ms", "backward_ms", "total_ms", "peak_memory_mib", "backward_over_forward"):
            assert row[key] > 0, (key, row)
        assert row["total_ms"] == pytest.approx(row["forward_ms"] + row["backward_ms"], abs=2e-3)
    for row in rows:
        if row not in mine:  # peers are CUDA-only: skipped, with the reason
            assert "CUDA" in row["skipped"] and "forward_ms" not in row
        if row["impl"] == "compat_gsplat":  # the drop-in renders what splat renders
            assert row["rgb_max_abs_diff_vs_splat"] < 1e-3
    targets = r["speed"]["targets"]
    assert targets["backward_over_forward"] > 0 and "CUDA" in targets["gsplat_not_measured"]
    assert "CUDA" in targets["diff_surfel_not_measured"]

    run = r["train"]["runs"]["sample_scene"]
    assert run["rc"] == 0 and run["metrics"]["iterations"] == 10 and run["seconds_per_step"] > 0
    assert 5 < run["metrics"]["test.psnr"] < 60 and run["last_logged"]["step"] == 10

    fm = r["fastmath"]
    assert fm["status"] == "ok" and "dry run" in fm["build"]["skipped"]
    assert "SPLAT_CUDA_EXACT" in fm["fast_build_env"] and "--build-lib" in fm["fast_build_command"]
    for name in ("exact", "fast"):  # both sides measured, each in its own process
        build = fm["builds"][name]
        assert build["rc"] == 0 and build["extension_loaded"] is None  # no CUDA extension on the CPU
        assert set(build["speed"]) == set(build["errors"]) == {"surfels", "3dgs"}
        for rast, errors in build["errors"].items():
            assert build["speed"][rast]["forward_ms"] > 0 and build["speed"][rast]["backward_ms"] > 0
            assert {"rgb", "depth", "distortion", "grad_means", "grad_scales"} <= set(errors)
            # The CPU kernels against the plain-PyTorch reference, float32: a few float32 ulps of each
            # tensor's largest value (measured up to 4e-4, the distortion's, whose sum cancels).
            assert all(0 <= e["max_rel"] < 1e-2 for e in errors.values()), (rast, errors)
        assert 0 < build["suggested_float32_rtol"] <= 1e-2
    assert set(fm["exact_over_fast"]) == {"surfels", "3dgs"}
    assert all(v > 0 for ratios in fm["exact_over_fast"].values() for v in ratios.values())

    prof = r["profile"]
    assert prof["torch_profiler"]["rc"] == 0 and prof["ncu"]["skipped"]
    kernels = prof["torch_profiler"]["kernels"]
    assert kernels and all(k["self_cpu_ms"] >= 0 and k["name"] for k in kernels)


def test_calls_cover_every_stage_within_the_budget():
    m = _campaign_module()
    assert sorted({s for stages in m.CALLS.values() for s in stages}) == sorted(m.STAGES)
    assert all(stages[0] == "setup" for stages in m.CALLS.values())  # each call may start on a bare machine
    assert len(m.CALLS) <= 3
    # The priorities, first settled first: parity and sanitizers, then speed and the fmad question.
    assert {"parity", "sanitize"} <= set(m.CALLS[1]) and {"speed", "fastmath"} <= set(m.CALLS[2])
    # Every call's default budget, plus the machine's start and the gaps, fits a session's device time.
    assert set(m.CALL_BUDGET_S) == set(m.CALLS) and m.START_S >= 120
    assert sum(m.CALL_BUDGET_S.values()) + m.START_S <= m.DEVICE_BUDGET_S == 900
    assert all(60 <= b <= 600 - 30 for b in m.CALL_BUDGET_S.values())  # a command runs at most 600 s
    # The plan that prepare prints and the docs' table name the same budgets (timeout_s: the budget + 40 s).
    script, docs = SCRIPT.read_text(), (ROOT / "docs" / "testing.md").read_text()
    for call, budget in m.CALL_BUDGET_S.items():
        assert f'--call {call}"  timeout_s {int(budget) + 40}  carry' in script, call
        row = f"| {call} | `bash scripts/gpu_campaign.sh run --call {call}` | {int(budget) + 40} |"
        assert row in docs and f"{', '.join(m.CALLS[call])} | {int(budget)} s |" in docs, call


def test_one_line_errors():
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    cases = [
        (["run", "--stages", "parity"], "--out is required"),
        (["run", "--out", "/tmp/x", "--stages", "bogus"], "unknown stage 'bogus'"),
        (["run", "--out", "/tmp/x"], "--call 1|2|3 or --stages"),
        (["run", "--out", "/tmp/x", "--call", "4"], "--call"),
        (["prepare", "--bogus"], "unknown argument '--bogus'"),
        (["frobnicate"], "first argument: prepare or run"),
    ]
    for args, message in cases:
        proc = subprocess.run(
            ["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr.strip().splitlines()[-1], (args, proc.stderr)


def test_tool_output_parsers(tmp_path):
    m = _campaign_module()
    # Nsight Compute's --csv --page details: one row per metric; numbers may carry thousands separators.
    head = (
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
    )
    rows = []
    for kid, name, sm, mem in (
        ("0", "forward_kernel<float>", "82.5", "40.1"),
        ("1", "duplicate_kernel", "12.0", "71.3"),
        ("2", "tile_offsets_kernel", "5", "9"),
    ):
        for metric, unit, value in (
            ("Duration", "usecond", "1,234.5"),
            ("Compute (SM) Throughput", "%", sm),
            ("Memory Throughput", "%", mem),
            ("Registers Per Thread", "register/thread", "72"),
        ):
            rows.append(
                f'"{kid}","1","python3","h","{name}","1","7","(256, 1, 1)","(8160, 1, 1)","0","9.0",'
                f'"GPU Speed Of Light Throughput","{metric}","{unit}","{value}"'
            )
    log = tmp_path / "ncu.log"
    log.write_text("==PROF== Connected to process\nworkload profile: ok\n" + "\n".join([head] + rows) + "\n")
    bounds = {k["kernel"]: k for k in m.ncu_bounds(log)}
    assert bounds["forward_kernel<float>"]["bound"] == "compute"
    assert bounds["forward_kernel<float>"]["duration"] == 1234.5 and bounds["duplicate_kernel"]["registers"] == 72
    assert bounds["forward_kernel<float>"]["duration_unit"] == "usecond"
    assert bounds["duplicate_kernel"]["bound"] == "memory" and bounds["tile_offsets_kernel"]["bound"] == "latency"

    san = tmp_path / "san.log"
    san.write_text(
        "========= COMPUTE-SANITIZER\n========= Invalid __global__ read of size 4 bytes\n"
        "========= ERROR SUMMARY: 1 error\n"
    )
    assert m.sanitizer_summary(san, "memcheck")["reported"] == 1
    san.write_text("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n")
    assert m.sanitizer_summary(san, "racecheck") == {"reported": 0, "first_reports": []}
    san.write_text("Segmentation fault\n")  # no closing line: not a clean run
    assert m.sanitizer_summary(san, "memcheck")["reported"] is None

    # A module the device cannot import for a missing optional package is told apart from a failure.
    junit = tmp_path / "j.xml"
    junit.write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="1" skipped="0">'
        '<testcase classname="tests.test_a" name="test_x"/>'
        '<testcase classname="tests.test_a" name="test_y"><failure message="assert 1 == 2"/></testcase>'
        '<testcase classname="" name="tests.test_viewer"><error message="collection failure">'
        "ModuleNotFoundError: No module named 'viser'</error></testcase></testsuite></testsuites>"
    )
    s = m.junit_summary(junit)
    assert (s["passed"], s["failures"], s["errors_other_than_missing_modules"]) == (1, 1, 0)
    assert s["not_collected_missing_modules"][0]["message"] == ["No module named 'viser'"]
    assert m.junit_summary(tmp_path / "absent.xml") == {"junit": "no report written (pytest did not finish)"}


@pytest.mark.parametrize("exact", ["1", "0", None])
def test_cuda_exact_switch(exact):
    """SPLAT_CUDA_EXACT=0 drops the four exact-rounding nvcc flags (the fastmath
    stage's fast build); unset or 1 keeps them.  setup.py is run with setup()
    and torch's CUDAExtension replaced by recorders: nothing is compiled."""
    env = {k: v for k, v in os.environ.items() if k != "SPLAT_CUDA_EXACT"}
    env.update(SPLAT_BUILD_CUDA="1", **({"SPLAT_CUDA_EXACT": exact} if exact is not None else {}))
    probe = (
        "import json, runpy, setuptools, torch.utils.cpp_extension as ce\n"
        "got = {}\n"
        "setuptools.setup = lambda **kw: got.update(kw)\n"
        "ce.CUDAExtension = lambda name, sources, **kw: (name, kw)\n"
        "ce.BuildExtension.with_options = classmethod(lambda cls, **kw: cls)\n"
        "runpy.run_path('setup.py', run_name='__main__')\n"
        "print(json.dumps([e[1]['extra_compile_args']['nvcc'] for e in got['ext_modules'] if isinstance(e, tuple)]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (nvcc,) = json.loads(proc.stdout.splitlines()[-1])
    exact_flags = ["--fmad=false", "-ftz=false", "-prec-div=true", "-prec-sqrt=true"]
    assert "-DSPLAT_WITH_CUDA" in nvcc
    if exact == "0":
        assert not set(exact_flags) & set(nvcc)
    else:
        assert nvcc[-4:] == exact_flags


def test_gpu_results_page_is_generated_from_the_committed_results():
    """docs/gpu.md is bench/gpu_report.py's output for the committed
    bench/results/gpu_h200_*.json: regenerate it when a campaign's results land."""
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("gpu_report", ROOT / "bench" / "gpu_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = module.page()
    assert "| NVIDIA H200 |" in page and "## Speed against the peers" in page
    assert (ROOT / "docs" / "gpu.md").read_text() == page, "run: python bench/gpu_report.py --write docs/gpu.md"


def _fake_wheel(folder: Path) -> Path:
    """A wheel of a stand-in package named splat: its tests cannot pass, so
    the run below shows which splat they imported."""
    import zipfile

    info = "splat-0.0.0.dist-info"
    files = {
        "splat/__init__.py": "",
        "splat/_native_cuda.py": "def cuda_kernels():\n    return None\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: splat\nVersion: 0.0.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "splat-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return wheel


def test_the_wheel_step_tests_the_installed_wheel_not_the_tree(tmp_path, monkeypatch):
    campaign = _campaign_module()
    c = campaign.Campaign(tmp_path / "out", dry_run=True, budget_s=300, call=None, scenes=None)
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    monkeypatch.setattr(campaign, "SPLAT_WHEEL", tmp_path / "none")
    r = c.wheel_tests(base, tmp_path)
    assert r["status"] == "skipped" and "prepare builds it" in r["reason"]

    monkeypatch.setattr(campaign, "SPLAT_WHEEL", tmp_path / "staged")
    _fake_wheel(tmp_path / "staged")
    r = c.wheel_tests(base, tmp_path)
    assert r["install"]["rc"] == 0, r["install"]["tail"]
    probe = "\n".join(r["probe"]["tail"])
    assert f"splat {c.work / 'wheel_site' / 'splat'}" in probe, probe
    # test_cuda.py ran from outside the tree, against the stand-in (its outcome depends on the machine: no GPU here)
    assert r["status"] == "ran" and "tests/test_cuda.py" in r["command"], r


def test_parity_runs_the_modules_that_use_a_gpu():
    modules = _campaign_module().gpu_test_modules()
    for name in ("test_mcmc", "test_pose_opt", "test_multiview", "test_native_cuda", "test_compat_diff_gaussian"):
        assert f"tests/{name}.py" in modules, name
    for name in ("test_compat_gsplat", "test_compat_gsplat_3dgs", "test_compat_diff_surfel"):
        assert f"tests/{name}.py" in modules, name
    # test_cuda.py runs first, alone; a module with no GPU test is left to CI
    assert "tests/test_cuda.py" not in modules and "tests/test_docs.py" not in modules
