"""The GPU campaign's committed results as Markdown tables (docs/gpu.md).

    python bench/gpu_report.py                       # prints the page
    python bench/gpu_report.py --write docs/gpu.md   # regenerates it

Reads bench/results/gpu_<device>_<stage>.json, the files a campaign's
device calls return (scripts/gpu_campaign.sh; copy each call's JSON files
there under that prefix).  Every figure on the page comes from those files;
a stage that did not run or failed says so instead of numbers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def load(prefix: str) -> dict:
    """{stage or file stem: parsed JSON} for bench/results/<prefix>_*.json."""
    found = {}
    for path in sorted(RESULTS.glob(f"{prefix}_*.json")):
        stem = path.stem[len(prefix) + 1 :]
        found[stem] = json.loads(path.read_text())
    if not found:
        raise SystemExit(f"gpu_report: no bench/results/{prefix}_*.json")
    return found


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def machine(r: dict) -> str:
    setup = next((v for k, v in sorted(r.items()) if k.startswith("setup")), {})
    gpu = setup.get("gpu") or {}
    smi = setup.get("nvidia_smi") or []
    driver = smi[1].split(",")[1].strip() if len(smi) > 1 else "?"
    return table(
        ["GPU", "SMs", "memory", "driver", "CUDA (torch)", "torch", "nvcc", "splat commit"],
        [
            [
                gpu.get("name", "?"),
                gpu.get("multiprocessors", "?"),
                f"{gpu.get('memory_gib', '?')} GiB",
                driver,
                setup.get("torch_cuda", "?"),
                setup.get("torch", "?"),
                " ".join(setup.get("nvcc_version") or ["?"]),
                setup.get("commit_staged") or setup.get("commit", "?"),
            ]
        ],
    )


def parity(r: dict) -> str:
    p = r.get("parity") or ({"test_cuda": r["test_cuda"]} if "test_cuda" in r else None)
    if not p:
        return "Not run."
    t = p["test_cuda"]
    rows = [["tests/test_cuda.py", t.get("passed"), t.get("failures"), t.get("skipped")]]
    out = table(["CUDA against the CPU backend", "passed", "failed", "skipped"], rows)
    for f in t.get("failed", []):
        out += f"\n\n- failed: `{f['test']}`: {f['message']}"
    s = r.get("sanitize") or {}
    srows = []
    for name, v in s.items():
        if isinstance(v, dict) and "command" in v:
            state = "timed out" if v.get("timed_out") else f"rc {v.get('rc')}"
            srows.append([name, v.get("reported"), state, f"{v.get('seconds')} s"])
    if srows:
        out += "\n\n" + table(["compute-sanitizer run", "errors reported", "exit", "time"], srows)
    return out


def speed(r: dict) -> str:
    s = r.get("speed")
    if not s:
        return "Not run."
    rows = []
    for row in s["rows"]:
        if "total_ms" in row:
            rows.append(
                [
                    f"{row['surfels']:,}",
                    row["impl"],
                    row["forward_ms"],
                    row["backward_ms"],
                    row["total_ms"],
                    row["backward_over_forward"],
                    row["peak_memory_mib"],
                    row.get("rgb_psnr_vs_splat_db"),
                ]
            )
        else:
            why = row.get("skipped") or row.get("error") or "?"
            rows.append([f"{row['surfels']:,}", row["impl"], "-", "-", "-", "-", "-", why[:120]])
    head = ["surfels", "implementation", "forward ms", "backward ms", "sum ms", "bwd/fwd", "peak MiB"]
    head.append("colour vs splat")
    out = (
        f"{s['rows'][0]['width']}x{s['rows'][0]['height']}, surfels on surfaces (`splat.testing.surface_scene`), "
        "every output in the loss; CUDA-event medians.\n\n" + table(head, rows)
    )
    t = s.get("targets") or {}
    if t.get("speedup_vs_fastest_gsplat") is not None or t.get("speedup_vs_diff_surfel") is not None:
        trows = [
            [
                "forward + backward over the fastest gsplat",
                t.get("fastest_gsplat"),
                t.get("speedup_vs_fastest_gsplat"),
                ">= 2",
            ],
            ["forward + backward over diff-surfel-rasterization", "", t.get("speedup_vs_diff_surfel"), ">= 4"],
            ["backward / forward", "", t.get("backward_over_forward"), "<= 1.5"],
            ["peak memory over the leanest gsplat", "", t.get("memory_over_leanest_gsplat"), "<= 1"],
        ]
        if t.get("speedup_3dgs_vs_gsplat") is not None:
            trows.append(["3D Gaussians: forward + backward over gsplat's rasterization", "gsplat_3dgs",
                          t["speedup_3dgs_vs_gsplat"], ""])  # fmt: skip
        out += "\n\nThe issue's targets at 1M surfels, measured side by side in this call:\n\n"
        out += table(["target", "peer", "splat's ratio", "goal"], trows)
    return out


def fastmath(r: dict) -> str:
    f = r.get("fastmath")
    if not f or "builds" not in f:
        return "Not run."
    rows = []
    for kind in ("surfels", "3dgs"):
        e, q = f["builds"]["exact"]["speed"][kind], f["builds"]["fast"]["speed"][kind]
        rows.append([kind, e["total_ms"], q["total_ms"], round(e["total_ms"] / q["total_ms"], 3)])
    out = table(["1M primitives, 1080p", "exact build ms", "fast build ms", "exact / fast"], rows)
    return out + f"\n\nFloat32 tolerance the fast build would need: {f.get('suggested_float32_rtol')}."


def training(r: dict) -> str:
    t = r.get("train")
    if not t:
        return "Not run."
    rows = []
    for scene, run in t["runs"].items():
        last = run.get("last_logged") or {}
        metrics = run.get("metrics") or {}
        state = run.get("status") or ("timed out" if run.get("timed_out") else f"rc {run.get('rc')}")
        if run.get("timed_out"):
            state = f"stopped at its {run.get('limit_s')} s limit"
        steps = f"{last.get('step', '-')}/{last.get('of', '-')}"
        rows.append([scene, state, steps, last.get("it_per_s"), metrics.get("test.psnr")])
    return table(["scene (default config)", "run", "steps", "it/s", "test PSNR"], rows)


def extra_checks(r: dict) -> str:
    """Device calls run by hand beside the campaign's three (their files say what and why)."""
    parts = []
    w = r.get("wheel")
    if w:
        t, race = w["test_cuda"], w["racecheck_test_cuda"]
        parts.append(
            f"{w['what']}\n\n"
            + table(
                ["through the wheel", "passed", "failed", "result"],
                [
                    ["tests/test_cuda.py", t["passed"], len(t["failed"]) + len(t["errors"]), f"{t['seconds']} s"],
                    ["racecheck over tests/test_cuda.py", race["tests_passed"], race["reported"], race["summary"]],
                ],
            )
        )
    g = r.get("gpu_tests")
    if g:
        rows = [[f["test"], f["message"][:160]] for f in g["failed_on_the_gpu"]]
        parts.append(
            f"{g['what']}: {g['passed']} passed, {len(g['failed_on_the_gpu'])} failed on the GPU, "
            f"{g['failed_outside_the_tree']['count']} failed only because {g['failed_outside_the_tree']['why']}."
            "\n\n"
            + table(["failed on the GPU", "message"], rows)
            + (f"\n\nWhy: {g['resolution']}." if g.get("resolution") else "")
        )
    return "\n\n".join(parts)


