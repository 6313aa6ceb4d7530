"""The training config: typed sections declared once, checked on load.

Every field is declared below with its type, default and allowed range; the
YAML files in ``splat/configs/`` (shipped in the package; ``configs/`` in a
checkout links to them) and ``key=value`` overrides are checked against
these declarations (unknown key, wrong type, out-of-range value ->
:class:`~splat.errors.ConfigError` naming the file/override, key and value).
The loaded config is a plain nested ``dict`` (``cfg["train"]["iterations"]``)
so that it is trivially saved as YAML and stored in checkpoints::

    from splat.config import load_config
    cfg = load_config("configs/fast.yaml", ["train.iterations=2000"])
    cfg = load_config("fast")  # the packaged config of that name, from any folder

Order: defaults <- YAML file <- overrides (values parsed as YAML; float
fields also accept ``1e-4``, which YAML 1.1 reads as a string).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Literal, Optional, Sequence, Union

from .errors import ConfigError

__all__ = [
    "SplatConfig",
    "DEFAULT_CONFIG",
    "load_config",
    "config_file",
    "packaged_configs",
    "check_config",
    "set_dotted",
    "config_to_yaml",
]


def _f(default, doc: str = "", **checks):
    """A config field: ``checks`` are range bounds (ge, gt, le, lt; applied to
    each element of a list), ``length`` for lists, ``pattern`` for strings."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"doc": doc, **checks})
    return field(default=default, metadata={"doc": doc, **checks})


def _section(cls):
    return field(default_factory=cls)


@dataclass
class DataConfig:
    path: str = _f("data/sample_scene", "scene folder")
    layout: Literal["auto", "colmap", "transforms", "nerf"] = _f(
        "auto", "COLMAP if sparse/ exists, else transforms.json (nerfstudio/instant-ngp), else NeRF-synthetic json"
    )
    downscale: int = _f(1, "images are area-averaged by this integer factor", ge=1)
    test_every: int = _f(8, "COLMAP test split: every n-th image (<= 0: no test split)")
    background: Union[Literal["auto"], List[float]] = _f(
        "auto",
        "the render's background RGB, which RGBA images are composited over; auto: the colour that covers at "
        "least 10 % of the RGB training photos' pixels (a studio backdrop or sky), else white "
        "(splat.data.background; the run's config.yaml holds the colour it chose)",
        length=3,
        ge=0.0,
        le=1.0,
    )
    random_background: bool = _f(False, "train on a random background each step (needs RGBA images)")
    masks: Literal["none", "background", "ignore"] = _f(
        "none",
        "transforms.json mask_path: background = masked-out pixels become the background colour; "
        "ignore = left out of the photometric loss",
    )
    cache_dir: str = _f("", "undistorted-image cache ('' = $SPLAT_CACHE_DIR or ~/.cache/splat)")
    undistort_blank_pixels: float = _f(
        0.0,
        "undistortion crop: 0 = valid pixels only (COLMAP's default), 1 = every source pixel, blank border",
        ge=0.0,
        le=1.0,
    )


@dataclass
class ModelConfig:
    primitive: Literal["2dgs", "3dgs"] = _f(
        "2dgs", "2dgs: surfels (splat.rasterize); 3dgs: 3D Gaussians (splat.rasterize_3dgs)"
    )
    sh_degree: int = _f(3, "max SH degree", ge=0, le=3)
    init: Literal["auto", "points", "triangulate", "stereo", "random"] = _f(
        "auto",
        "auto: the scene's points if it has them, else triangulated (pycolmap), else plane-sweep stereo, else random",
    )
    init_num_stereo: int = _f(20000, "at most this many plane-sweep stereo points (model.init=stereo)", ge=1)
    init_num_random: int = _f(10000, "number of random points when there is no point cloud", ge=0)
    init_fill_spacing: float = _f(
        1.0,
        "auto: thin each filling source to one point per cube this many coverage "
        "cells wide at its depth; 0 keeps every point",
        ge=0.0,
    )
    init_random_min_views: float = _f(0.5, "random points are seen by this fraction of train cameras", ge=0.0, le=1.0)
    init_opacity: float = _f(0.1, "initial opacity", gt=0.0, lt=1.0)
    init_scale: float = _f(1.0, "x mean distance to the 3 nearest neighbours", gt=0.0)
    init_max_scale_px: float = _f(
        0.0,
        "initial surfel size at most this many pixels (standard deviation) at its depth in the views "
        "that see it; 0 = the 3DGS rule unbounded",
        ge=0.0,
    )


