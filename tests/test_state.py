"""The table of per-primitive state (splat/state.py): every row edit moves
parameters, Adam moments, ids and registered statistics together."""

from __future__ import annotations

import pytest
import torch

from splat.errors import RunStateError
from splat.model import GaussianModel
from splat.state import PrimitiveState


def _table(n: int = 5) -> PrimitiveState:
    rows = torch.arange(n, dtype=torch.float32)
    model = GaussianModel(
        {
            "means": rows[:, None].repeat(1, 3),
            "quats": torch.ones(n, 4),
            "scales": torch.zeros(n, 2),
            "opacities": rows.clone(),
            "sh0": torch.zeros(n, 1, 3),
            "shN": torch.zeros(n, 0, 3),
        },
        0,
    )
    opts = {k: torch.optim.Adam([p], lr=1e-3) for k, p in model.params.items()}
    for p in model.params.values():
        p.grad = torch.ones_like(p)
    for o in opts.values():
        o.step()  # moments exist
    for k, p in model.params.items():  # values and moments that tell the rows apart
        with torch.no_grad():
            p.copy_(rows.view(-1, *[1] * (p.dim() - 1)).expand_as(p))
        opts[k].state[p]["exp_avg"] = rows.view(-1, *[1] * (p.dim() - 1)).expand_as(p).clone()
    state = PrimitiveState(model, opts)
    state.register("hits")
    state.set_stat("hits", rows * 10)
    return state


def _aligned(state: PrimitiveState) -> None:
    """Every row's parameter, moment and statistic still name its id (rows were 0..n-1)."""
    ids = state.ids.float()
    assert torch.equal(state.model.params["opacities"].detach(), ids)
    assert torch.equal(state.moments("means")["exp_avg"][:, 0], ids)
    assert torch.equal(state.stat("hits"), ids * 10)
    for name, p in state.model.params.items():
        assert state.optimizers[name].param_groups[0]["params"][0] is p
        assert state.moments(name)["exp_avg"].shape == p.shape


def test_keep_take_append_keep_rows_together():
    state = _table(5)
    state.keep(torch.tensor([True, False, True, True, False]))
    assert state.ids.tolist() == [0, 2, 3]
    _aligned(state)
    copies = state.take(torch.tensor([2, 0]))
    assert copies["ids"].tolist() == [3, 0] and copies["stat/hits"].tolist() == [30, 0]
    state.append(copies)  # the same ids again: exact copies
    assert state.ids.tolist() == [0, 2, 3, 3, 0]
    _aligned(state)
    new = {k: v for k, v in state.take(torch.tensor([0])).items() if k.startswith("param/")}
    state.append(new)  # no ids: the next free one; no moments or statistics: zeros
    assert state.ids.tolist()[-1] == 5 and state.next_id == 6
    assert state.stat("hits")[-1] == 0 and not state.moments("means")["exp_avg"][-1].any()
    for p in state.model.params.values():  # Adam still steps the new parameters
        p.grad = torch.ones_like(p)
    for o in state.optimizers.values():
        o.step()


def test_rows_and_set_rows_round_trip_and_stale_statistics():
    state = _table(4)
    rows = state.rows()
    assert set(rows) >= {"ids", "param/means", "moment/means/exp_avg", "moment/means/exp_avg_sq", "stat/hits"}
    assert "moment/means/step" not in rows  # scalar state is shared, not a row
    order = torch.tensor([3, 1, 0, 2])
    state.set_rows({k: v[order] for k, v in rows.items()})
    assert state.ids.tolist() == [3, 1, 0, 2]
    _aligned(state)
    state.register("late")  # registered, never set: stale, not moved, not saved
    assert state.stat("late") is None and "stat/late" not in state.rows()
    assert "late" not in state.state_dict()["row_stats"]


def test_state_dict_merge_and_slice():
    state = _table(4)
    sd = state.state_dict()
    sd["optimizers"] = {k: o.state_dict() for k, o in state.optimizers.items()}
    a = PrimitiveState.slice(sd, 2, 0)
    b = PrimitiveState.slice(sd, 2, 1)
    assert a["ids"].tolist() == [0, 1] and b["row_stats"]["hits"].tolist() == [20, 30]
    whole = PrimitiveState.merge([b, a])  # any order: sorted by id
    assert whole["ids"].tolist() == [0, 1, 2, 3]
    assert torch.equal(whole["params"]["means"], sd["params"]["means"])
    assert torch.equal(
        whole["optimizers"]["means"]["state"][0]["exp_avg"], sd["optimizers"]["means"]["state"][0]["exp_avg"]
    )
    fresh = _table(4)
    fresh.set_stat("hits", None)
    fresh.load_state_dict(whole)
    _aligned(fresh)


def test_check_ids_renumbers_on_one_process_and_stops_on_several():
    state = _table(5)
    state.edit_params(lambda _n, p: p[:3], lambda _k, v: v[:3])  # rows edited without their ids
    with pytest.raises(RunStateError, match="without their ids"):
        state.check_ids(distributed=True)
    state.check_ids(distributed=False)
    assert state.ids.tolist() == [0, 1, 2] and state.next_id == 3
    assert state.stat("hits") is None  # left stale by the edit
