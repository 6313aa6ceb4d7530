"""The one-process parts of multi-process training (issue 23): keyed random
numbers, the balanced partition and its moves, merging and slicing
checkpoints, and the ids densification gives."""

from __future__ import annotations

import warnings

import torch
import torch.distributed

from splat.distributed.group import Group
from splat.distributed.shard import balanced_slice, imbalance, rebalance_plan
from splat.distributed.sharded_model import sum_replicated_gradients
from splat.keyed_random import BACKGROUND_STREAM, SPLIT_STREAM, keyed_normal, keyed_uniform
from splat.state import PrimitiveState


def test_keyed_numbers_depend_on_their_key_only():
    keys = torch.tensor([[7, 3], [7, 4], [8, 3]])
    a = keyed_normal(0, SPLIT_STREAM, keys, 6)
    # The same key gives the same numbers alone, in another order or among others.
    assert torch.equal(keyed_normal(0, SPLIT_STREAM, keys[[2, 0, 1]], 6), a[[2, 0, 1]])
    assert torch.equal(keyed_normal(0, SPLIT_STREAM, keys[1:2], 6), a[1:2])
    # Another seed, stream or key gives other numbers.
    assert not torch.equal(keyed_normal(1, SPLIT_STREAM, keys, 6), a)
    assert not torch.equal(keyed_normal(0, BACKGROUND_STREAM, keys, 6), a)
    assert len({tuple(r.tolist()) for r in a}) == 3


def test_keyed_numbers_have_their_distributions():
    keys = torch.stack([torch.zeros(20000, dtype=torch.int64), torch.arange(20000)], 1)
    u = keyed_uniform(5, SPLIT_STREAM, keys, 1).flatten()
    z = keyed_normal(5, SPLIT_STREAM, keys, 1).flatten()
    assert float(u.min()) >= 0 and float(u.max()) < 1
    # 20k samples: the standard errors are 0.002 (uniform mean) and 0.007 / 0.01 (normal mean / std);
    # the bounds are 5 of them.
    assert abs(float(u.mean()) - 0.5) < 0.01
    assert abs(float(z.mean())) < 0.035 and abs(float(z.std()) - 1) < 0.05
    assert torch.isfinite(z).all()


def test_balanced_partition_and_the_moves_that_restore_it():
    assert [balanced_slice(10, 3, r) for r in range(3)] == [(0, 3), (3, 6), (6, 10)]
    counts = [7, 1, 4]  # 12 rows: balanced is 4, 4, 4
    plans = [rebalance_plan(counts, r) for r in range(3)]
    sends = [p[0] for p in plans]
    assert sends == [[4, 3, 0], [0, 1, 0], [0, 0, 4]]
    for r in range(3):  # what r receives is what the others send it
        assert plans[r][1] == [sends[s][r] for s in range(3)]
        assert sum(plans[r][1]) == 4
    assert imbalance([4, 4, 4]) == 0 and imbalance([7, 1, 4]) == 1.5


def _shard(ids, n_moment_rows=None):
    n = len(ids)
    params = {
        "means": ids[:, None].float().repeat(1, 3),
        "quats": torch.zeros(n, 4),
        "scales": torch.zeros(n, 2),
        "opacities": ids.float(),
        "sh0": torch.zeros(n, 1, 3),
        "shN": torch.zeros(n, 0, 3),
    }
    opt = {
        k: {
            "state": {0: {"step": torch.tensor(5.0), "exp_avg": v * 2, "exp_avg_sq": v * 3}},
            "param_groups": [{"lr": 1.0, "params": [0]}],
        }
        for k, v in params.items()
    }
    return {
        "step": 5,
        "params": params,
        "optimizers": opt,
        "ids": ids,
        "next_id": 100,
        "row_stats": {"grad2d": ids.float() * 10, "count": torch.ones(n), "radii": torch.zeros(n)},
        "strategy": {"stats": {}},
    }