@dataclass
class LrConfig:
    means: float = _f(1.6e-4, "x scene_radius, decays exponentially to means_final", gt=0.0)
    means_final: float = _f(1.6e-6, "x scene_radius", gt=0.0)
    sh0: float = _f(2.5e-3, "degree-0 SH (base colour)", ge=0.0)
    shN: float = _f(1.25e-4, "sh0 / 20", ge=0.0)
    opacities: float = _f(5e-2, "opacity logits", ge=0.0)
    scales: float = _f(5e-3, "log scales", ge=0.0)
    quats: float = _f(1e-3, "rotation quaternions (unnormalised)", ge=0.0)


@dataclass
class TrainConfig:
    iterations: int = _f(4000, "total optimisation steps", ge=0)
    batch_size: int = _f(
        1,
        "training cameras per step; the loss is their mean, and each step takes the next "
        "batch_size views of the seeded view order",
        ge=1,
    )
    sh_increase_every: int = _f(500, "one more SH degree every n steps", ge=0)
    coarse_factor: int = _f(
        2,
        "coarse-to-fine: the first steps render and compare images area-downscaled by this power of 2, "
        "halved in equal spans of steps until train.coarse_until (splat/training/resolution.py); "
        "1 = full resolution throughout",
        ge=1,
    )
    coarse_until: int = _f(
        1000,
        "first step at full resolution when train.coarse_factor > 1 (at the latest the middle of the run)",
        ge=0,
    )
    appearance: Literal["none", "affine"] = _f(
        "none",
        "affine: a learned per-train-image colour correction A rgb + b (exposure, white balance) "
        "applied to the render before the loss (splat/appearance.py)",
    )
    appearance_lr: float = _f(5e-3, "(sparse) Adam learning rate of the appearance corrections", ge=0.0)
    pose_opt: bool = _f(
        False,
        "learn a rigid correction of every train camera's pose (test cameras keep theirs); "
        "the optimised poses go to OUT/poses.json (splat/pose_opt.py, docs/training.md)",
    )
    pose_opt_lr: float = _f(
        5e-3,
        "RowAdam learning rate of the pose corrections (radians; translation in scene radii; with "
        "pose_opt_metric, radians of image motion), decaying exponentially to 1 % at the last step",
        ge=0.0,
    )
    pose_opt_reg: float = _f(
        0.0, "weight of |correction|^2 added to a camera's loss: a prior pulling it toward its given pose", ge=0.0
    )
    pose_opt_metric: bool = _f(
        False,
        "step the pose corrections in coordinates where a unit moves what the camera sees by one radian "
        "of view, whichever mix of turn and shift (splat/pose_opt.py, the metric; docs/training.md)",
    )
    pose_opt_from: int = _f(
        800,
        "first step that corrects the poses: before it the scene is too blurred for its pose gradient "
        "to say more than noise; the learning rate decays from here to the last step",
        ge=0,
    )
    lr: LrConfig = _section(LrConfig)


