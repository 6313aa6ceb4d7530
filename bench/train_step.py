"""Training-step benchmark: milliseconds per step, split into phases, for two
code trees side by side (old and new), in one run.  Prints JSON (and writes it
with --out).  Not a test: numbers depend on the machine and its load.

    python bench/train_step.py --roots /tmp/old . --out bench/results/train_step_cpu.json

Each (scene, root) measurement runs in its own subprocess with that root first
on sys.path (its compiled splat._C built in place), and the roots alternate
repetition by repetition, so that both see the same machine load.  Phases:

    projection           render() minus the rasterizer kernel's forward: camera
                         transform, screen matrix, bounds, SH colours
    rasterizer_forward   the C++ forward kernel (binning + blending)
    loss                 total_loss forward (L1, SSIM, distortion, normals)
    rasterizer_backward  the C++ backward kernel
    autograd_other       the rest of loss.backward(): projection, SH and loss backward
    optimiser            Adam steps and zero_grad
    strategy             densification statistics (pre- and post-backward hooks)

Scenes (800 x 600 / --downscale, --surfels surfels or 3D Gaussians with --primitive 3dgs):
    dtu_scan24   ../shared/scenes/dtu_scan24 (COLMAP layout, 49 images of
                 800x600); the model is its point cloud, resampled with jitter
                 to --surfels points.
    synthetic    the same cameras and images, the model --surfels random points in
                 the cameras' common view (the trainer's random initialisation).
Steps are numbered from 701 (distortion and normal losses on in default.yaml,
no densification step in the timed window), after 2 warm-up steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from report import add_child_flag, child_case, commit, emit, machine, print_child_result, run_child

DTU = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "scenes", "dtu_scan24")
PHASES = ("projection", "rasterizer_forward", "loss", "rasterizer_backward", "autograd_other", "optimiser", "strategy")


def _load_config(overrides):
    try:
        from splat.config import load_config  # after the trainer split
    except ImportError:
        from splat.trainer import load_config
    here = os.path.dirname(os.path.abspath(sys.modules["splat"].__file__))
    return load_config(os.path.join(here, "..", "configs", "default.yaml"), overrides)


def _bench_model(trainer, cfg, scene_name, data, surfels):
    """The model every root starts from, built once and cached in the temp
    folder (so old and new roots time the very same surfels):
        dtu_scan24  the scene's point cloud resampled with jitter to `surfels` points;
        synthetic   `surfels` random points in the train cameras' common view
                    (as the trainer's random initialisation), random colours.
    Scales as create_from_points (mean distance to the 3 nearest neighbours,
    here with scipy's k-d tree instead of the O(N^2) torch search)."""
    import hashlib

    import torch
    from scipy.spatial import cKDTree

    from splat.geometry import random_points_in_frustums
    from splat.model import GaussianModel, logit, random_quats
    from splat.sh import rgb_to_sh

    m = cfg["model"]
    key = hashlib.sha1(f"{os.path.abspath(data)}|{scene_name}|{surfels}|{m}".encode()).hexdigest()[:16]
    cache = os.path.join(tempfile.gettempdir(), f"splat_bench_model_{key}.pt")
    if os.path.exists(cache):
        return GaussianModel(torch.load(cache), m["sh_degree"])
    g = torch.Generator().manual_seed(0)
    if scene_name == "dtu_scan24":
        pts, cols = trainer.scene.points.float(), trainer.scene.point_colors.float()
        idx = torch.randint(len(pts), (surfels,), generator=g)
        pts = pts[idx] + 0.002 * trainer.scene_radius * torch.randn(surfels, 3, generator=g)
        cols = cols[idx]
    else:
        frames = trainer.scene.train
        viewmats = torch.stack([f.viewmat for f in frames]).float()
        Ks = torch.stack([f.K for f in frames]).float()
        centre = torch.stack([f.camera_center for f in frames]).float().mean(0)
        pts = random_points_in_frustums(
            surfels,
            viewmats,
            Ks,
            frames[0].width,
            frames[0].height,
            centre,
            trainer.scene_radius,
            generator=g,
            min_views=m["init_random_min_views"],
        )
        cols = torch.rand(surfels, 3, generator=g)
    dist, _ = cKDTree(pts.double().numpy()).query(pts.double().numpy(), k=4)
    dist = torch.from_numpy(dist[:, 1:].mean(1)).float().clamp_min(1e-7)
    n_rest = (m["sh_degree"] + 1) ** 2 - 1
    params = {
        "means": pts.float().contiguous(),
        "quats": random_quats(surfels, g),
        "scales": torch.log(dist * m["init_scale"])[:, None].repeat(1, 3 if m["primitive"] == "3dgs" else 2),
        "opacities": logit(torch.full((surfels,), float(m["init_opacity"]))),
        "sh0": rgb_to_sh(cols.clamp(0, 1))[:, None, :],
        "shN": torch.zeros(surfels, n_rest, 3),
    }
    torch.save(params, cache + ".tmp")
    os.replace(cache + ".tmp", cache)
    return GaussianModel(params, m["sh_degree"])


def run_case(scene_name, data, surfels, steps, threads, primitive="2dgs", downscale=1):
    import torch

    torch.set_num_threads(threads)
    import splat
    from splat._backend import load_extension
    from splat.losses import total_loss
    from splat.trainer import Trainer

    # The trainer starts from a small model (its kNN scale initialisation is
    # O(N^2)); the benchmark model replaces it (_bench_model).
    cfg = _load_config(
        [
            f"data.path={data}",
            f"data.downscale={downscale}",
            f"model.primitive={primitive}",
            "data.layout=colmap",
            "model.init=random",
            "model.init_num_random=1000",
            "log.progress=false",
        ]
    )
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(cfg, out)
        model = _bench_model(trainer, cfg, scene_name, data, surfels)
        trainer.model = model
        from splat.trainer import make_optimizers

        trainer.optimizers = make_optimizers(model, cfg["train"]["lr"], trainer.scene_radius)
        ext = load_extension()
        timers = {"rasterizer_forward": 0.0, "rasterizer_backward": 0.0}

        def timed(name, fn):
            def call(*args):
                t = time.perf_counter()
                result = fn(*args)
                timers[name] += time.perf_counter() - t
                return result

            return call

        kernels = (
            ("forward_gaussians_cpu", "backward_gaussians_cpu")
            if primitive == "3dgs"
            else ("forward_cpu", "backward_cpu")
        )
        setattr(ext, kernels[0], timed("rasterizer_forward", getattr(ext, kernels[0])))
        setattr(ext, kernels[1], timed("rasterizer_backward", getattr(ext, kernels[1])))
        frames = trainer.scene.train
        rows = []
        for i in range(steps + 2):
            step = 701 + i
            frame = frames[i % len(frames)]
            for k in timers:
                timers[k] = 0.0
            gt = frame.image.to(torch.float32)
            t0 = time.perf_counter()
            out = trainer.render(frame, trainer.background, trainer.sh_degree_at(step))
            t1 = time.perf_counter()
            loss, _ = total_loss(out, gt, frame.K, frame.viewmat, step, cfg["loss"])
            t2 = time.perf_counter()
            trainer.strategy.step_pre_backward(model, trainer.optimizers, out, step)
            t3 = time.perf_counter()
            loss.backward()
            t4 = time.perf_counter()
            for opt in trainer.optimizers.values():
                opt.step()
                opt.zero_grad(set_to_none=True)
            t5 = time.perf_counter()
            trainer.strategy.step_post_backward(model, trainer.optimizers, out, step)
            t6 = time.perf_counter()
            if i < 2:
                continue  # warm-up
            rows.append(
                dict(
                    projection=t1 - t0 - timers["rasterizer_forward"],
                    rasterizer_forward=timers["rasterizer_forward"],
                    loss=t2 - t1,
                    rasterizer_backward=timers["rasterizer_backward"],
                    autograd_other=t4 - t3 - timers["rasterizer_backward"],
                    optimiser=t5 - t4,
                    strategy=(t3 - t2) + (t6 - t5),
                    total=t6 - t0,
                )
            )
        if hasattr(trainer, "close"):
            trainer.close()
    med = {k: round(1e3 * statistics.median(r[k] for r in rows), 1) for k in rows[0]}
    return dict(
        scene=scene_name,
        primitive=primitive,
        surfels=int(model.num_gaussians),
        width=frames[0].width,
        height=frames[0].height,
        threads=threads,
        steps=steps,
        ms_per_step=med,
        splat=os.path.dirname(splat.__file__),
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--roots", nargs="+", default=["."], help="code trees to compare (first = baseline)")
    ap.add_argument("--scenes", nargs="+", default=["dtu_scan24", "synthetic"])
    ap.add_argument("--data", default=DTU)
    ap.add_argument("--surfels", type=int, default=200_000)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per repetition")
    ap.add_argument("--reps", type=int, default=2, help="alternating repetitions per root")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--primitive", choices=("2dgs", "3dgs"), default="2dgs", help="model.primitive")
    ap.add_argument("--downscale", type=int, default=1, help="data.downscale (2: 400 x 300)")
    ap.add_argument("--out")
    add_child_flag(ap)
    args = ap.parse_args()
    case = child_case(args)
    if case is not None:
        print_child_result(
            run_case(
                case["scene"], args.data, case["surfels"], args.steps, args.threads, args.primitive, args.downscale
            )
        )
        return
    roots = [os.path.abspath(r) for r in args.roots]
    results = {}
    for scene in args.scenes:
        for _rep in range(args.reps):
            for root in roots:
                env = dict(os.environ, PYTHONPATH=root, OMP_NUM_THREADS=str(args.threads))
                r, proc = run_child(
                    __file__,
                    dict(scene=scene, surfels=args.surfels),
                    ["--data", args.data, "--steps", args.steps, "--threads", args.threads]
                    + ["--primitive", args.primitive, "--downscale", args.downscale],
                    env=env,
                    cwd=root,
                )
                if r is None:
                    print(proc.stderr[-3000:], file=sys.stderr)
                    raise SystemExit(f"{scene} on {root} failed")
                print(json.dumps(r), file=sys.stderr)
                results.setdefault((scene, root), []).append(r)
    table = []
    for (scene, root), rs in results.items():
        best = {k: min(r["ms_per_step"][k] for r in rs) for k in rs[0]["ms_per_step"]}  # least disturbed rep
        table.append(
            dict(
                scene=scene,
                root=root,
                surfels=rs[0]["surfels"],
                width=rs[0]["width"],
                height=rs[0]["height"],
                threads=args.threads,
                ms_per_step=best,
                repetitions=[r["ms_per_step"] for r in rs],
            )
        )
    ratios = {}
    if len(roots) > 1:
        for scene in args.scenes:
            old = next(t for t in table if t["scene"] == scene and t["root"] == roots[0])["ms_per_step"]
            new = next(t for t in table if t["scene"] == scene and t["root"] == roots[-1])["ms_per_step"]
            ratios[scene] = {k: round(old[k] / new[k], 2) for k in old if new[k] > 0}
    emit(
        dict(
            machine=machine(),
            command=" ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]),
            commits={root: commit(root) for root in roots},
            results=table,
            speedup_old_over_new=ratios,
        ),
        args.out,
    )


if __name__ == "__main__":
    main()
