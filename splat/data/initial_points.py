"""Initial points for training, from the best sources a scene offers,
judged by how much of the training views they cover, and combined.

::

    from splat.data.initial_points import initial_points
    start = initial_points(scene, "auto", num_stereo=20000, num_random=10000)
    start.points, start.colors      # [M, 3], [M, 3] in [0, 1]
    start.description               # "476 triangulated + 20,000 stereo + 3,573 random + 13,197 far points
                                    #  (coverage 29 % -> 64 % -> 72 % -> 99 %; 47 s)"

Sources (``model.init``):

``points``       the scene's own point cloud (COLMAP ``points3D``, a
                 ``transforms.json`` ``ply_file_path``);
``triangulate``  SIFT matches triangulated with the known poses (pycolmap,
                 :mod:`splat.data.triangulate`);
``stereo``       plane-sweep stereo (:mod:`splat.data.stereo_points`);
``random``       photo-consistent random points (:mod:`splat.data.random_points`).

``auto`` starts from the scene's points, else the triangulated ones, and
measures their **coverage**.  A few hundred SIFT points cover a textured
object and leave an untextured floor, the walls and the sky empty; a start
like that trains floaters and streaks there.  While the
coverage is below :data:`FILL_BELOW`, the next source -- stereo, then
random, then the far sphere (:mod:`splat.data.far_points`: a sky or a
distant backdrop, which no other source reaches) -- adds its points **only
where the current set leaves the views uncovered**, so a good source is
never thrown away for a worse one.

Coverage of a point set: each training view is cut into square cells,
:data:`COVERAGE_CELLS` across the width.  A cell is covered when some point
in front of the camera projects into it or into one of its 8 neighbours
(occlusion is ignored: cheap, and an upper bound).  Only cells that hold
content count: not those the render's background colour already
reproduces (every pixel within :data:`BACKGROUND_TOLERANCE`), and where the
image has alpha or a loss mask, only those whose mean is at least 0.5.
The coverage is the mean over views of the covered fraction of counted cells.

Initial size: the 3DGS rule (a surfel's scale is the mean distance to its 3
nearest points) gives an isolated point of a sparse cloud a disc tens of
pixels wide.  ``model.init_max_scale_px`` can bound each scale to that many
pixels at the point's depth (the median over the views that see it of
``z / f``, :func:`pixel_footprint`; applied by
:func:`splat.training.initial_model.initial_model`); the default, 0, keeps the 3DGS
rule: the wide discs of the isolated points are what first covers the table
and backdrop of an object capture that the points miss, and a 10-pixel bound
cost held-out views 1.7 dB there (``docs/results.md``, "Scenes without SfM
points").
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from ..errors import ConfigError, SplatInputError
from ..geometry import in_image, project_points

if TYPE_CHECKING:
    from .types import SceneData

__all__ = [
    "InitialPoints",
    "initial_points",
    "coverage",
    "uncovered_filter",
    "pixel_footprint",
    "hole_cells",
    "thin_to_cells",
    "COVERAGE_CELLS",
    "FILL_SPACING_CELLS",
    "FILL_BELOW",
    "MIN_INIT_POINTS",
    "INIT_MODES",
]

INIT_MODES = ("auto", "points", "triangulate", "stereo", "random")
#: Cells across the width of a view when measuring coverage (~5 px at 256 px,
#: 17 px at 800 px); with the 3x3 neighbourhood a point covers ~1/16 of the width.
COVERAGE_CELLS = 48
#: A pixel within this of the background colour (in [0, 1], every channel) is background.
BACKGROUND_TOLERANCE = 2.0 / 255.0
#: ``auto`` adds the next source while the coverage is below this.  Not 1:
#: a view's thin strips (silhouettes, the far edge of a floor) are left to
#: densification, which grows into them within a few hundred steps.
FILL_BELOW = 0.9
#: Plane-sweep stereo when it only fills holes: half the resolution, half
#: the reference views and half the depth planes of a full run (~16x
#: fewer plane evaluations, for nearly the same coverage: figures in
#: ``docs/results.md``), since densification refines a start anyway.
FILL_STEREO = dict(width=128, max_references=12, num_depths=64)
#: ``auto`` thins each filling source to one point per cube this many
#: coverage cells wide at the point's depth (:func:`thin_to_cells`;
#: ``model.init_fill_spacing``, this by default).  A point covers its cell
#: and the 8 around it, so one per cell keeps the coverage (still_life: 98 %
#: both ways) while a dense source's 20,000 stereo points, a few pixels
#: apart, would start the training with more surfels than it ends with, and
#: be slower throughout.
FILL_SPACING_CELLS = 1.0
#: Fewer points than this from a forced source (``triangulate``, ``stereo``)
#: is not a start: fall back to the next source.
MIN_INIT_POINTS = 100


@dataclass
class InitialPoints:
    """A start: ``points`` [M, 3], ``colors`` [M, 3] in [0, 1], a one-line
    ``description`` and the ``coverage`` after each source that was used."""

    points: torch.Tensor
    colors: torch.Tensor
    description: str
    coverage: List[float]


# ---------------------------------------------------------------- coverage
def _grid(frame) -> Tuple[int, int, float]:
    """(rows, columns, cell size in pixels) of a frame's coverage grid."""
    cell = frame.width / COVERAGE_CELLS
    return max(1, int(math.ceil(frame.height / cell))), COVERAGE_CELLS, cell