@dataclass
class MultiViewConfig:
    """Multi-view photometric and geometric consistency (PGSR; splat/multiview.py, docs/training.md)."""

    enabled: bool = _f(True, "render a neighbour view each step and add the multi-view terms")
    start: int = _f(
        2500, "step where the multi-view terms start (PGSR: 7k of 30k; here the end of densification)", ge=0
    )
    every: int = _f(2, "from start, the terms (and the neighbour's render) on every n-th step (PGSR: 1)", ge=1)
    neighbour_gradient: bool = _f(
        True,
        "the geometric term's gradient reaches the neighbour's render too (PGSR); false: the neighbour "
        "renders forward only, one backward less a step (loses most of the gain: docs/training.md)",
    )
    neighbour_downscale: int = _f(
        2, "render the neighbour at 1/n of the step's resolution (its depth is all the terms read of it; PGSR: 1)", ge=1
    )
    geo_pixels: int = _f(
        16384, "pixels of the geometric term a step, drawn at random among those covered (0: every one, PGSR)", ge=0
    )
    geo_lambda: float = _f(0.03, "weight of the forward-backward reprojection error (pixels)", ge=0.0)
    ncc_lambda: float = _f(0.15, "weight of 1 - NCC of grey patches warped by the rendered plane", ge=0.0)
    max_angle: float = _f(30.0, "neighbours: viewing directions at most this many degrees apart", gt=0.0, le=180.0)
    min_distance: float = _f(0.01, "neighbours: camera centres more than this x the scene radius apart", ge=0.0)
    max_distance: float = _f(1.5, "neighbours: camera centres less than this x the scene radius apart", gt=0.0)
    max_neighbours: int = _f(8, "neighbours kept per camera (nearest first); one is drawn per step", ge=1)
    patch_size: int = _f(7, "side of the NCC patches in pixels (odd)", ge=3)
    num_pixels: int = _f(4096, "pixels per step whose patches the NCC compares (PGSR: 102,400 of ~2 Mpx, ~5 %)", ge=1)
    pixel_noise: float = _f(1.0, "pixels whose forward-backward error is at least this are left out", gt=0.0)
    min_patch_std: float = _f(0.01, "reference patches whose grey standard deviation is at most this are flat", ge=0.0)


@dataclass
class LossConfig:
    ssim_lambda: float = _f(0.2, "weight of D-SSIM against L1", ge=0.0, le=1.0)
    dist_lambda: float = _f(1000.0, "2DGS depth distortion weight (on m(z), see docs/conventions.md)", ge=0.0)
    dist_from: int = _f(1000, "step where the distortion loss starts", ge=0)
    normal_lambda: float = _f(0.05, "2DGS normal consistency weight", ge=0.0)
    normal_from: int = _f(1500, "step where the normal loss starts", ge=0)
    depth_for_normal: Literal["expected", "median"] = _f(
        "expected", "rendered depth whose screen-space derivatives give the normal consistency's target normals"
    )
    normal_edge_weight: bool = _f(
        False, "weight the normal consistency by (1 - the photo's normalised gradient)^2 (PGSR): less at edges"
    )
    normal_max_bend: float = _f(
        0.0,
        "leave out of the normal consistency pixels whose inverse depth bends by more than this fraction"
        " across one pixel (depth discontinuities, where depth-derived normals are meaningless); 0 = off",
        ge=0.0,
    )
    normal_depth_gradient: bool = _f(
        True, "the normal consistency also moves the depth (2DGS); false: it only turns the surfels"
    )
    multiview: MultiViewConfig = _section(MultiViewConfig)