def profile(r: dict) -> str:
    p = r.get("profile")
    if not p:
        return "Not run."
    rows = [
        [k["name"][:90], k["calls"] // 3, k["self_device_ms"], k["share_pct"]]
        for k in p["torch_profiler"].get("kernels") or []
    ][:12]
    out = (
        "torch profiler, one forward + backward of 1M surfels at 1080p (the workload also uploads the scene "
        "each step: the host-to-device copies).\n\n" + table(["op or kernel", "calls", "device ms", "share %"], rows)
    )
    ncu = (p.get("ncu") or {}).get("kernels") or []
    if ncu:
        nrows = [
            [k["kernel"].split("(")[0][:60], round(k["duration"] / 1e3, 1), k["sm_pct"], k["dram_pct"], k["bound"]]
            for k in ncu
        ]
        out += "\n\nNsight Compute, splat's kernels:\n\n" + table(["kernel", "us", "SM %", "DRAM %", "bound"], nrows)
    return out


RUNS = (  # (results prefix, what that run measured)
    ("gpu_h200", "First run (commit 4b4ed2b): the projection as PyTorch ops on CUDA"),
    ("gpu_h200b", "After the fused CUDA projection (commit 8ff5dfc); the peers did not finish building in time"),
    ("gpu_h200c", "Third run (commit d0a6655): the peers side by side, the wheel on a GPU"),
)


def run_sections(prefix: str, title: str) -> list[str]:
    r = load(prefix)
    return [
        f"## {title}",
        f"From `bench/results/{prefix}_*.json`.",
        "### Machine",
        machine(r),
        "### Parity and sanitizers",
        parity(r),
        "### Speed against the peers",
        speed(r),
        *(["### Exact against fast maths (`--fmad`)", fastmath(r)] if "fastmath" in r else []),
        *(["### Training", training(r)] if "train" in r else []),
        *(["### Checks beside the three calls", extra_checks(r)] if "wheel" in r or "gpu_tests" in r else []),
        "### Profile",
        profile(r),
    ]


def headline(runs) -> str:
    """splat at 1M surfels in each run, against diff-surfel-rasterization where a run measured it."""
    rows = []
    for prefix, _ in runs:
        for row in load(prefix).get("speed", {}).get("rows", []):
            if row["surfels"] == 1_000_000 and "total_ms" in row and row["impl"] in ("splat", "diff_surfel"):
                rows.append([prefix, row["impl"], row["forward_ms"], row["backward_ms"], row["total_ms"]])
    return table(["run", "1M surfels, 1080p", "forward ms", "backward ms", "sum ms"], rows)


def page(runs=RUNS) -> str:
    parts = [
        "# GPU results",
        "Generated by `python bench/gpu_report.py --write docs/gpu.md` from the campaign's results files;"
        " edit the script, not this page. Ratios between runs compare separate calls on the same kind of"
        " machine; a ratio measured side by side in one call says so.",
        "## At a glance",
        headline(runs),
    ]
    for prefix, title in runs:
        parts += run_sections(prefix, title)
    return "\n\n".join(parts) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", help="write the page here instead of printing it")
    args = ap.parse_args()
    text = page()
    if args.write:
        Path(args.write).write_text(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
