"""``model.init=auto`` judges a start by its coverage of the training views
and fills what a sparse point set leaves empty (issue 26); initial surfels
are bounded to a few pixels.

The fixture is the failure case of issue 26 in miniature: textured spheres
(where SIFT finds its few hundred points) on an untextured floor, seen from
a ring of cameras.  The scene's own point cloud is deliberately sparse: a
few dozen points on the spheres only, nothing on the floor.
"""

from __future__ import annotations

import math

import pytest
import torch

import splat
from splat.config import load_config
from splat.data.initial_points import (
    COVERAGE_CELLS,
    coverage,
    initial_points,
    pixel_footprint,
    thin_to_cells,
    uncovered_filter,
)
from splat.data.types import Frame, SceneData
from splat.errors import SplatInputError
from splat.geometry import knn_mean_distance
from splat.testing import intrinsics, look_at_viewmat, surface_scene
from splat.trainer import Trainer
from splat.training.initial_model import initial_model

W, H = 96, 72
N_VIEWS = 16
FLOOR_GREY = 0.55


def _teacher() -> dict:
    """surface_scene's geometry, opaque: a plain grey floor (no texture for
    stereo or SIFT) and spheres with a blotchy Voronoi texture."""
    t = surface_scene(20000, W, H, seed=3)
    t["opacities"] = torch.full_like(t["opacities"], 0.95)
    t["scales"] = t["scales"] * 1.3
    floor = t["means"][:, 1] == 0
    g = torch.Generator().manual_seed(4)
    centres = t["means"][~floor][torch.randperm(int((~floor).sum()), generator=g)[:80]]
    palette = torch.rand(80, 3, generator=g)
    colors = palette[torch.cdist(t["means"], centres).argmin(1)]
    t["colors"] = torch.where(floor[:, None], torch.full_like(colors, FLOOR_GREY), colors)
    t["floor"] = floor
    return t


def _scene(t: dict, points: torch.Tensor, colors: torch.Tensor) -> SceneData:
    K = intrinsics(W, H, 55.0, dtype=torch.float32)
    train, test = [], []
    for i in range(N_VIEWS):
        a = 2 * math.pi * (i + 0.5) / N_VIEWS
        V = look_at_viewmat((3.0 * math.cos(a), -2.6, 3.0 * math.sin(a)), (0.0, -0.2, 0.0), dtype=torch.float32)
        with torch.no_grad():
            out = splat.rasterize(
                t["means"],
                t["quats"],
                t["scales"],
                t["opacities"],
                t["colors"],
                V,
                K,
                W,
                H,
                background=torch.ones(3),
                backend="cpu",
            )
        f = Frame(
            stem=f"v{i:02d}",
            image_path=None,
            image=out.rgb.clamp(0, 1).contiguous(),
            mask=None,
            viewmat=V,
            K=K.clone(),
            width=W,
            height=H,
        )
        (test if i % 4 == 0 else train).append(f)
    return SceneData(train=train, test=test, points=points, point_colors=colors, layout="colmap")


@pytest.fixture(scope="module")
def teacher():
    return _teacher()


@pytest.fixture(scope="module")
def sparse(teacher):
    """40 points on the spheres only: what SIFT gives on a textured object over a plain floor."""
    g = torch.Generator().manual_seed(5)
    idx = torch.nonzero(~teacher["floor"])[:, 0]
    pick = idx[torch.randperm(len(idx), generator=g)[:40]]
    return _scene(teacher, teacher["means"][pick].clone(), teacher["colors"][pick].clone())


@pytest.fixture(scope="module")
def dense(teacher, sparse):
    """1,500 points over every surface, floor included: the start auto should match."""
    g = torch.Generator().manual_seed(6)
    pick = torch.randperm(len(teacher["means"]), generator=g)[:1500]
    return SceneData(
        train=sparse.train,
        test=sparse.test,
        points=teacher["means"][pick].clone(),
        point_colors=teacher["colors"][pick].clone(),
        layout="colmap",
    )


def test_coverage_tells_a_sparse_start_from_a_dense_one(sparse, dense):
    """The spheres fill about a third of the views, the floor the rest of
    what is not background (white, as the render's)."""
    white = torch.ones(3)
    low, high = coverage(sparse.points, sparse.train, white), coverage(dense.points, dense.train, white)
    assert coverage(dense.points, dense.train) < high - 0.1  # counting the background cells too
    assert low < 0.5, low
    assert high > 0.9, high
    assert coverage(torch.zeros(0, 3), sparse.train) == 0.0