@dataclass
class StrategyConfig:
    """Densification: ``default`` (splat/strategy/default.py: gsplat's default
    strategy, clone / split / prune) or ``mcmc`` (splat/strategy/mcmc.py:
    3DGS-MCMC, relocation and growth to a budget with position noise; the
    ``mcmc_*`` fields).  Gradients are in normalised-device units, screen sizes
    are fractions of max(width, height), world sizes multiples of the scene
    radius.  docs/training.md says when to pick which."""

    name: Literal["default", "mcmc", "none"] = _f(
        "default",
        "default: 3DGS clone/split/prune; mcmc: 3DGS-MCMC relocation and growth to max_gaussians; none: a fixed set",
    )
    prune_opa: float = _f(0.005, "prune primitives whose opacity is below this", ge=0.0, le=1.0)
    grow_grad2d: float = _f(
        0.0002, "grow (clone or split) primitives whose mean screen-space position gradient exceeds this", ge=0.0
    )
    grow_scale3d: float = _f(
        0.01, "growing primitives with largest scale <= this x scene radius are cloned, larger ones split", ge=0.0
    )
    grow_scale2d: float = _f(
        0.05, "before refine_scale2d_stop, also split primitives larger than this on screen", ge=0.0
    )
    prune_scale3d: float = _f(
        0.1, "after the first opacity reset, prune primitives larger than this x scene radius", ge=0.0
    )
    prune_scale2d: float = _f(
        0.15,
        "after the first opacity reset and before refine_scale2d_stop, prune primitives larger than this on screen",
        ge=0.0,
    )
    refine_scale2d_stop: int = _f(
        0, "step until which the screen-size rules (grow_scale2d, prune_scale2d) apply; 0: never", ge=0
    )
    refine_start: int = _f(
        500, "first step that refines (default: grows and prunes; mcmc: relocates and grows after it)", ge=0
    )
    refine_stop: int = _f(2500, "default strategy: refining and gradient statistics stop at this step", ge=0)
    refine_every: int = _f(
        100, "refine every n steps (default: in [refine_start, refine_stop); mcmc: up to mcmc_refine_stop)", ge=1
    )
    reset_every: int = _f(1000, "clamp opacities to 2 x prune_opa every n steps (0: never)", ge=0)
    pause_refine_after_reset: int = _f(0, "no refining for this many steps after each opacity reset", ge=0)
    max_gaussians: int = _f(
        0,
        "the budget of primitives, from the first step: an initial model above it keeps a keyed random "
        "max_gaussians of its points; default: when growth would exceed it only those with the largest "
        "gradients grow (0: no cap); mcmc: the count it grows to (needs > 0); more than the training "
        "views' pixels is a warning",
        ge=0,
    )
    mcmc_refine_stop: int = _f(
        3333, "mcmc: relocation and growth stop at this step (gsplat: 25,000 of 30,000 steps)", ge=0
    )
    mcmc_min_opacity: float = _f(
        0.005,
        "mcmc: primitives at or below this opacity are relocated; also the floor of a corrected opacity",
        ge=0.0,
        lt=1.0,
    )
    mcmc_noise_lr: float = _f(
        5e5,
        "mcmc: position noise = covariance x N(0, 1) x gate(opacity) x means lr x this, "
        "in a scene scaled to radius 1 as gsplat's (0: none)",
        ge=0.0,
    )
    mcmc_opacity_reg: float = _f(0.01, "mcmc: weight of the mean opacity added to the loss (L1)", ge=0.0)
    mcmc_scale_reg: float = _f(0.01, "mcmc: weight of the mean scale (in scene radii) added to the loss (L1)", ge=0.0)
    verbose: bool = _f(False, "print the counts cloned, split and pruned at each refinement")


@dataclass
class RenderConfig:
    backend: Literal["auto", "cpu", "cuda", "torch"] = _f("auto", "passed to splat.rasterize")
    near: float = _f(0.2, "0 < near < far", gt=0.0)
    far: float = _f(
        100.0,
        "far plane: primitives whose centre is beyond it are culled; the distortion loss "
        "works on m(z), 0 at near and 1 at far",
        gt=0.0,
    )
    depth: Literal["expected", "median"] = _f("expected", "depth written by render.py and used for metrics/mesh")


@dataclass
class EvalConfig:
    """Test-set evaluation (``OUT/metrics.json``, the trainer's ``done:`` line).

    ``masked``: object-centric captures (DTU) hold out views whose table and
    backdrop the training views barely see, so the whole-image PSNR mostly
    measures the background; papers that train DTU with masks report the
    figures inside the object masks.  Definitions (:func:`splat.losses.masked_psnr`,
    :func:`splat.losses.masked_ssim`), with ``m`` the mask's weights in [0, 1]:
    masked PSNR = -10 log10 of the MSE over the pixels inside the mask only,
    ``sum m (render - photo)^2 / (3 sum m)``; masked SSIM = the SSIM map of
    render and photo, both composited over ``data.background`` with ``m`` as
    alpha (as ``data.masks=background`` composites training images), averaged
    over the mask's pixels with weights ``m``.  Each is a mean over the test
    views that have a mask; the whole-image figures are unchanged."""

    masked: Literal["auto", True, False] = _f(
        "auto",
        "also report test PSNR / SSIM inside the object masks (test.psnr_masked, test.ssim_masked; "
        "the whole-image figures are unchanged): PSNR of the MSE over the masked pixels, SSIM map averaged "
        "over them after compositing render and photo over data.background outside the mask. Masks: "
        "transforms.json mask_path, read for the test views whatever data.masks is (other layouts have none). "
        "auto: when a test view has a mask; true: required (an error before training if none has); false: off",
    )