def test_merging_shards_sorts_by_id_and_slicing_keeps_rows_together():
    whole = PrimitiveState.merge([_shard(torch.tensor([4, 0, 9])), _shard(torch.tensor([2, 7]))])
    assert whole["ids"].tolist() == [0, 2, 4, 7, 9] and whole["next_id"] == 100
    assert whole["params"]["opacities"].tolist() == [0, 2, 4, 7, 9]
    assert whole["optimizers"]["means"]["state"][0]["exp_avg"][:, 0].tolist() == [0, 4, 8, 14, 18]
    assert whole["row_stats"]["grad2d"].tolist() == [0, 20, 40, 70, 90]
    part = PrimitiveState.slice(whole, 2, 1)  # rank 1 of 2: rows [2, 5)
    assert part["ids"].tolist() == [4, 7, 9] and part["params"]["means"][:, 0].tolist() == [4, 7, 9]
    assert part["optimizers"]["opacities"]["state"][0]["exp_avg_sq"].tolist() == [12, 21, 27]
    assert part["row_stats"]["grad2d"].tolist() == [40, 70, 90]
    assert part["optimizers"]["opacities"]["state"][0]["step"] == 5


def test_densification_keeps_one_process_rows_in_id_order(tmp_path):
    """Clones and split children get ids above every earlier one, in their
    parents' order, so one process's rows stay sorted by id (the order a
    sharded render draws them in)."""
    from splat.config import DEFAULT_CONFIG
    from splat.model import GaussianModel
    from splat.strategy.default import DefaultStrategy
    from splat.trainer import make_optimizers

    n = 12
    g = torch.Generator().manual_seed(0)
    scales = torch.full((n, 2), -5.0)
    scales[::3] = 0.0  # large: split; the others clone
    model = GaussianModel(
        {
            "means": torch.randn(n, 3, generator=g),
            "quats": torch.randn(n, 4, generator=g),
            "scales": scales,
            "opacities": torch.zeros(n),
            "sh0": torch.zeros(n, 1, 3),
            "shN": torch.zeros(n, 0, 3),
        },
        0,
    )
    opts = make_optimizers(model, DEFAULT_CONFIG["train"]["lr"], 1.0)
    from splat.config import StrategyConfig

    s = DefaultStrategy(StrategyConfig(grow_grad2d=0.0, refine_start=0, refine_every=1), scene_radius=1.0, seed=3)
    s.bind(PrimitiveState(model, opts))
    s._reset_stats(n)
    s.grad2d[::2] = 1.0  # every other surfel grows
    s.count[:] = 1
    s._refine(model, opts, step=1)
    ids = model.ids.tolist()
    assert ids == sorted(ids) and len(set(ids)) == len(ids) == model.num_gaussians
    assert model.next_id == max(ids) + 1
    assert model.num_gaussians == n + 4 + 2  # 4 clones (+1 each), 2 splits (+1 net each)


def test_a_strategy_that_forgets_ids_gets_them_renumbered_on_one_process(tmp_path):
    """A custom strategy editing rows through update_params alone leaves
    model.ids stale; one process numbers the rows afresh and trains on."""
    from test_train import make_tiny_scene, tiny_config

    from splat.strategy import update_params
    from splat.trainer import Trainer

    trainer = Trainer(tiny_config(make_tiny_scene(tmp_path / "scene"), 5, ["strategy.name=none"]), tmp_path / "run")
    try:
        keep = torch.arange(0, trainer.model.num_gaussians, 2)
        update_params(trainer.model, trainer.optimizers, lambda _n, p: p[keep], lambda _k, v: v[keep])
        trainer.state.check_ids(distributed=False)
        assert trainer.model.ids.tolist() == list(range(len(keep))) and trainer.model.next_id == len(keep)
        trainer.train_step(1)
    finally:
        trainer.close()


def test_summed_sparse_gradients_raise_no_torch_warning(monkeypatch):
    """The appearance table's row gradients, summed over ranks (the collectives
    stubbed: one rank's view), stay row-sparse without torch's warning about
    sparse invariant checks on every step."""
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor, *a, **k: None)
    table = torch.nn.Embedding(5, 3, sparse=True)
    table(torch.tensor([3, 1, 3])).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sum_replicated_gradients(table, Group(rank=0, world_size=2, backend="gloo"), sparse=True)
    g = table.weight.grad
    assert g.is_sparse and g.indices()[0].tolist() == [1, 3]
    assert torch.equal(g.to_dense()[[1, 3]], torch.tensor([[1.0] * 3, [2.0] * 3]))
