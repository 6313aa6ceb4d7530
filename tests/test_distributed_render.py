"""Surfels sharded over processes (splat.distributed, issue 23): the exchange,
the sharded render against one process, and float64 finite differences
through a two-process render.  gloo on local processes, as torchrun starts
them (splat/distributed/local.py).

Tolerances:
* the sharded render against one process (float64): 1e-12 of each
  tensor's largest magnitude.  Each camera rasterizes the same records in
  the same (global id) order, so the kernels' work is identical; what may
  differ is the projection's matmuls over differently sized shards (BLAS
  blocking) and the order in which a surfel's per-camera gradients are
  summed: rounding only, ~1e-16 relative, so 1e-12 leaves room without
  hiding a lost or doubled row (which changes gradients at O(1));
* finite differences: test_finite_differences.py's h = 1e-6 and
  |analytic - numeric| <= 1e-6 + 1e-5 |analytic|, for the same reasons.
"""

from __future__ import annotations

import torch

from splat.distributed import Camera, Group, camera_rank, exchange_counts, exchange_rows, render_sharded
from splat.distributed.local import run_ranks
from splat.testing import look_at_viewmat, random_scene

PARAMS = ("means", "quats", "scales", "opacities", "colors")
OUTPUTS = ("rgb", "alpha", "depth", "median_depth", "normal", "distortion")
H_STEP, ATOL, RTOL = 1e-6, 1e-6, 1e-5


def scene_and_cameras(n, width, height, n_cameras, seed=3):
    """A random scene and ``n_cameras`` views of it: its own camera, then
    cameras moved around it (float64)."""
    s = random_scene(n, width, height, seed=seed, principal_offset=(4.3, -3.1), aspect=1.15)
    cams = [Camera(s["viewmat"], s["K"], width, height, torch.tensor([0.3, 0.1, 0.8], dtype=torch.float64))]
    eye = torch.linalg.inv(s["viewmat"])[:3, 3]
    for k in range(1, n_cameras):
        moved = eye + torch.tensor([0.15 * k, -0.1 * k, 0.05 * k], dtype=torch.float64)
        cams.append(Camera(look_at_viewmat(tuple(moved.tolist()), (0.0, 0.0, 0.0)), s["K"], width, height, None))
    return s, cams


def weights_for(out, index):
    g = torch.Generator().manual_seed(100 + index)
    return {k: torch.rand(getattr(out, k).shape, generator=g, dtype=torch.float64) - 0.3 for k in OUTPUTS}


def local_loss(r):
    loss = r.anchor
    for i, out in r.outputs.items():
        w = weights_for(out, i)
        loss = loss + sum((getattr(out, k) * w[k]).sum() for k in OUTPUTS)
    return loss


def shard(group, n):
    ids = torch.arange(n)
    return ids[ids % group.world_size == group.rank]


def render_and_differentiate(group, n, width, height, n_cameras):
    """One rank's part: render the batch from its shard, backward; returns
    outputs, parameter gradients, means2d gradients and radii, keyed by ids."""
    s, cams = scene_and_cameras(n, width, height, n_cameras)
    ids = shard(group, n)
    p = {k: s[k][ids].clone().requires_grad_(True) for k in PARAMS}
    r = render_sharded(**p, ids=ids, cameras=cams, group=group)
    local_loss(r).backward()
    return {
        "ids": ids,
        "outputs": {i: {k: getattr(o, k).detach() for k in OUTPUTS} for i, o in r.outputs.items()},
        "grads": {k: v.grad for k, v in p.items()},
        "means2d": [h.grad for h in r.means2d],
        "radii": r.radii,
        "bytes_sent": r.bytes_sent,
    }


def exchange_and_differentiate(group):
    """Rank r sends r + d + 1 rows to rank d, row values naming (source, destination, row)."""
    world, rank = group.world_size, group.rank
    send_counts = [rank + d + 1 for d in range(world)]
    rows = torch.cat(
        [torch.tensor([[rank, d, j] for j in range(c)], dtype=torch.float64) for d, c in enumerate(send_counts)]
    ).requires_grad_(True)
    recv_counts = exchange_counts(send_counts, group)
    got = exchange_rows(rows, send_counts, recv_counts, group)
    weights = (got.detach() * torch.tensor([100.0, 10.0, 1.0], dtype=torch.float64)) + rank  # receiver-specific
    (got * weights).sum().backward()
    return {"recv_counts": recv_counts, "got": got.detach(), "sent": rows.detach(), "grad": rows.grad}


def test_exchange_moves_rows_and_returns_gradients_to_their_rows(tmp_path):
    world = 3
    results = run_ranks(exchange_and_differentiate, world, tmp_path)
    for rank, res in enumerate(results):
        assert res["recv_counts"] == [s + rank + 1 for s in range(world)]
        expect = torch.cat(
            [torch.tensor([[s, rank, j] for j in range(s + rank + 1)], dtype=torch.float64) for s in range(world)]
        )
        assert torch.equal(res["got"], expect)
        # Row (rank, d, j) was weighted by rank d as value * (100, 10, 1) + d.
        sent = res["sent"]
        assert torch.equal(res["grad"], sent * torch.tensor([100.0, 10.0, 1.0], dtype=torch.float64) + sent[:, 1:2])