@dataclass
class CheckpointConfig:
    every: int = _f(1000, "steps (0: only at the end); a checkpoint is always written at the end", ge=0)
    keep: int = _f(2, "newest checkpoints of this run kept", ge=1)


@dataclass
class LogConfig:
    progress: Literal["auto", True, False] = _f(
        "auto",
        "auto: a tqdm bar when stderr is a terminal, else plain log lines (logs, nohup, CI, pipes); "
        "true: always the bar; false: always the log lines",
    )
    every: int = _f(10, "progress-bar postfix refresh period (steps)", ge=1)
    interval_s: float = _f(30.0, "without the bar: a log line at most this often (seconds)", ge=0.0)


@dataclass
class DistributedConfig:
    """Training on several processes (``torchrun ... train.py``; docs/distributed.md)."""

    timeout_s: float = _f(
        60.0,
        "a rank that dies or hangs stops the others within about this many seconds, "
        "each with a one-line error naming it (a peer on the same machine: at once); "
        "also how long the ranks wait for each other to start",
        gt=0.0,
    )
    max_imbalance: float = _f(
        0.05,
        "after densification, surfels move between ranks when (largest shard - "
        "smallest) / mean shard exceeds this; they are then balanced to within one",
        ge=0.0,
    )


@dataclass
class SplatConfig:
    seed: int = _f(0, "seeds every RNG", ge=0, le=2**32 - 1)
    device: str = _f("auto", "auto | cpu | cuda | cuda:N", pattern=r"auto|cpu|cuda(:\d+)?")
    data: DataConfig = _section(DataConfig)
    model: ModelConfig = _section(ModelConfig)
    train: TrainConfig = _section(TrainConfig)
    loss: LossConfig = _section(LossConfig)
    strategy: StrategyConfig = _section(StrategyConfig)
    render: RenderConfig = _section(RenderConfig)
    eval: EvalConfig = _section(EvalConfig)
    checkpoint: CheckpointConfig = _section(CheckpointConfig)
    log: LogConfig = _section(LogConfig)
    distributed: DistributedConfig = _section(DistributedConfig)


#: Every config field with its default, as the nested dict ``load_config`` returns.
DEFAULT_CONFIG: Dict = dataclasses.asdict(SplatConfig())