def _counted_cells(frame, background: Optional[torch.Tensor]) -> torch.Tensor:
    """[rows, cols] bool: the cells with content: alpha / loss-mask mean
    >= 0.5 where the frame has them, and some pixel off the ``background``
    colour [3] by more than :data:`BACKGROUND_TOLERANCE` (a cell the render's
    background already reproduces needs no surfel)."""
    rows, cols, _ = _grid(frame)
    counted = torch.ones(rows, cols, dtype=torch.bool)
    for m in (frame.mask, frame.loss_mask):
        if m is not None:
            counted &= F.adaptive_avg_pool2d(m.float()[None, None], (rows, cols))[0, 0] >= 0.5
    if background is not None:
        off = (frame.image.float() - background.float().view(1, 1, 3)).abs().amax(-1)  # [H, W]
        counted &= F.adaptive_max_pool2d(off[None, None], (rows, cols))[0, 0] > BACKGROUND_TOLERANCE
    return counted


#: Points projected at once per view: [views, points] projections of
#: 100k random candidates in 60 views are 150 MB of temporaries otherwise.
PROJECT_POINT_VIEWS = 1 << 20


def _chunk(frames: Sequence) -> int:
    """Points per chunk when projecting into every frame (PROJECT_POINT_VIEWS)."""
    return max(256, PROJECT_POINT_VIEWS // max(1, len(frames)))


def _cell_index(points: torch.Tensor, frames: Sequence):
    """Per view: (rows, cols, in-view mask [M], row [M], col [M]) of each point's cell."""
    V = torch.stack([f.viewmat for f in frames]).float()  # [C, 4, 4]
    Ks = torch.stack([f.K for f in frames]).float()  # [C, 3, 3]
    uv, z = project_points(points.float(), V, Ks)  # [C, M, 2], [C, M]
    out = []
    for c, f in enumerate(frames):
        rows, cols, cell = _grid(f)
        u, v = uv[c, :, 0], uv[c, :, 1]
        inside = in_image(uv[c], z[c], f.width, f.height)
        i = (v / cell).floor().clamp(0, rows - 1).long()
        j = (u / cell).floor().clamp(0, cols - 1).long()
        out.append((rows, cols, inside, i, j))
    return out


def covered_cells(points: torch.Tensor, frames: Sequence) -> List[torch.Tensor]:
    """Per view, [rows, cols] bool: cells within one cell of a projected point."""
    hits = [torch.zeros(_grid(f)[:2]) for f in frames]
    for part in points.split(_chunk(frames)):
        for g, (_rows, _cols, inside, i, j) in zip(hits, _cell_index(part, frames)):
            g[i[inside], j[inside]] = 1.0
    return [F.max_pool2d(g[None, None], 3, stride=1, padding=1)[0, 0] > 0 for g in hits]


def coverage(points: torch.Tensor, frames: Sequence, background: Optional[torch.Tensor] = None) -> float:
    """Mean over ``frames`` of the fraction of content cells that ``points``
    [M, 3] cover (see the module doc; ``background`` [3]: the render's
    background colour, whose cells count as covered).  In [0, 1]."""
    if len(frames) == 0:
        return 0.0
    fractions = []
    for f, cov in zip(frames, covered_cells(points, frames)):
        counted = _counted_cells(f, background)
        n = int(counted.sum())
        fractions.append(float((cov & counted).sum()) / n if n else 1.0)
    return sum(fractions) / len(fractions)


def hole_cells(points: torch.Tensor, frames: Sequence, background: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
    """Per view, [rows, cols] bool: the content cells ``points`` [M, 3] leave uncovered."""
    return [~cov & _counted_cells(f, background) for f, cov in zip(frames, covered_cells(points, frames))]


def uncovered_filter(
    points: torch.Tensor, frames: Sequence, background: Optional[torch.Tensor] = None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A predicate on candidate points [K, 3] -> [K] bool: True where a
    candidate projects into a content cell that ``points`` leave uncovered,
    in at least one view."""
    holes = hole_cells(points, frames, background)

    def in_a_hole(cands: torch.Tensor) -> torch.Tensor:
        hit = torch.zeros(len(cands), dtype=torch.bool)
        for start in range(0, len(cands), _chunk(frames)):
            part = slice(start, start + _chunk(frames))
            for hole, (_rows, _cols, inside, i, j) in zip(holes, _cell_index(cands[part], frames)):
                hit[part] |= inside & hole[i, j]
        return hit

    return in_a_hole


def pixel_footprint(points: torch.Tensor, frames: Sequence) -> torch.Tensor:
    """World size of one pixel at each point, ``z / f``: the median over the
    views that see it (``f`` = geometric mean of fx, fy); over every view
    in front of it for points no view sees, and +inf for points behind all.  [M]"""
    V = torch.stack([f.viewmat for f in frames]).float()
    Ks = torch.stack([f.K for f in frames]).float()
    W = torch.tensor([f.width for f in frames], dtype=torch.float32)[:, None]
    H = torch.tensor([f.height for f in frames], dtype=torch.float32)[:, None]
    focal = torch.sqrt(Ks[:, 0, 0] * Ks[:, 1, 1])[:, None]  # [C, 1]
    out = []
    for part in points.float().split(_chunk(frames)):
        uv, z = project_points(part, V, Ks)  # [C, m, 2], [C, m]
        ahead = z > 1e-6
        seen = in_image(uv, z, W, H)
        use = torch.where(seen.any(0, keepdim=True), seen, ahead)
        size = torch.where(use, z / focal, torch.full_like(z, float("nan")))
        out.append(torch.nan_to_num(size.nanmedian(dim=0).values, nan=float("inf")))
    return torch.cat(out) if out else torch.zeros(0)


def thin_to_cells(points: torch.Tensor, frames: Sequence, spacing_cells: float = FILL_SPACING_CELLS) -> torch.Tensor:
    """[M] bool: which of ``points`` [M, 3] to keep so that at most one lies in
    each cube of a grid about ``spacing_cells`` coverage cells wide at its
    depth (cell size from :func:`pixel_footprint` and the median view width).

    The cube side is rounded to a power of two, so points at similar depths
    share one grid; the first point of each cube is kept (sources list their
    best points first).  Points no view sees in front are kept."""
    M = len(points)
    keep = torch.zeros(M, dtype=torch.bool)
    if M == 0:
        return keep
    width = float(torch.tensor([float(f.width) for f in frames]).median())
    side = pixel_footprint(points, frames) * (spacing_cells * width / COVERAGE_CELLS)  # [M]
    finite = torch.isfinite(side) & (side > 0)
    keep[~finite] = True
    idx = torch.nonzero(finite)[:, 0]
    if len(idx) == 0:
        return keep
    level = torch.round(torch.log2(side[idx].double()))  # power-of-two cube sides
    ijk = torch.floor(points[idx].double() / torch.exp2(level)[:, None]).long()
    key = torch.cat([level.long()[:, None], ijk], dim=1)
    _, group = torch.unique(key, dim=0, return_inverse=True)
    first = torch.full((int(group.max()) + 1,), len(idx), dtype=torch.long)
    first = first.scatter_reduce(0, group, torch.arange(len(idx)), reduce="amin")
    keep[idx[first]] = True
    return keep


# ---------------------------------------------------------------- sources
def _log(msg: str) -> None:
    print(f"init: {msg}", file=sys.stderr, flush=True)


def _triangulated(frames, cache_dir, required: bool):
    """(points, colours) or None: pycolmap is absent (an error when ``required``)."""
    from .triangulate import pycolmap_available, triangulate_scene

    if not pycolmap_available():
        if required:
            raise ConfigError(
                "model.init=triangulate needs pycolmap: pip install pycolmap (or pip install -e '.[sfm]')"
            )
        _log("no point cloud and pycolmap is not installed (pip install pycolmap): using plane-sweep stereo")
        return None
    _log(f"triangulating the {len(frames)} training images with their known poses (pycolmap; cached)")
    return triangulate_scene(frames, cache_dir=cache_dir)


def _stereo(frames, n: int, allowed=None, **settings):
    from .stereo_points import stereo_points

    return stereo_points(frames, n, allowed=allowed, **settings)


def _random(frames, n: int, min_views: float, allowed=None):
    from .random_points import photo_consistent_points

    return photo_consistent_points(frames, n, min_views=min_views, allowed=allowed)


def _no_shared_view_error(frames, min_views: float) -> SplatInputError:
    """Why no source found a point: the cameras' geometry, named."""
    centers = torch.stack([f.camera_center for f in frames]).double()
    spread = float((centers - centers.mean(0)).norm(dim=1).max())
    if spread <= 1e-9 * max(1.0, float(centers.norm(dim=1).max())):
        return SplatInputError(
            f"initialisation found no points: all {len(frames)} training cameras sit at one point, so "
            "nothing can be triangulated; check the poses (a panorama cannot be trained)"
        )
    return SplatInputError(
        f"initialisation found no points: no region is seen by {math.ceil(min_views * len(frames))} "
        f"of the {len(frames)} training cameras (model.init_random_min_views={min_views}); the cameras "
        "share no view: check the poses (facing apart? a wrong axis convention?)"
    )


def _fmt(n: int) -> str:
    return f"{n:,}"


def initial_points(
    scene: SceneData,
    init: str,
    num_stereo: int,
    num_random: int,
    random_min_views: float = 0.5,
    fill_spacing: float = FILL_SPACING_CELLS,
    cache_dir: Optional[Union[str, Path]] = None,
    scene_name: str = "the scene",
    background: Optional[torch.Tensor] = None,
) -> InitialPoints:
    """The start for ``model.init=init`` (see the module doc).

    Args:
        scene: a :class:`splat.data.SceneData`; its ``train`` frames are used.
        init: one of :data:`INIT_MODES`.
        num_stereo: at most this many plane-sweep stereo points.
        num_random: random points (``auto`` adds this many times the
            uncovered fraction).
        random_min_views: random candidates must be in view of this fraction of the cameras.
        fill_spacing: ``auto`` thins each filling source with
            :func:`thin_to_cells` at this spacing (coverage cells); 0 keeps every point.
        cache_dir: triangulation cache (None: the default).
        scene_name: how errors name the scene (its folder).
        background: [3] the render's background colour: cells of that colour
            need no points (see :func:`coverage`).

    Raises:
        SplatInputError: ``points`` without a point cloud; nothing found
            (naming the cameras' geometry as the cause).
        ConfigError: ``triangulate`` without pycolmap.
    """
    if init not in INIT_MODES:
        raise ValueError(f"init must be one of {INIT_MODES}, got {init!r}")
    frames = scene.train
    has_points = scene.points is not None and len(scene.points) > 0
    if init == "points" and not has_points:
        raise SplatInputError(f"model.init=points but {scene_name} has no point cloud")
    empty = torch.zeros(0, 3)
    t0 = time.perf_counter()
    parts = []  # (points, colours, label)

    if init in ("points", "auto") and has_points:
        parts.append((scene.points.float(), scene.point_colors.float(), "scene"))
    elif init in ("triangulate", "auto"):
        found = _triangulated(frames, cache_dir, required=init == "triangulate")
        if found is not None and len(found[0]) >= (1 if init == "auto" else MIN_INIT_POINTS):
            parts.append((found[0], found[1], "triangulated"))
        elif found is not None:
            _log(f"triangulation found only {len(found[0])} points: using plane-sweep stereo")
            init = "stereo"
    if init == "stereo":
        pts, cols = _stereo(frames, num_stereo)
        if len(pts) >= MIN_INIT_POINTS:
            parts.append((pts, cols, "stereo"))
        else:
            _log(f"plane-sweep stereo found only {len(pts)} points: using random points")
            init = "random"
    if init == "random":
        pts, cols = _random(frames, num_random, random_min_views)
        if len(pts):
            parts.append((pts, cols, "random"))

    def current():
        if not parts:
            return empty, empty
        return torch.cat([p for p, _, _ in parts]), torch.cat([c for _, c, _ in parts])

    covs = [coverage(current()[0], frames, background)]
    if init == "auto":
        for source in ("stereo", "random", "far"):
            if covs[-1] >= FILL_BELOW:
                break
            have = current()[0]
            allowed = uncovered_filter(have, frames, background) if len(have) else None
            if source == "stereo":
                pts, cols = _stereo(frames, num_stereo, allowed=allowed, **FILL_STEREO)
            elif source == "far":
                from .far_points import far_points

                pts, cols = far_points(frames, hole_cells(have, frames, background))
            else:
                n = int(math.ceil(num_random * (1.0 - covs[-1])))
                pts, cols = _random(frames, n, random_min_views, allowed=allowed)
            if fill_spacing > 0:
                thin = thin_to_cells(pts, frames, fill_spacing)
                pts, cols = pts[thin], cols[thin]
            if len(pts) == 0:
                continue
            parts.append((pts, cols, source))
            covs.append(coverage(current()[0], frames, background))

    pts, cols = current()
    if len(pts) == 0 and num_random <= 0:
        raise SplatInputError(
            f"model.init_num_random={num_random}: no surfels to train ({scene_name} has "
            "no point cloud and no other source found points)"
        )
    if len(pts) == 0:
        raise _no_shared_view_error(frames, random_min_views)
    counts = " + ".join(f"{_fmt(len(p))} {label}" for p, _, label in parts)
    if len(parts) == 1 and parts[0][2] == "scene":
        counts = f"the scene's {_fmt(len(pts))}"
    cov_text = " -> ".join(f"{100 * c:.0f} %" for c in covs)
    desc = f"{counts} points (coverage {cov_text}; {time.perf_counter() - t0:.0f} s)"
    return InitialPoints(
        points=pts.contiguous(),
        colors=cols.clamp(0, 1).contiguous(),
        description=desc,
        coverage=covs,
    )