def assemble(results, n):
    """Per-surfel tensors of all ranks put back in global order."""
    grads = {k: torch.zeros((n,) + tuple(results[0]["grads"][k].shape[1:]), dtype=torch.float64) for k in PARAMS}
    n_cams = len(results[0]["means2d"])
    means2d = [torch.zeros(n, 2, dtype=torch.float64) for _ in range(n_cams)]
    radii = [torch.zeros(n, dtype=torch.int32) for _ in range(n_cams)]
    outputs = {}
    for res in results:
        ids = res["ids"]
        for k in PARAMS:
            grads[k][ids] = res["grads"][k]
        for c in range(n_cams):
            means2d[c][ids] = res["means2d"][c]
            radii[c][ids] = res["radii"][c]
        outputs.update(res["outputs"])
    return outputs, grads, means2d, radii


def close(a, b, what, tol=1e-12):
    scale = max(float(b.abs().max()), 1e-30)
    err = float((a - b).abs().max()) / scale
    assert err <= tol, f"{what}: differs by {err:.3g} of its largest magnitude"


def test_sharded_render_matches_one_process_on_two_and_three(tmp_path):
    """4 cameras (not a multiple of 3) over 2 and 3 ranks, every output and
    every gradient (means2d included) against the one-process run."""
    n, width, height, n_cameras = 30, 40, 30, 4
    one = assemble([render_and_differentiate(Group(), n, width, height, n_cameras)], n)
    for world in (2, 3):
        results = run_ranks(render_and_differentiate, world, tmp_path / str(world), n, width, height, n_cameras)
        for rank, res in enumerate(results):  # each camera rendered by its rank only
            assert sorted(res["outputs"]) == [i for i in range(n_cameras) if camera_rank(i, world) == rank]
        many = assemble(results, n)
        for i in range(n_cameras):
            for k in OUTPUTS:
                close(many[0][i][k], one[0][i][k], f"{world} ranks, camera {i}, {k}")
        for k in PARAMS:
            close(many[1][k], one[1][k], f"{world} ranks, d/d{k}")
        for c in range(n_cameras):
            close(many[2][c], one[2][c], f"{world} ranks, camera {c}, means2d.grad")
            assert torch.equal(many[3][c], one[3][c])
        assert all(res["bytes_sent"] > 0 for res in results)


def test_sharded_render_with_one_process_is_splat_rasterize():
    n, width, height = 30, 40, 30
    s, cams = scene_and_cameras(n, width, height, 1)
    r = render_sharded(*(s[k] for k in PARAMS), ids=torch.arange(n), cameras=cams, group=Group())
    import splat

    ref = splat.rasterize(
        *(s[k] for k in PARAMS), cams[0].viewmat, cams[0].K, width, height, background=cams[0].background, backend="cpu"
    )
    for k in OUTPUTS:
        close(getattr(r.outputs[0], k), getattr(ref, k), k)
    assert torch.equal(r.radii[0], ref.radii) and r.bytes_sent == 0


def finite_differences_on_two_ranks(group, n, width, height):
    """Analytic gradients of this rank's parameters, and central differences
    of the loss summed over both ranks, each rank perturbing its own rows
    while both render every time."""
    import torch.distributed as dist

    s, cams = scene_and_cameras(n, width, height, 2)
    ids = shard(group, n)
    p = {k: s[k][ids].clone().requires_grad_(True) for k in PARAMS}
    local_loss(render_sharded(**p, ids=ids, cameras=cams, group=group)).backward()
    analytic = {k: v.grad.clone() for k, v in p.items()}

    def total():
        with torch.no_grad():
            value = local_loss(render_sharded(**p, ids=ids, cameras=cams, group=group)).reshape(1)
        dist.all_reduce(value)
        return float(value)

    numeric = {k: torch.zeros_like(v) for k, v in p.items()}
    for k in PARAMS:
        width_k = s[k][0].numel()
        for j in range(n):  # every rank walks every surfel: the renders are collectives
            row = int((ids == j).nonzero().flatten()[0]) if bool((ids == j).any()) else None
            for c in range(width_k):
                values = []
                for sign in (1.0, -1.0):
                    if row is not None:
                        with torch.no_grad():
                            p[k].view(len(ids), -1)[row, c] += sign * H_STEP
                    values.append(total())
                    if row is not None:
                        with torch.no_grad():
                            p[k].view(len(ids), -1)[row, c] -= sign * H_STEP
                if row is not None:
                    numeric[k].view(len(ids), -1)[row, c] = (values[0] - values[1]) / (2 * H_STEP)
    return {"analytic": analytic, "numeric": numeric}


def test_finite_differences_through_a_two_process_render(tmp_path):
    """Every parameter of every surfel, with the two cameras rendered on
    different ranks, so each gradient crosses the exchange both ways."""
    results = run_ranks(finite_differences_on_two_ranks, 2, tmp_path, 12, 24, 17)
    for rank, res in enumerate(results):
        for k in PARAMS:
            a, num = res["analytic"][k], res["numeric"][k]
            bad = (a - num).abs() > ATOL + RTOL * a.abs()
            assert not bool(bad.any()), f"rank {rank} d/d{k}: max |diff| {float((a - num).abs().max()):.3g}"
            assert float(a.abs().max()) > 0  # something was differentiated