def test_uncovered_filter_accepts_only_the_holes(sparse, dense):
    in_hole = uncovered_filter(sparse.points, sparse.train, torch.ones(3))
    assert not in_hole(sparse.points).any()  # a point never lies in a hole it covers itself
    floor_far = torch.tensor([[1.8, 0.0, 1.8], [-1.8, 0.0, -1.8]])
    assert in_hole(floor_far).all()


def test_pixel_footprint_is_depth_over_focal():
    """A point on the axis of every camera at depth z: footprint z / f exactly."""
    K = intrinsics(W, H, 55.0, dtype=torch.float32)
    frames = []
    for z in (2.0, 3.0, 7.0):  # median over the three views: 3 / f
        V = torch.eye(4)
        V[2, 3] = z
        frames.append(
            Frame(stem="a", image_path=None, image=torch.zeros(H, W, 3), mask=None, viewmat=V, K=K, width=W, height=H)
        )
    fp = pixel_footprint(torch.zeros(1, 3), frames)
    assert float(fp[0]) == pytest.approx(3.0 / float(K[0, 0]), rel=1e-6)
    behind = pixel_footprint(torch.tensor([[0.0, 0.0, -10.0]]), frames)
    assert math.isinf(float(behind[0]))


def test_thinning_keeps_one_point_per_cell_and_the_coverage(dense):
    """8 jittered copies of every dense point (what a stereo source gives):
    thinning keeps the first point of each cube, no two kept points share a
    cube, and the coverage stays that of the whole set."""
    g = torch.Generator().manual_seed(7)
    copies = dense.points.repeat(8, 1)
    copies[len(dense.points) :] += 0.002 * torch.randn(copies[len(dense.points) :].shape, generator=g)
    keep = thin_to_cells(copies, dense.train)
    kept = copies[keep]
    assert len(kept) < 0.5 * len(copies), len(kept)
    white = torch.ones(3)
    assert coverage(kept, dense.train, white) >= coverage(copies, dense.train, white) - 0.02
    # One kept point per cube, and it is the cube's first (originals come
    # before their copies): cube keys recomputed here from their definition.
    side = pixel_footprint(copies, dense.train) * (W / COVERAGE_CELLS)
    level = torch.round(torch.log2(side.double()))
    key = torch.cat([level[:, None], torch.floor(copies.double() / torch.exp2(level)[:, None])], 1)
    _, cube = torch.unique(key, dim=0, return_inverse=True)
    assert torch.equal(torch.bincount(cube[keep], minlength=int(cube.max()) + 1), (torch.bincount(cube) > 0).long())
    first = torch.full((int(cube.max()) + 1,), len(copies)).scatter_reduce(0, cube, torch.arange(len(copies)), "amin")
    assert torch.equal(torch.nonzero(keep)[:, 0], first.sort().values)
    assert not thin_to_cells(torch.zeros(0, 3), dense.train).any()


def test_auto_fills_the_holes_and_says_what_it_combined(sparse, tmp_path):
    start = initial_points(
        sparse, "auto", num_stereo=5000, num_random=3000, cache_dir=tmp_path, background=torch.ones(3)
    )
    assert start.coverage[0] < 0.5 and start.coverage[-1] > start.coverage[0] + 0.3, start.coverage
    assert start.description.startswith("40 scene + "), start.description
    assert "coverage" in start.description and "->" in start.description
    # The scene's own points are kept, first, untouched.
    assert torch.equal(start.points[:40], sparse.points)
    # model.init_fill_spacing=0 keeps every filling point: more of them, no more coverage.
    whole = initial_points(
        sparse, "auto", num_stereo=5000, num_random=3000, cache_dir=tmp_path, background=torch.ones(3), fill_spacing=0.0
    )
    assert len(whole.points) > len(start.points) + 40, (len(whole.points), len(start.points))
    assert start.coverage[-1] >= whole.coverage[-1] - 0.03, (start.coverage, whole.coverage)


