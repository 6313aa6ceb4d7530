"""MCMC densification (issue 40) and the primitive budget of both strategies.

The relocation formulas against a direct evaluation of what the paper asks
of them, the growth count, the budget from step 0, the noise gate and a
surfel's in-plane noise, and whole runs: 1 process against 2, bit for bit,
and a run killed and resumed, bit for bit (the tolerance argument of
tests/test_distributed_train.py: none).
"""

from __future__ import annotations

import math

import pytest
import torch
from test_distributed_train import (
    assert_same_model,
    config as dist_config,
    run,
    scene,  # noqa: F401 (fixture)
)
from test_train import tiny_config

from splat.config import load_config
from splat.errors import ConfigError
from splat.model import create_from_points, logit
from splat.optimizers import make_optimizers
from splat.state import PrimitiveState
from splat.strategy import MCMCStrategy, make_strategy, strategy_config
from splat.strategy.relocation import (
    MAX_COPIES,
    NOISE_CUTOFF,
    keyed_draw,
    noise_factor,
    position_noise,
    relocated_opacity_scale,
)
from splat.training.initial_model import check_budget, within_budget


# ------------------------------------------------------------ the formulas
def _gsplat_denominator(o_new: float, n: int) -> float:
    """The paper's double sum as written (gsplat's relocation kernel's loops)."""
    return sum(
        math.comb(i - 1, k) * (-1) ** k / math.sqrt(k + 1) * o_new ** (k + 1) for i in range(1, n + 1) for k in range(i)
    )


@pytest.mark.parametrize("o", [0.006, 0.1, 0.5, 0.9, 0.999])
def test_relocated_copies_render_as_the_original(o):
    """n copies of the corrected primitive, stacked at its centre, give the
    original's alpha at the centre (opacity) and the original's integral of
    alpha along a line through the centre (scale), as the paper intends;
    and the scale factor is the paper's double sum evaluated directly.

    Tolerances: the centre identity is float64 pow/exp rounding (1e-12);
    the line integral is a trapezoid rule on [-12c, 12c] with 24,001 points,
    whose error for Gaussians is far below 1e-9 (relative); the double sum
    as written loses up to ~1e-13 relative to cancellation for n = 51."""
    ns = torch.tensor([1, 2, 3, 7, 20, MAX_COPIES])
    new_o, new_s = relocated_opacity_scale(torch.full((len(ns),), o, dtype=torch.float64), torch.ones(len(ns), 3), ns)
    for j, n in enumerate(ns.tolist()):
        a, c = float(new_o[j]), float(new_s[j, 0])
        assert abs((1 - (1 - a) ** n) - o) <= 1e-12
        x = torch.linspace(-12 * max(c, 1.0), 12 * max(c, 1.0), 24001, dtype=torch.float64)
        copy_alpha = a * torch.exp(-0.5 * (x / c) ** 2)
        composite = 1 - (1 - copy_alpha) ** n
        want = o * math.sqrt(2 * math.pi)  # the original (scale 1): o * integral of g
        assert abs(float(torch.trapezoid(composite, x)) - want) <= 1e-9 * want, (n, c)
        assert abs(c - o / _gsplat_denominator(a, n)) <= 1e-12 * c
    assert float(new_s[0, 0]) == pytest.approx(1.0, abs=1e-15) and float(new_o[0]) == pytest.approx(o, abs=1e-15)


def test_copies_beyond_the_table_are_clamped():
    o, s = relocated_opacity_scale(torch.tensor([0.5, 0.5]), torch.ones(2, 2), torch.tensor([MAX_COPIES, 500]))
    assert torch.equal(o[0], o[1]) and torch.equal(s[0], s[1])


def test_keyed_draw_follows_the_weights():
    """20,000 draws over weights 1:2:0:5: frequencies within 0.015 of 1/8,
    2/8, 0, 5/8 (binomial sd <= 0.0035: over 4 sd); the same key gives the
    same draws, another key others."""
    w = torch.tensor([1.0, 2.0, 0.0, 5.0], dtype=torch.float64)
    d = keyed_draw(w, 20000, 0, 3, (7, 0))
    freq = torch.bincount(d, minlength=4).double() / 20000
    assert torch.allclose(freq, w / w.sum(), atol=0.015) and freq[2] == 0
    assert torch.equal(d, keyed_draw(w, 20000, 0, 3, (7, 0)))
    assert not torch.equal(d, keyed_draw(w, 20000, 0, 3, (8, 0)))


# ------------------------------------------------------------- the noise
def _rotation_quats(n: int, seed: int = 0) -> torch.Tensor:
    q = torch.randn(n, 4, generator=torch.Generator().manual_seed(seed))
    return q / q.norm(dim=1, keepdim=True)


