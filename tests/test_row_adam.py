"""RowAdam (splat/row_adam.py): each row moves as a dense Adam on that row
alone, on the steps that touch it."""

import copy

import pytest
import torch
import torch.nn.functional as F

from splat.row_adam import RowAdam


def _schedule(steps, rows, seed):
    """Which row each step touches (rows visited unevenly) and its gradient."""
    g = torch.Generator().manual_seed(seed)
    touched = torch.randint(0, rows, (steps,), generator=g)
    grads = torch.randn(steps, 3, generator=g, dtype=torch.float64)
    return touched, grads


def _run_row_adam(init, touched, grads, lr, sparse):
    x = torch.nn.Parameter(init.clone())
    opt = RowAdam([x], lr=lr)
    for i, gv in zip(touched.tolist(), grads):
        if sparse:
            F.embedding(torch.tensor([i]), x, sparse=True)[0].mul(gv).sum().backward()
        else:
            x.grad = torch.zeros_like(x)
            x.grad[i] = gv
        opt.step()
        opt.zero_grad()
    return x.detach(), opt


@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])
def test_each_row_moves_as_a_dense_adam_on_that_row_alone(sparse):
    rows, lr = 5, 0.01
    touched, grads = _schedule(40, rows, seed=1)
    init = torch.randn(rows, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    got, _ = _run_row_adam(init, touched, grads, lr, sparse)
    for r in range(rows):
        y = torch.nn.Parameter(init[r].clone())
        adam = torch.optim.Adam([y], lr=lr)
        for i, gv in zip(touched.tolist(), grads):
            if i == r:
                y.grad = gv.clone()
                adam.step()
        # Same formula, same order of float64 operations up to Adam's eps placement: 1e-12 is rounding only.
        torch.testing.assert_close(got[r], y.detach(), rtol=0, atol=1e-12)


def test_first_touch_moves_by_lr_not_a_multiple():
    """SparseAdam's tensor-wide step count makes a row's first touch at global
    step t >> 1 move by ~3.2 lr; RowAdam's moves by lr (a consistent sign)."""
    x = torch.nn.Parameter(torch.zeros(100, 2, dtype=torch.float64))
    opt = RowAdam([x], lr=0.5)
    for i in range(100):
        F.embedding(torch.tensor([i]), x, sparse=True)[0].sum().backward()
        opt.step()
        opt.zero_grad()
    torch.testing.assert_close(x.detach(), torch.full((100, 2), -0.5, dtype=torch.float64), rtol=0, atol=1e-6)


def test_untouched_rows_keep_value_and_moments():
    x = torch.nn.Parameter(torch.ones(4, 2))
    opt = RowAdam([x], lr=0.1)
    F.embedding(torch.tensor([1]), x, sparse=True).sum().backward()
    opt.step()
    state = opt.state[x]
    assert state["steps"].tolist() == [0, 1, 0, 0]
    assert torch.equal(x.detach()[[0, 2, 3]], torch.ones(3, 2))
    assert torch.equal(state["exp_avg"][[0, 2, 3]], torch.zeros(3, 2))


def test_state_dict_round_trip_resumes_bitwise():
    touched, grads = _schedule(30, 4, seed=3)
    init = torch.zeros(4, 3, dtype=torch.float64)
    whole, _ = _run_row_adam(init, touched, grads, 0.02, sparse=True)
    half, opt = _run_row_adam(init, touched[:13], grads[:13], 0.02, sparse=True)
    saved = copy.deepcopy(opt.state_dict())
    x = torch.nn.Parameter(half.clone())
    resumed = RowAdam([x], lr=0.02)
    resumed.load_state_dict(saved)
    for i, gv in zip(touched[13:].tolist(), grads[13:]):
        F.embedding(torch.tensor([i]), x, sparse=True)[0].mul(gv).sum().backward()
        resumed.step()
        resumed.zero_grad()
    assert torch.equal(x.detach(), whole)


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ValueError, match="lr must be positive"):
        RowAdam([torch.nn.Parameter(torch.zeros(2, 2))], lr=0)
    with pytest.raises(ValueError, match=r"\[rows, cols\]"):
        RowAdam([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