def test_initial_scales_are_bounded_in_pixels_only_when_asked(sparse, tmp_path):
    """The 40 isolated points' 3DGS sizes reach ~10-25 px at 96 px wide: kept
    by default (model.init_max_scale_px=0), and at most the bound with one."""
    start = initial_points(sparse, "points", num_stereo=0, num_random=0)
    pixel_sizes = pixel_footprint(start.points, sparse.train)
    knn_px = knn_mean_distance(sparse.points) / pixel_sizes
    bound = 8.0
    assert float(knn_px.max()) > bound  # the fixture does exercise the bound
    background = torch.ones(3)
    base = ["model.init=points", "log.progress=false", "checkpoint.every=0"]
    for px in (0.0, bound):
        cfg = load_config("configs/fast.yaml", [*base, f"model.init_max_scale_px={px}"])
        model = initial_model(cfg, sparse, background)
        got = model.scales.detach().max(dim=1).values / pixel_sizes
        if px == 0:
            torch.testing.assert_close(got, knn_px * cfg["model"]["init_scale"], rtol=1e-4, atol=0)
        else:
            assert float(got.max()) <= bound * (1 + 1e-5), float(got.max())
            assert float(got.max()) >= bound * (1 - 1e-5)  # the largest ones sit on it


def test_no_shared_view_names_the_cameras_not_the_random_budget():
    K = intrinsics(W, H, 55.0, dtype=torch.float32)
    same_point = [
        Frame(
            stem=f"v{i}",
            image_path=None,
            image=torch.rand(H, W, 3),
            mask=None,
            viewmat=look_at_viewmat((0.0, 0.0, 0.0), (math.cos(i), 0.0, math.sin(i)), dtype=torch.float32),
            K=K,
            width=W,
            height=H,
        )
        for i in range(6)
    ]
    scene = SceneData(train=same_point, test=[], points=None, point_colors=None, layout="colmap")
    with pytest.raises(SplatInputError, match="all 6 training cameras sit at one point"):
        initial_points(scene, "random", num_stereo=100, num_random=500)
    apart = [
        Frame(
            stem=f"v{i}",
            image_path=None,
            image=torch.rand(H, W, 3),
            mask=None,
            viewmat=look_at_viewmat(
                (3 * math.cos(a), 0.0, 3 * math.sin(a)), (6 * math.cos(a), 0.0, 6 * math.sin(a)), dtype=torch.float32
            ),
            K=K,
            width=W,
            height=H,
        )
        for i, a in enumerate(torch.linspace(0, 2 * math.pi, 7)[:-1].tolist())
    ]
    scene = SceneData(train=apart, test=[], points=None, point_colors=None, layout="colmap")
    with pytest.raises(SplatInputError, match="share no view"):
        initial_points(scene, "random", num_stereo=100, num_random=500)


def _train(scene, tmp_path, name, init):
    over = [
        f"model.init={init}",
        "train.iterations=600",
        "train.coarse_factor=1",  # the start is measured: every step at full resolution, as its thresholds were
        "log.progress=false",
        "model.sh_degree=0",
        "model.init_num_random=3000",
        "model.init_num_stereo=5000",
        "strategy.refine_start=100",
        "strategy.refine_stop=450",
        "loss.dist_from=100000",
        "loss.normal_from=100000",
        "checkpoint.every=0",
        f"data.cache_dir={tmp_path / 'cache'}",
    ]
    cfg = load_config("configs/fast.yaml", over)
    return Trainer(cfg, tmp_path / name, scene=scene).train()["test.psnr"]


def test_auto_from_a_sparse_cloud_trains_as_well_as_a_dense_start(sparse, dense, tmp_path):
    """600 steps, PSNR on the 4 held-out views.  The sparse points alone
    (``model.init=points``) leave the floor to densification and end far
    below the dense start (measured 20.2 against 29.9 dB); ``auto`` fills
    the floor and must end within MARGIN_DB of the dense start (measured
    26.7 dB).  Why a margin of several dB: the floor is untextured, so no
    photometric source (stereo, photo-consistent random points) can place
    points on it; the fill puts them at random depths along the right rays
    (median 1.3 units off a 4-unit floor) and 600 steps do not finish pulling
    them in.  The guard is the gap: the old ``auto`` took the sparse start
    as it was and sits ~10 dB below."""
    MARGIN_DB = 4.5
    dense_db = _train(dense, tmp_path, "dense", "points")
    sparse_db = _train(sparse, tmp_path, "sparse", "points")
    auto_db = _train(sparse, tmp_path, "auto", "auto")
    assert sparse_db < dense_db - 1.5 * MARGIN_DB, (sparse_db, dense_db)  # the guard can fail
    assert auto_db >= dense_db - MARGIN_DB, (auto_db, dense_db, sparse_db)
