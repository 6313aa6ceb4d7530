"""``loss.multiview`` off and on, side by side on one scene: test PSNR, depth
and normal error, time (``bench/quality.py``) and the mesh against the
scene's ground truth (``bench/mesh.py --model``: F1 at 0.5 % of the
diagonal, Chamfer, unseen share; a scene without ``mesh.ply`` but with
masks, dtu_scan24: ``bench/mesh_masked.py``, against its SfM points inside
the masks, and the test PSNR inside them), one run at a time, each a subprocess.
Prints the matrix as JSON (and writes it with --out), with every command.

    OMP_NUM_THREADS=2 python bench/multiview_quality.py --shared ../shared --work /tmp/mvq \\
        --configs default --primitives 2dgs --out bench/results/multiview_still_life.json
    OMP_NUM_THREADS=2 python bench/multiview_quality.py --shared ../shared --work /tmp/mvd --scene dtu_scan24 \
        --configs fast --out bench/results/multiview_dtu_scan24.json data.layout=transforms data.downscale=4

Variants: ``off`` (the config as committed) and ``on``
(``loss.multiview.enabled=true``), plus any ``--variant NAME=OVERRIDES``
(comma-separated ``key=value``).  Runs in the order config, primitive,
variant; --work keeps each run folder (the mesh needs it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from report import commit, emit, machine  # noqa: E402

VARIANTS = {"off": [], "on": ["loss.multiview.enabled=true"]}


def run(cmd: list, log: list) -> dict:
    """Runs ``cmd`` (a bench script writing JSON to its --out) and returns that JSON."""
    log.append(" ".join(["python", *cmd[1:]]))
    print("$ " + log[-1], file=sys.stderr, flush=True)
    out = Path(cmd[cmd.index("--out") + 1])
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
    if not out.is_file():
        return {"error": f"exit code {proc.returncode}, no {out.name}"}
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", required=True, help="folder holding scenes/")
    ap.add_argument(
        "--scene", default="still_life", help="a scene with a ground-truth mesh (NeRF layout), or masks and SfM points"
    )
    ap.add_argument("--work", required=True, help="folder for the run folders and per-run JSON")
    ap.add_argument("--configs", nargs="+", default=["default"], choices=["default", "fast"])
    ap.add_argument("--primitives", nargs="+", default=["2dgs"], choices=["2dgs", "3dgs"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), help="names among off, on and --variant's")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=K=V,K=V", help="another variant")
    ap.add_argument("--out")
    ap.add_argument("overrides", nargs="*", help="config overrides for every run (before the variant's)")
    args = ap.parse_args()
    variants = dict(VARIANTS)
    for spec in args.variant:
        name, _, overrides = spec.partition("=")
        variants[name] = [o for o in overrides.split(",") if o]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    scene_dir = Path(args.shared) / "scenes" / args.scene
    # A ground-truth mesh (still_life) or, for a masked capture (dtu_scan24), its SfM points inside the masks.
    mesh_bench = "bench/mesh.py" if (scene_dir / "mesh.ply").is_file() else "bench/mesh_masked.py"
    commands: list = []
    rows = []
    for config in args.configs:
        for primitive in args.primitives:
            for name in args.variants:
                tag = f"{config}_{primitive}_{name}"
                overrides = [f"model.primitive={primitive}", *args.overrides, *variants[name]]
                q = run(
                    [
                        sys.executable,
                        "bench/quality.py",
                        "--shared",
                        args.shared,
                        "--scenes",
                        args.scene,
                        "--configs",
                        config,
                        "--inits",
                        "auto",
                        "--keep",
                        str(work / tag),
                        "--out",
                        str(work / f"quality_{tag}.json"),
                        *overrides,
                    ],
                    commands,
                )
                rec = (q.get("runs") or [{}])[0]
                m = run(
                    [
                        sys.executable,
                        mesh_bench,
                        "--scene",
                        str(scene_dir),
                        "--model",
                        str(work / tag / f"{args.scene}_{config}_auto"),
                        "--out",
                        str(work / f"mesh_{tag}.json"),
                    ],
                    commands,
                )
                metrics = rec.get("metrics", {})
                rows.append(
                    dict(
                        config=config,
                        primitive=primitive,
                        variant=name,
                        overrides=" ".join(variants[name]) or "(none)",
                        psnr=metrics.get("test.psnr"),
                        psnr_masked=metrics.get("test.psnr_masked"),
                        depth_rel_err=metrics.get("test.depth_rel_err"),
                        normal_deg_err=metrics.get("test.normal_deg_err"),
                        surfels=metrics.get("n_gaussians"),
                        train_seconds=metrics.get("train_seconds"),
                        mesh_f1=m.get("f1", m.get("error")),
                        mesh_chamfer_pct=m.get("chamfer_pct"),
                        mesh_unseen_share=m.get("unseen_share"),
                        mesh_completeness_pct=m.get("completeness_pct"),
                        error=rec.get("error"),
                    )
                )
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    emit(
        dict(
            benchmark="multiview_quality",
            command=" ".join(["python", *sys.argv]),
            commit=commit(str(ROOT)),
            machine=machine(omp_num_threads=os.environ.get("OMP_NUM_THREADS")),
            scene=args.scene,
            commands=commands,
            runs=rows,
        ),
        args.out,
    )


if __name__ == "__main__":
    main()
