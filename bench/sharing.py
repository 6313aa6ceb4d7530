"""A trained model shared on the web (docs/sharing.md): what PlayCanvas
``splat-transform`` (pinned in tools/web) makes of a run's
``point_cloud.ply``, per output format: file size, conversion time, and the
test-view quality of the model decoded back from it.  Prints JSON (and
writes it with --out).  Not a test: times depend on the machine and its load.

    python bench/sharing.py --model OUT --out bench/results/sharing_still_life.json

For each format (``.spz``, ``.sog``, ``.compressed.ply``, ``.html``) the
command ``splat-transform -w -g cpu OUT/point_cloud.ply scene.FORMAT`` is
run and timed (wall clock; ``-g cpu``: SOG's k-means without a GPU, which
``.sog`` and ``.html`` otherwise need).  The files other than ``.html``
(whose scene is the same SOG, embedded) are decoded back to PLY by the tool
and rendered by splat at the run's test cameras, twice: as the run's
primitive (``as_trained``: a surfel model ignores the third scale) and as
3D Gaussians (``as_3dgs``: the thin third scale splat writes for a surfel
taken at its word, as 3D-Gaussian web viewers do).  ``original`` is the
run's own PLY rendered the same two ways.  PSNR/SSIM are means over the
test views (splat.evaluation.evaluate_frames), at ``--threads`` torch threads.
``--thin-factors``: the original surfel PLY also rendered as 3D Gaussians
with other third scales (splat writes 0.01 times the smaller tangent scale).
A decoded compressed PLY holds +-inf opacity logits where the 8-bit opacity
is 0 or 255; they are clamped (and counted) before splat reads it.
"""

from __future__ import annotations

import argparse
import io
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from report import commit, emit, machine  # noqa: E402

TOOL = ROOT / "tools" / "web" / "node_modules" / ".bin" / "splat-transform"
FORMATS = ("spz", "sog", "compressed.ply", "html")


