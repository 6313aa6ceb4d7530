"""Camera-pose optimisation (``train.pose_opt``) on a shared scene with
perturbed train poses (issue 40, part 2).

::

    OMP_NUM_THREADS=2 python bench/pose_opt.py --shared ../shared --out bench/results/pose_opt_still_life.json

Three runs of one config, one after another in this process:

``exact``       the data's poses;
``perturbed``   every train camera turned by ``--deg`` (1 deg) about a random
                axis through its centre and moved by ``--shift`` (1 %) of its
                distance to the scene centre in a random direction (keyed by
                ``--seed``); test cameras exact;
``pose_opt``    the same perturbed poses with ``train.pose_opt=true``.

All three start from one initial model, built from the exact poses
(:func:`reuse_initial_model`).  ``--part gauge`` applies only the
perturbation's gauge part (a joint similarity motion of every train camera,
which no train loss can see: the floor a pose optimiser with a fixed gauge
cannot lift), ``--part rest`` the perturbation without it
(:func:`split_gauge`); ``--trace N`` records the aligned pose error every N
steps.
Reported per run: test PSNR / SSIM at the given test poses and, as
``psnr_test_aligned``, with the test cameras mapped into the frame of the
run's train cameras (:func:`test_psnr_in_the_run_frame`: the gauge),
with ``--refine-test N`` as ``psnr_test_refined`` after each test pose is
refined against its photo with the model frozen (:func:`refined_test_frames`),
time,
and the train poses' error against
the exact ones -- mean and median rotation error (degrees) and centre error
(% of the camera distance) -- both as they are and after the best similarity
(Umeyama on the centres, then the mean rotation) maps them onto the exact
ones: the gauge the train loss cannot see.  The scene centre is the point
nearest to every train camera's optical axis (least squares).
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from report import commit, emit, machine  # noqa: E402

from splat.config import load_config  # noqa: E402
from splat.pose_opt import camera_to_world, gauge_basis, skew  # noqa: E402


def look_at_centre(c2w: torch.Tensor) -> torch.Tensor:
    """[3]: the point nearest (least squares) to the optical axes of ``c2w`` [N, 4, 4] (OpenCV: +z forward)."""
    d = c2w[:, :3, 2] / c2w[:, :3, 2].norm(dim=1, keepdim=True)  # [N, 3]
    P = torch.eye(3, dtype=c2w.dtype) - d[:, :, None] * d[:, None, :]  # [N, 3, 3] projectors off each axis
    return torch.linalg.solve(P.sum(0), (P @ c2w[:, :3, 3:]).sum(0))[:, 0]


def perturb(c2w: torch.Tensor, deg: float, shift: float, seed: int) -> torch.Tensor:
    """``c2w`` [N, 4, 4] turned by ``deg`` about random axes through each
    centre and moved by ``shift`` x its distance to :func:`look_at_centre`."""
    g = torch.Generator().manual_seed(seed)
    axes = torch.randn(len(c2w), 3, generator=g, dtype=torch.float64)
    axes = axes / axes.norm(dim=1, keepdim=True)
    dirs = torch.randn(len(c2w), 3, generator=g, dtype=torch.float64)
    dirs = dirs / dirs.norm(dim=1, keepdim=True)
    dist = (c2w[:, :3, 3] - look_at_centre(c2w)).norm(dim=1, keepdim=True)
    out = c2w.clone()
    out[:, :3, :3] = torch.linalg.matrix_exp(skew(axes * math.radians(deg))) @ c2w[:, :3, :3]
    out[:, :3, 3] = c2w[:, :3, 3] + shift * dist * dirs
    return out


def rotation_vector(R: torch.Tensor) -> torch.Tensor:
    """[N, 3] the rotation vectors (axis x angle, radians) of rotations ``R`` [N, 3, 3] below 180 deg."""
    c = ((R.diagonal(dim1=1, dim2=2).sum(1) - 1) / 2).clamp(-1, 1)
    angle = torch.acos(c)  # [N]
    w = torch.stack([R[:, 2, 1] - R[:, 1, 2], R[:, 0, 2] - R[:, 2, 0], R[:, 1, 0] - R[:, 0, 1]], 1) / 2  # sin(a) axis
    scale = torch.where(angle > 1e-12, angle / torch.sin(angle).clamp_min(1e-300), torch.ones_like(angle))
    return w * scale[:, None]


def split_gauge(given: torch.Tensor, exact: torch.Tensor, radius: float, part: str) -> torch.Tensor:
    """The perturbation ``given`` - ``exact`` (camera-to-world [N, 4, 4]) as
    corrections ξ_i = (ω_i, u_i) (:mod:`splat.pose_opt`'s parametrisation),
    split into its gauge part Q Q^T ξ (a joint similarity motion of every
    camera, which no train loss can see) and the rest; the poses ``exact``
    moved by the ``part`` asked for ("gauge" or "rest")."""
    omega = rotation_vector(given[:, :3, :3] @ exact[:, :3, :3].transpose(1, 2))  # [N, 3] world axes
    u = (given[:, :3, 3] - exact[:, :3, 3]) / radius  # [N, 3]
    xi = torch.cat([omega, u], 1).reshape(-1, 1)  # [6N, 1]
    Q = gauge_basis(exact[:, :3, 3], radius)
    gauge = Q @ (Q.T @ xi)
    xi = (gauge if part == "gauge" else xi - gauge).reshape(-1, 6)
    out = exact.clone()
    out[:, :3, :3] = torch.linalg.matrix_exp(skew(xi[:, :3])) @ exact[:, :3, :3]
    out[:, :3, 3] = exact[:, :3, 3] + radius * xi[:, 3:]
    return out


def _angles(Ra: torch.Tensor, Rb: torch.Tensor) -> torch.Tensor:
    """[N] degrees between rotations [N, 3, 3]."""
    c = ((Ra @ Rb.transpose(1, 2)).diagonal(dim1=1, dim2=2).sum(1) - 1) / 2
    return torch.rad2deg(torch.acos(c.clamp(-1, 1)))


def similarity(c2w: torch.Tensor, ref: torch.Tensor):
    """The similarity that best maps the cameras ``c2w`` [N, 4, 4] onto
    ``ref``: Umeyama on the centres, then the rotation refined to the mean
    residual rotation of the orientations.  Returns ``apply``, a function
    mapping any camera-to-world poses [M, 4, 4] by it."""
    a, b = c2w[:, :3, 3], ref[:, :3, 3]
    ma, mb = a.mean(0), b.mean(0)
    A, B = a - ma, b - mb
    U, S, Vt = torch.linalg.svd(B.T @ A / len(a))
    D = torch.eye(3, dtype=a.dtype)
    D[2, 2] = torch.sign(torch.det(U @ Vt))
    G = U @ D @ Vt
    s = float((S * D.diagonal()).sum() / A.square().sum(1).mean())
    # orientation: the rotation closest to the mean residual (chordal mean)
    M = (ref[:, :3, :3] @ (G @ c2w[:, :3, :3]).transpose(1, 2)).sum(0)
    U, _, Vt = torch.linalg.svd(M)
    D[2, 2] = torch.sign(torch.det(U @ Vt))
    turn = U @ D @ Vt

    def apply(poses: torch.Tensor) -> torch.Tensor:
        out = poses.clone()
        out[:, :3, :3] = turn @ G @ poses[:, :3, :3]
        out[:, :3, 3] = s * (poses[:, :3, 3] - ma) @ G.T + mb
        return out

    return apply


def align(c2w: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``c2w`` mapped by :func:`similarity` onto ``ref``."""
    return similarity(c2w, ref)(c2w)


def pose_errors(c2w: torch.Tensor, ref: torch.Tensor) -> dict:
    """Rotation (deg) and centre (% of camera distance) errors of ``c2w`` against ``ref``, raw and aligned."""
    dist = (ref[:, :3, 3] - look_at_centre(ref)).norm(dim=1)
    out = {}
    for name, m in (("raw", c2w), ("aligned", align(c2w, ref))):
        rot = _angles(m[:, :3, :3], ref[:, :3, :3])
        pos = 100 * (m[:, :3, 3] - ref[:, :3, 3]).norm(dim=1) / dist
        out[name] = dict(
            rot_deg_mean=round(float(rot.mean()), 4),
            rot_deg_median=round(float(rot.median()), 4),
            pos_pct_mean=round(float(pos.mean()), 4),
            pos_pct_median=round(float(pos.median()), 4),
        )
    return out


def reuse_initial_model(cfg: dict) -> None:
    """Every run starts from one initial model, built once from the exact
    poses: the runs then differ by their train poses alone (and the
    initialisation, ~10 minutes on a loaded 2-core machine, runs once)."""
    import splat.trainer
    from splat.data import load_scene_from_config
    from splat.data.background import resolve_background
    from splat.distributed import Group

    scene = load_scene_from_config(cfg["data"])
    cfg["data"]["background"] = resolve_background(cfg["data"], scene)  # as the trainers will
    background = torch.tensor(cfg["data"]["background"], dtype=torch.float32)
    torch.manual_seed(cfg["seed"])
    model = splat.trainer.initial_shard(cfg, scene, background, Group())
    splat.trainer.initial_shard = lambda *args: copy.deepcopy(model)


def test_psnr_in_the_run_frame(trainer, scene, train_c2w: torch.Tensor, exact_c2w: torch.Tensor) -> float:
    """Mean test PSNR with the (exact) test cameras mapped into the frame
    the run's train cameras ``train_c2w`` define: by the similarity that
    maps the exact train poses onto them.  The train loss cannot see a joint
    motion of every camera and the scene (the gauge), and the perturbation
    moves the train cameras' mean by about 1/sqrt(N) of a camera's error,
    which no pose optimisation can undo; pose-optimisation papers evaluate
    after this alignment (BARF's protocol)."""
    to_run = similarity(exact_c2w, train_c2w)
    test_c2w = camera_to_world(torch.stack([f.viewmat.double() for f in scene.test]))
    frames = []
    for f, m in zip(scene.test, camera_to_world(to_run(test_c2w))):
        g = copy.copy(f)
        g.viewmat = m.to(f.viewmat.dtype)
        frames.append(g)
    return test_psnr_of(trainer, frames)


def refined_test_frames(trainer, scene, steps: int, lr: float) -> list:
    """The test frames with each camera's pose refined against its own photo,
    the model frozen (test-time pose optimisation, the protocol of BARF and
    its successors): ``steps`` Adam steps on the L1 loss of a correction ξ
    (:func:`splat.pose_opt.corrected_viewmat`: turn in radians, shift in
    scene radii) from the given pose, the rate decaying from ``lr`` to 1 %
    of it.  It takes up the gauge and what is left of each test view's
    misfit, for every run alike (the exact-pose run's test views too)."""
    from splat.model_render import render_frame
    from splat.pose_opt import corrected_viewmat

    r, model, radius = trainer.cfg["render"], trainer.model, float(scene.scene_radius())
    frozen = [p for p in model.params.values() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    refined = []
    try:
        for f in scene.test:
            xi = torch.zeros(6, dtype=torch.float64, requires_grad=True)
            opt = torch.optim.Adam([xi], lr=lr)
            sched = torch.optim.lr_scheduler.ExponentialLR(opt, 0.01 ** (1.0 / max(steps - 1, 1)))
            given = f.viewmat.double()
            target = f.image.to(trainer.device)  # [H, W, 3] over data.background, as the test metrics compare
            for _ in range(steps):
                g = copy.copy(f)
                g.viewmat = corrected_viewmat(given, xi, radius).float()
                out = render_frame(model, g, trainer.background, backend=r["backend"], near=r["near"], far=r["far"])
                loss = (out.rgb - target).abs().mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
            g = copy.copy(f)
            g.viewmat = corrected_viewmat(given, xi.detach(), radius).float()
            refined.append(g)
    finally:
        for p in frozen:
            p.requires_grad_(True)
    return refined


def test_psnr_of(trainer, frames) -> float:
    """Mean test PSNR of ``frames`` rendered as the trainer renders its test views."""
    from splat.evaluation import evaluate_frames
    from splat.training.batch_rendering import camera_of

    def render_views(views):
        cameras = [camera_of(v, trainer.background, trainer.device) for v in views]
        with torch.no_grad():
            return trainer.rendering.render_views(trainer.model, cameras, trainer.model.sh_degree)

    return evaluate_frames(trainer.cfg, trainer.background, frames, render_views)["psnr"]


def place_train_cameras(scene, c2w: torch.Tensor) -> None:
    """Gives ``scene``'s train cameras the camera -> world poses ``c2w`` [N, 4, 4]."""
    for f, m in zip(scene.train, camera_to_world(c2w)):
        f.viewmat = m.float()


def train_poses(trainer, scene) -> torch.Tensor:
    """[N, 4, 4] the run's train cameras to world, corrected where it optimises them."""
    train = torch.stack([f.viewmat.double() for f in scene.train])
    if trainer.pose is not None:
        train = trainer.pose.viewmats(train)
    return camera_to_world(train)


def run(
    cfg: dict, scene, out_dir: Path, exact_c2w: torch.Tensor, trace_every: int = 0, refine: tuple = (0, 0.0)
) -> dict:
    """One training run; with ``trace_every`` > 0, the aligned pose error every
    that many steps too; with ``refine`` = (steps > 0, lr), the test PSNR after
    :func:`refined_test_frames` too."""
    from splat.trainer import Trainer

    trace = []

    def record(trainer, step, terms):
        if trace_every > 0 and step % trace_every == 0:
            trace.append(dict(step=step, **pose_errors(train_poses(trainer, scene), exact_c2w)["aligned"]))

    t0 = time.perf_counter()
    trainer = Trainer(cfg, out_dir, scene=scene, overwrite=True, callbacks=[record] if trace_every > 0 else ())
    metrics = trainer.train()
    train_c2w = train_poses(trainer, scene)
    refined = {}
    if refine[0] > 0:
        t1 = time.perf_counter()
        refined = dict(
            psnr_test_refined=round(test_psnr_of(trainer, refined_test_frames(trainer, scene, *refine)), 3),
            refine_seconds=round(time.perf_counter() - t1, 1),
        )
    return dict(
        psnr=round(metrics["test.psnr"], 3),
        psnr_test_aligned=round(test_psnr_in_the_run_frame(trainer, scene, train_c2w, exact_c2w), 3),
        **refined,
        ssim=round(metrics["test.ssim"], 4),
        n_gaussians=metrics["n_gaussians"],
        train_seconds=metrics["train_seconds"],
        wall_seconds=round(time.perf_counter() - t0, 1),
        pose_error=pose_errors(train_c2w, exact_c2w),
        **(dict(pose_error_trace=trace) if trace_every > 0 else {}),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shared", required=True, help="the shared folder (holds scenes/)")
    p.add_argument("--scene", default="still_life")
    p.add_argument("--config", default="configs/fast.yaml")
    p.add_argument("--seed", type=int, default=0, help="keys the perturbation")
    p.add_argument("--deg", type=float, default=1.0)
    p.add_argument("--shift", type=float, default=0.01)
    p.add_argument(
        "--runs",
        default="exact,perturbed,pose_opt",
        type=lambda v: v.split(","),
        help="comma-separated, of exact, perturbed, pose_opt (one word: a list here would swallow the overrides)",
    )
    p.add_argument(
        "--part",
        choices=("all", "gauge", "rest"),
        default="all",
        help="which part of the perturbation to apply: all, its gauge part alone (a joint similarity motion "
        "of every train camera: the floor no pose optimisation can lift), or the rest (gauge-free as "
        "train.pose_opt holds the gauge without train.pose_opt_metric: orthogonal to it in the corrections)",
    )
    p.add_argument("--trace", type=int, default=0, help="record the aligned pose error every this many steps")
    p.add_argument(
        "--refine-test",
        type=int,
        default=0,
        metavar="STEPS",
        help="also report psnr_test_refined: each test pose refined against its photo, model frozen, this many steps",
    )
    p.add_argument("--refine-lr", type=float, default=1e-3, help="--refine-test's first rate (Adam; decays to 1 %%)")
    p.add_argument("--out", default=None)
    p.add_argument("overrides", nargs="*", help="config overrides for every run")
    args = p.parse_args()
    if not args.runs or set(args.runs) - {"exact", "perturbed", "pose_opt"}:
        p.error(f"--runs: {','.join(args.runs)} is not a comma-separated list of exact, perturbed, pose_opt")
    from splat.data import load_scene_from_config

    data = Path(args.shared) / "scenes" / args.scene
    reuse_initial_model(load_config(str(ROOT / args.config), [f"data.path={data}", *args.overrides]))
    results = {}
    for name in args.runs:
        extra = ["train.pose_opt=true"] if name == "pose_opt" else []
        cfg = load_config(str(ROOT / args.config), [f"data.path={data}", "log.progress=false", *args.overrides, *extra])
        scene = load_scene_from_config(cfg["data"])
        exact = camera_to_world(torch.stack([f.viewmat.double() for f in scene.train]))
        given = exact if name == "exact" else perturb(exact, args.deg, args.shift, args.seed)
        if name != "exact" and args.part != "all":
            place_train_cameras(scene, given)  # the scene radius the trainer will see
            given = split_gauge(given, exact, float(scene.scene_radius()), args.part)
        place_train_cameras(scene, given)
        with tempfile.TemporaryDirectory() as tmp:
            results[name] = run(cfg, scene, Path(tmp) / name, exact, args.trace, (args.refine_test, args.refine_lr))
            results[name]["pose_error_given"] = pose_errors(given, exact)
        print(name, results[name], file=sys.stderr, flush=True)
    summary = {}
    if "exact" in results:
        summary.update({f"psnr_drop_{k}_db": round(results["exact"]["psnr"] - results[k]["psnr"], 3)
                        for k in results if k != "exact"})  # fmt: skip
        summary.update({f"psnr_drop_{k}_test_aligned_db":
                        round(results["exact"]["psnr"] - results[k]["psnr_test_aligned"], 3)
                        for k in results if k != "exact"})  # fmt: skip
        if args.refine_test > 0:
            summary.update({f"psnr_drop_{k}_test_refined_db":
                            round(results["exact"]["psnr_test_refined"] - results[k]["psnr_test_refined"], 3)
                            for k in results if k != "exact"})  # fmt: skip
    if "pose_opt" in results:
        before = results["pose_opt"]["pose_error_given"]["aligned"]["rot_deg_mean"]
        after = results["pose_opt"]["pose_error"]["aligned"]["rot_deg_mean"]
        summary["rotation_error_cut"] = round(before / max(after, 1e-12), 2)
    emit(
        dict(
            command=f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')} python bench/pose_opt.py "
            + " ".join(sys.argv[1:]),
            commit=commit(str(ROOT)),
            machine=machine(omp_num_threads=os.environ.get("OMP_NUM_THREADS")),
            scene=args.scene,
            config=args.config,
            seed=args.seed,
            perturbation=dict(deg=args.deg, shift_of_distance=args.shift, part=args.part),
            summary=summary,
            runs=results,
        ),
        args.out,
    )


if __name__ == "__main__":
    main()