def test_noise_moves_only_nearly_transparent_primitives():
    """The gate sigmoid(-100 (o - 0.005)) is 1/2 at o = 0.005 and falls
    fast: o = 0.15 moves 1e-6 as far as o = 0.005, and above o = 0.28 (gate below
    NOISE_CUTOFF from 0.282) nothing moves at all."""
    assert float(noise_factor(torch.tensor([0.005]))) == pytest.approx(0.5)
    assert float(noise_factor(torch.tensor([0.29]))) < NOISE_CUTOFF < float(noise_factor(torch.tensor([0.28])))
    n = 6
    opacities = torch.tensor([0.001, 0.005, 0.15, 0.3, 0.9, 0.999])
    d = position_noise(_rotation_quats(n), torch.full((n, 3), 0.1), opacities, torch.arange(n), 5, 1e3, 0, 4)
    size = d.norm(dim=1)
    assert (size[:2] > 1e-3).all() and (size[3:] == 0).all()
    assert 0 < size[2] < 1e-3 * size[1]


def test_surfel_noise_stays_in_its_plane_and_follows_the_covariance():
    """A surfel's covariance has no extent along its normal (column 2 of its
    rotation): its noise is orthogonal to the normal to float64 rounding
    (1e-12 of its size), a 3D Gaussian's is not; and the noise of a 3D
    Gaussian is Sigma z: R^T d / (s^2 gate scaler) is the keyed z, for every
    row, whatever the rotation (1e-9: float64 rounding)."""
    n = 200
    quats = _rotation_quats(n, 1)
    scales2 = torch.rand(n, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64) + 0.1
    opac = torch.full((n,), 0.001)
    ids = torch.arange(n)
    from splat.geometry import quat_to_rotmat

    R = quat_to_rotmat(quats.double())
    normals = R[:, :, 2]
    d2 = position_noise(quats, scales2, opac, ids, 3, 1.0, 0, 4)
    along = (d2 * normals).sum(-1).abs()
    assert (along <= 1e-12 * d2.norm(dim=1)).all()
    scales3 = torch.cat([scales2, scales2[:, :1]], dim=1)
    d3 = position_noise(quats, scales3, opac, ids, 3, 1.0, 0, 4)
    assert (d3 * normals).sum(-1).abs().mean() > 0.1 * d3.norm(dim=1).mean()
    # The in-plane parts agree: a surfel's noise is the 3D Gaussian's with the normal variance dropped.
    z = torch.einsum("nji,nj->ni", R, d3) / (scales3**2 * noise_factor(opac)[:, None])
    z2 = torch.einsum("nji,nj->ni", R, d2)[:, :2] / (scales2**2 * noise_factor(opac)[:, None])
    assert torch.allclose(z[:, :2], z2, rtol=1e-9, atol=0)


# ----------------------------------------------------- strategy on a model
def _model(opacities, primitive="2dgs", device="cpu"):
    n = len(opacities)
    g = torch.Generator().manual_seed(0)  # orientations too: a model per device must be the same model
    points, colors = torch.rand(n, 3, generator=g), torch.rand(n, 3, generator=g)
    model = create_from_points(points, colors, 0, generator=g, primitive=primitive)
    with torch.no_grad():
        model.params["opacities"].copy_(logit(torch.tensor(opacities, dtype=torch.float32)))
    model.to(device)
    optimizers = make_optimizers(model, load_config()["train"]["lr"], 1.0)
    for p in model.params.values():  # one Adam step: non-zero moments
        p.grad = torch.ones_like(p)
    for opt in optimizers.values():
        opt.step()
    return model, optimizers


def _mcmc(max_gaussians, **kw):
    cfg = strategy_config(dict(name="mcmc", max_gaussians=max_gaussians, refine_start=0, refine_every=10, **kw))
    return make_strategy(cfg, 1.0)