# ------------------------------------------------------------- checking
def _type_name(tp) -> str:
    if typing.get_origin(tp) is Union:
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(_literal_text(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (list, List):
        return f"a list of {typing.get_args(tp)[0].__name__}"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def _literal_text(value) -> str:
    """A Literal choice as YAML spells it: 'auto', true, false."""
    return ("true" if value else "false") if isinstance(value, bool) else repr(value)


def _check_scalar(value, tp, key: str):
    """``value`` converted to ``tp`` (int -> float, '1e-4' -> float), or ConfigError."""
    bad = ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if typing.get_origin(tp) is Literal:
        # Same type and value (True == 1 in Python, but 1 is not a choice of true).
        if any(type(value) is type(a) and value == a for a in typing.get_args(tp)):
            return value
        raise bad
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise bad
    if tp is float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise bad from None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = float(value)
            if not math.isfinite(value):
                raise ConfigError(f"{key}: must be finite, got {value!r}")
            return value
        raise bad
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # e.g. a folder named 2024
        raise bad
    raise TypeError(f"config field {key}: unsupported type {tp}")  # a bug in the declarations


def _check_range(value, meta, key: str) -> None:
    bounds = [
        ("ge", ">=", lambda a, b: a >= b),
        ("gt", ">", lambda a, b: a > b),
        ("le", "<=", lambda a, b: a <= b),
        ("lt", "<", lambda a, b: a < b),
    ]
    for name, _sym, ok in bounds:
        if name in meta and not ok(value, meta[name]):
            lo = [f"{s} {meta[n]}" for n, s, _ in bounds if n in meta]
            raise ConfigError(f"{key}: must be {' and '.join(lo)}, got {value!r}")


def _check_field(value, tp, meta, key: str):
    if typing.get_origin(tp) is Union:
        # A list is checked as the list alternative (its errors name the length or range); anything else
        # must be one of the others.
        alternatives = typing.get_args(tp)
        lists = [a for a in alternatives if typing.get_origin(a) in (list, List)]
        others = [a for a in alternatives if a not in lists]
        if isinstance(value, (list, tuple)) and lists:
            return _check_field(value, lists[0], meta, key)
        for alt in others:
            try:  # a choice ('auto') takes no range; the bounds are the list's
                return (
                    _check_scalar(value, alt, key)
                    if typing.get_origin(alt) is Literal
                    else _check_field(value, alt, meta, key)
                )
            except ConfigError:
                pass
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if typing.get_origin(tp) in (list, List):
        (elem,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
        if "length" in meta and len(value) != meta["length"]:
            raise ConfigError(f"{key}: expected {meta['length']} values, got {len(value)}: {value!r}")
        out = [_check_scalar(v, elem, key) for v in value]
        for v in out:
            _check_range(v, meta, key)
        return out
    value = _check_scalar(value, tp, key)
    if "pattern" in meta and not re.fullmatch(meta["pattern"], value):
        raise ConfigError(f"{key}: expected {meta['doc'] or meta['pattern']}, got {value!r}")
    _check_range(value, meta, key)
    return value


def _check_section(cls, data, prefix: str) -> Dict:
    """Checked copy of the mapping ``data`` against dataclass ``cls``; missing
    fields are errors (``_merge`` fills defaults first)."""
    hints = typing.get_type_hints(cls)
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping of keys, got {data!r}")
    for k in data:
        if k not in hints:
            raise ConfigError(f"unknown config key {prefix + str(k)!r}")
    out = {}
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if f.name not in data:
            raise ConfigError(f"config key {key!r} is missing")
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out[f.name] = _check_section(tp, data[f.name], key + ".")
        else:
            out[f.name] = _check_field(data[f.name], tp, f.metadata, key)
    return out


def check_config(cfg: Dict) -> Dict:
    """A checked, normalised copy of a complete config dict (types converted,
    ranges and cross-field rules checked); raises ConfigError naming the key."""
    out = _check_section(SplatConfig, cfg, "")
    st = out["strategy"]
    if st["name"] == "mcmc" and st["max_gaussians"] <= 0:
        raise ConfigError(
            "strategy.name=mcmc needs strategy.max_gaussians > 0, the number of primitives it grows to "
            "(e.g. strategy.max_gaussians=100000)"
        )
    tr, mv = out["train"], out["loss"]["multiview"]
    if tr["pose_opt"] and tr["pose_opt_from"] >= tr["iterations"]:
        raise ConfigError(
            f"train.pose_opt_from: {tr['pose_opt_from']} is not before the last step "
            f"(train.iterations={tr['iterations']}): the poses would never be corrected"
        )
    if tr["coarse_factor"] & (tr["coarse_factor"] - 1):
        raise ConfigError(f"train.coarse_factor: must be a power of 2 (1, 2, 4, ...), got {tr['coarse_factor']!r}")
    if mv["patch_size"] % 2 == 0:
        raise ConfigError(f"loss.multiview.patch_size: must be odd, got {mv['patch_size']!r}")
    if not mv["min_distance"] < mv["max_distance"]:
        raise ConfigError(
            "loss.multiview.min_distance must be < loss.multiview.max_distance, "
            f"got {mv['min_distance']!r} and {mv['max_distance']!r}"
        )
    r = out["render"]
    if not r["near"] < r["far"]:
        raise ConfigError(f"render.near must be < render.far, got near={r['near']!r}, far={r['far']!r}")
    return out


# ---------------------------------------------------------------- loading
def _parse_value(text: str):
    import yaml

    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text  # e.g. an unbalanced bracket: keep the text, the type check names it


def set_dotted(cfg: Dict, key: str, value) -> None:
    """``set_dotted(cfg, "loss.dist_lambda", 10)``; unknown keys raise
    ConfigError (typos must fail loudly instead of training something else)."""
    parts = key.split(".")
    node = cfg
    for i, p in enumerate(parts[:-1]):
        if p not in node or not isinstance(node[p], dict):
            raise ConfigError(f"unknown config key {'.'.join(parts[: i + 1])!r} (in {key!r})")
        node = node[p]
    if parts[-1] not in node:
        raise ConfigError(f"unknown config key {key!r}")
    if isinstance(node[parts[-1]], dict) and not isinstance(value, dict):
        raise ConfigError(f"config key {key!r} is a section, not a value")
    node[parts[-1]] = value


def _merge(base: Dict, override: Dict, prefix: str = "") -> None:
    for k, v in override.items():
        path = f"{prefix}{k}"
        if k not in base:
            raise ConfigError(f"unknown config key {path!r}")
        if isinstance(base[k], dict):
            if not isinstance(v, dict):
                raise ConfigError(f"config key {path!r} is a section, not a value")
            _merge(base[k], v, path + ".")
        else:
            base[k] = v


def read_yaml(path) -> Dict:
    """The mapping in the YAML file ``path`` (empty file -> {}), or ConfigError."""
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, not a config file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read config file: {e}") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: invalid YAML{line}: {what}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys, got {type(data).__name__}")
    return data


# The configs shipped inside the package (setup.py's package data), so that
# ``--config fast`` works from any folder, without a checkout.
CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def packaged_configs() -> List[str]:
    """Names of the packaged configs (``splat/configs/<name>.yaml``), sorted."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def config_file(name: str) -> str:
    """The YAML file that ``--config name`` means.

    An existing path, or any name with a folder in it, is a file (a missing
    one fails later, in :func:`read_yaml`, naming it).  A bare name that is
    no file here is a packaged config, with or without ``.yaml``
    (``fast``, ``fast.yaml``); anything else raises ConfigError listing the
    packaged names."""
    path = Path(name)
    if path.exists() or path.name != str(name):
        return str(name)
    stem = path.stem if path.suffix in (".yaml", ".yml") else path.name
    if stem in packaged_configs():
        return str(CONFIG_DIR / f"{stem}.yaml")
    raise ConfigError(
        f"config {str(name)!r}: no such file, and no packaged config of that name "
        f"(packaged: {', '.join(packaged_configs())})"
    )


def load_config(path: Optional[str] = None, overrides: Sequence[str] = ()) -> Dict:
    """Defaults <- YAML file (optional) <- ``key=value`` overrides, checked.

    ``path`` is a YAML file or a packaged config's name (:func:`config_file`).
    Raises ConfigError (a ValueError) naming the file or override, the key
    and the value for anything that does not fit the declarations above."""
    cfg = copy.deepcopy(DEFAULT_CONFIG)
    if path is not None:
        path = config_file(path)
        try:
            _merge(cfg, read_yaml(path))
            cfg = check_config(cfg)
        except ConfigError as e:
            msg = str(e)
            raise ConfigError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value")
        key, text = item.split("=", 1)
        try:
            set_dotted(cfg, key.strip(), _parse_value(text.strip()))
            cfg = _check_section(SplatConfig, cfg, "")  # cross-field rules at the end
        except ConfigError as e:
            raise ConfigError(f"override {item!r}: {e}") from None
    return check_config(cfg)


def config_to_yaml(cfg: Dict) -> str:
    import yaml

    return yaml.safe_dump(cfg, sort_keys=False)