def convert(tool: Path, src: Path, dst: Path, gpu: str) -> float:
    """Seconds ``splat-transform -w -g GPU SRC DST`` took; raises with its output on a failure."""
    cmd = [str(tool), "-w", "-g", gpu, str(src), str(dst)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return seconds


def clamp_infinite_opacity(ply: Path) -> int:
    """Rewrites ``ply`` with +-inf opacity logits (a decoded 8-bit opacity of
    exactly 1 or 0) clamped to +-16.6 (float32's logit of 1 - 2**-24), which
    splat's load_ply refuses as not finite; returns how many there were."""
    import numpy as np
    from plyfile import PlyData

    data = PlyData.read(io.BytesIO(ply.read_bytes()))  # not memory-mapped: the file is rewritten
    opacity = data["vertex"]["opacity"]
    bad = np.isinf(opacity)
    if bad.any():
        data["vertex"]["opacity"] = np.clip(opacity, -16.6, 16.6)
        data.write(str(ply))
    return int(bad.sum())


def with_thin_factor(ply: Path, factor: float, out: Path) -> Path:
    """A copy of the surfel PLY ``ply`` whose third scale is ``factor`` times the smaller tangent one."""
    import math

    import numpy as np
    from plyfile import PlyData

    data = PlyData.read(io.BytesIO(ply.read_bytes()))
    v = data["vertex"]
    v["scale_2"] = np.minimum(v["scale_0"], v["scale_1"]) + np.float32(math.log(factor))
    data.write(str(out))
    return out


def quality(ply: Path, primitive: str, cfg, scene) -> dict:
    """Test PSNR/SSIM of the PLY ``ply`` read as ``primitive``."""
    import torch

    from splat.data.background import configured_background
    from splat.evaluation import evaluate_frames
    from splat.model_render import render_frame
    from splat.ply import load_ply

    model = load_ply(ply, primitive=primitive)
    bg = torch.tensor(configured_background(cfg["data"]), dtype=torch.float32)
    r = cfg["render"]

    def render_views(views):
        with torch.no_grad():
            return {i: render_frame(model, f, bg, near=r["near"], far=r["far"]) for i, f in enumerate(views)}

    test = evaluate_frames(cfg, bg, scene.test, render_views)
    return dict(psnr=round(test["psnr"], 3), ssim=round(test["ssim"], 4))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="training output folder (config.yaml, point_cloud.ply)")
    ap.add_argument("--data", default=None, help="scene folder (default: the one in MODEL/config.yaml)")
    ap.add_argument("--tool", default=str(TOOL), help="the splat-transform executable")
    ap.add_argument("--gpu", default="cpu", help="splat-transform's -g value (an adapter index or 'cpu')")
    ap.add_argument("--formats", nargs="*", default=list(FORMATS), choices=list(FORMATS))
    ap.add_argument(
        "--thin-factors",
        nargs="*",
        type=float,
        default=[],
        help="also render the original surfel PLY as 3D Gaussians with these third scales (x the smaller one)",
    )
    ap.add_argument("--every", type=int, default=1, help="every N-th test view")
    ap.add_argument("--no-quality", action="store_true", help="sizes and times only")
    ap.add_argument("--threads", type=int, default=2, help="torch threads for the renders")
    ap.add_argument("--note", default=None, help="recorded as is: where the model came from")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import torch

    from splat.trained_run import load_run

    torch.set_num_threads(args.threads)
    model_dir = Path(args.model)
    ply = model_dir / "point_cloud.ply"
    if not ply.is_file():
        ap.error(f"--model: {ply} not found (train first)")
    tool = Path(args.tool)
    if not tool.exists():
        ap.error(f"--tool: {tool} not found (cd tools/web && npm ci)")
    shown = subprocess.run([str(tool), "--version"], capture_output=True, text=True)
    version = (shown.stdout + shown.stderr).strip()  # 3.7.0 prints it on stderr
    model, cfg, scene = load_run(model_dir, args.data)
    scene.test = scene.test[:: args.every]
    primitive = model.primitive
    as_3dgs = "3dgs"
    report = dict(
        what="splat-transform outputs of a trained model: size, conversion time, decoded test quality",
        command="python bench/sharing.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
        tool=dict(name="@playcanvas/splat-transform", version=version, gpu=args.gpu),
        node=subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip(),
        machine=machine(threads=args.threads, omp_num_threads=os.environ.get("OMP_NUM_THREADS")),
        commit=commit(str(ROOT)),
        model=dict(
            folder=str(model_dir),
            primitive=primitive,
            count=model.num_gaussians,
            sh_degree=model.sh_degree,
            ply_bytes=ply.stat().st_size,
            test_views=len(scene.test),
        ),
        formats={},
    )
    if args.note:
        report["note"] = args.note
    if not args.no_quality:
        report["original"] = dict(
            as_trained=quality(ply, primitive, cfg, scene), as_3dgs=quality(ply, as_3dgs, cfg, scene)
        )
    with tempfile.TemporaryDirectory() as tmp:
        if args.thin_factors and primitive == "2dgs":
            report["thin_factors_as_3dgs"] = {
                str(f): quality(with_thin_factor(ply, f, Path(tmp) / f"thin_{i}.ply"), as_3dgs, cfg, scene)
                for i, f in enumerate(args.thin_factors)
            }
        for fmt in args.formats:
            out = Path(tmp) / f"scene.{fmt}"
            seconds = convert(tool, ply, out, args.gpu)
            row = dict(
                command=f"splat-transform -w -g {args.gpu} OUT/point_cloud.ply OUT/scene.{fmt}",
                bytes=out.stat().st_size,
                ratio_to_ply=round(ply.stat().st_size / out.stat().st_size, 2),
                seconds=round(seconds, 2),
            )
            if fmt != "html":
                back = Path(tmp) / f"back_{fmt.replace('.', '_')}.ply"
                row["decode_seconds"] = round(convert(tool, out, back, args.gpu), 2)
                row["infinite_opacity_logits_clamped"] = clamp_infinite_opacity(back)
                if not args.no_quality:
                    row["as_trained"] = quality(back, primitive, cfg, scene)
                    row["as_3dgs"] = quality(back, as_3dgs, cfg, scene)
            report["formats"][fmt] = row
            print(fmt, row, file=sys.stderr, flush=True)
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