@pytest.mark.parametrize("primitive", ["2dgs", "3dgs"])
def test_relocation_moves_dead_rows_onto_live_ones(primitive):
    opac = [0.001, 0.5, 0.003, 0.9, 0.2, 0.004]
    model, optimizers = _model(opac, primitive)
    before = {k: v.detach().clone() for k, v in model.params.items()}
    strategy = _mcmc(6, mcmc_noise_lr=0.0)
    strategy.step_post_backward(model, optimizers, None, 10)
    assert model.num_gaussians == 6 and strategy.stats == {"relocated": 3, "added": 0}
    dead, live = [0, 2, 5], [1, 3, 4]
    o = model.opacities.detach()
    assert (o > 0.005).all()
    # Each dead row is a copy of a live one (same mean, colours, rotation, opacity, scales).
    for d in dead:
        src = [j for j in live if torch.equal(model.params["means"][d], before["means"][j])]
        assert len(src) == 1
        for k in model.params:
            assert torch.equal(model.params[k][d], model.params[k][src[0]]), k
    # Drawn sources got their shares; undrawn live rows are untouched; touched rows' moments are zero.
    state = PrimitiveState(model, optimizers)
    for j in live:
        drawn = sum(torch.equal(model.params["means"][d], before["means"][j]) for d in dead)
        if drawn:
            want_o, want_s = relocated_opacity_scale(
                torch.sigmoid(before["opacities"][j : j + 1].double()),
                torch.exp(before["scales"][j : j + 1].double()),
                torch.tensor([drawn + 1]),
            )
            assert float(o[j]) == pytest.approx(float(want_o), rel=1e-6)
            assert torch.allclose(model.scales[j].double(), want_s[0], rtol=1e-6)
            assert all(float(v[j].abs().sum()) == 0 for v in state.moments("opacities").values())
        else:
            assert all(torch.equal(model.params[k][j], before[k][j]) for k in model.params)
            assert all(float(v[j].abs().sum()) > 0 for v in state.moments("opacities").values())
    assert all(float(v[dead].abs().sum()) == 0 for v in state.moments("means").values())


def test_growth_is_five_percent_up_to_the_budget_with_new_ids():
    model, optimizers = _model([0.5] * 100)
    strategy = _mcmc(108, mcmc_noise_lr=0.0)
    strategy.step_post_backward(model, optimizers, None, 10)
    assert model.num_gaussians == 105  # int(1.05 * 100)
    assert torch.equal(model.ids, torch.arange(105))
    strategy.step_post_backward(model, optimizers, None, 15)  # not a refine step
    assert model.num_gaussians == 105
    strategy.step_post_backward(model, optimizers, None, 20)
    assert model.num_gaussians == 108  # min(108, int(1.05 * 105) = 110)
    state = PrimitiveState(model, optimizers)
    assert all(float(v[100:].abs().sum()) == 0 for v in state.moments("means").values())
    # Each new row copies a source that now shares its opacity with it.
    for j in range(100, 108):
        same = (model.params["means"][:100] == model.params["means"][j]).all(dim=1).nonzero()
        o = model.opacities.detach()
        assert len(same) == 1 and float(o[j]) == float(o[same[0, 0]]) < 0.5


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@needs_gpu
@pytest.mark.parametrize("primitive", ["2dgs", "3dgs"])
def test_mcmc_moves_on_cuda_match_the_cpu(primitive):
    """Relocation, growth and noise on CUDA tensors make the CPU's moves: the
    same ids and parameters to float32 rounding (rtol 1e-5: the GPU's Adam
    step and transcendental functions round differently; the keyed draws
    are the same unless a uniform lands within ~1e-7 of a CDF step)."""
    opac = [0.001, 0.5, 0.003, 0.9, 0.2, 0.004] * 20
    results = []
    for device in ("cpu", "cuda"):
        model, optimizers = _model(opac, primitive, device)
        strategy = _mcmc(130)
        for step in (10, 20):
            strategy.step_post_backward(model, optimizers, None, step)
        results.append((model.ids.clone(), {k: v.detach().cpu() for k, v in model.params.items()}))
    (ids_cpu, cpu), (ids_gpu, gpu) = results
    assert torch.equal(ids_cpu, ids_gpu) and len(ids_cpu) == 130
    for k in cpu:
        assert torch.allclose(cpu[k], gpu[k], rtol=1e-5, atol=1e-6), k


def test_regularisers_are_means_over_every_primitive():
    model, _ = _model([0.2, 0.4])
    loss = _mcmc(10, mcmc_opacity_reg=0.5, mcmc_scale_reg=0.25).loss(model)
    want = 0.5 * model.opacities.mean() + 0.25 * model.scales.mean()
    assert float(loss.detach()) == pytest.approx(float(want.detach()), rel=1e-6)
    assert make_strategy(strategy_config({}), 1.0).loss(model) is None
    # in scene radii: the same regulariser in a scene 4 x larger is a quarter per world unit
    cfg = strategy_config(dict(name="mcmc", max_gaussians=10, mcmc_opacity_reg=0.0, mcmc_scale_reg=0.25))
    loss4 = make_strategy(cfg, 4.0).loss(model)
    assert float(loss4.detach()) == pytest.approx(0.25 * float(model.scales.mean().detach()) / 4.0, rel=1e-6)


@pytest.mark.parametrize("primitive", ["2dgs", "3dgs"])
def test_the_noise_scales_with_the_scene(primitive):
    """The same scene in units c times larger (means, scales, radius and the
    means' learning rate, which the trainer scales by the radius) moves by c
    times as much: gsplat's noise in a scene of radius 1, whatever the unit."""
    moves = {}
    for c in (1.0, 7.0):
        torch.manual_seed(0)  # the same model twice (its rotations come from the global generator)
        model, optimizers = _model([0.01, 0.02, 0.004, 0.5], primitive)
        with torch.no_grad():
            model.params["means"].mul_(c)
            model.params["scales"].add_(math.log(c))  # log-scales
        for g in optimizers["means"].param_groups:
            g["lr"] = 1e-3 * c
        strategy = make_strategy(strategy_config(dict(name="mcmc", max_gaussians=4, refine_start=100)), c)
        before = model.means.detach().clone()
        strategy.step_post_backward(model, optimizers, None, 5)
        moves[c] = (model.means.detach() - before).double()
    assert moves[1.0].abs().max() > 0
    torch.testing.assert_close(moves[7.0], 7.0 * moves[1.0], rtol=1e-4, atol=0)


# ---------------------------------------------------------------- budget
def test_mcmc_needs_a_budget():
    with pytest.raises(ConfigError, match="strategy.max_gaussians"):
        load_config(None, ["strategy.name=mcmc"])
    with pytest.raises(ValueError, match="max_gaussians"):
        MCMCStrategy(strategy_config({"name": "mcmc"}))


def test_budget_subsample_is_keyed_and_only_when_over():
    assert within_budget(100, 0, 0) is None and within_budget(100, 100, 0) is None
    keep = within_budget(1000, 300, 0)
    assert len(keep) == 300 and torch.equal(keep, torch.sort(keep).values) and len(set(keep.tolist())) == 300
    assert torch.equal(keep, within_budget(1000, 300, 0)) and not torch.equal(keep, within_budget(1000, 300, 1))


def test_a_budget_beyond_the_pixels_is_one_warning(capsys):
    class Frame:
        width, height = 10, 10

    class Scene:
        train = [Frame(), Frame()]

    assert check_budget(200, Scene()) and capsys.readouterr().err == ""
    assert not check_budget(201, Scene())
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "strategy.max_gaussians=201" in err and "200 pixels" in err


@pytest.mark.parametrize("name,primitive", [("default", "2dgs"), ("mcmc", "2dgs"), ("mcmc", "3dgs")])
def test_the_budget_holds_from_the_first_step(scene, tmp_path, name, primitive):  # noqa: F811
    """The tiny scene starts from 300 points; a budget of 200 keeps 200
    from step 0 (the main branch started at 300 and stayed there)."""
    from splat.trainer import Trainer

    extra = [f"strategy.name={name}", f"model.primitive={primitive}", "strategy.max_gaussians=200"]
    cfg = tiny_config(scene, 40, extra + ["strategy.refine_start=5"])
    counts = []
    trainer = Trainer(cfg, tmp_path / "run", callbacks=[lambda t, s, terms: counts.append(t.model.num_gaussians)])
    assert trainer.model.num_gaussians == 200
    trainer.train()
    assert max(counts) <= 200


# -------------------------------------------------------- whole runs
MCMC = [
    "strategy.name=mcmc",
    "strategy.refine_start=5",
    "strategy.mcmc_refine_stop=110",
    "strategy.mcmc_min_opacity=0.02",  # relocations happen in 120 steps
    "strategy.mcmc_noise_lr=5e6",  # noise large enough to move bits
]


def test_mcmc_on_two_processes_and_resumed_is_the_one_process_model(scene, tmp_path):  # noqa: F811
    """120 steps, batch of 3: relocation and growth from 300 to the budget, 450; on two
    processes, and stopped at 75 (checkpoint at 60) then resumed on 1, the
    model is bitwise the one-process model."""
    cfg = dist_config(scene, 120, MCMC + ["checkpoint.every=60"])
    one = run(1, cfg, tmp_path / "one")[0]
    assert one["counts"][-1] == 450 and len(set(one["counts"])) > 5
    two = run(2, cfg, tmp_path / "two")
    assert two[0]["counts"] == one["counts"]
    assert_same_model(two[0], one)
    assert run(1, cfg, tmp_path / "stopped", stop_at=75)[0]["stopped"]
    resumed = run(1, cfg, tmp_path / "stopped", resume=True)[0]
    assert resumed["counts"] == one["counts"][60:]
    assert_same_model(resumed, one)
