"""Adam for per-image rows: each row keeps its own step count.

A per-image parameter (a train camera's pose correction) gets a gradient
only when its image is drawn, about once per epoch.  ``torch.optim.SparseAdam``
updates only those rows' moments but counts steps per tensor, so its bias
correction is that of the whole run: a row drawn k times by global step
t >> k moves by about lr (1 - β1^k) / sqrt(1 - β2^k), 3.2 lr at k = 1 and
up to 6.5 lr near k = 10 (β = 0.9, 0.999), instead of Adam's lr.  With the
pose correction that made the first updates of every camera several times the
intended rotation, larger than the error being corrected.

:class:`RowAdam` is Adam applied to each row as if that row alone were
optimised, on the steps that touch it: for a row i with gradient g_i at its
k-th touch,

    m_i <- β1 m_i + (1 - β1) g_i,   v_i <- β2 v_i + (1 - β2) g_i^2
    x_i <- x_i - lr (m_i / (1 - β1^k)) / (sqrt(v_i / (1 - β2^k)) + eps)

so a consistent gradient moves a row by lr per touch from the first.  Rows a
step does not touch keep their value and moments.  Gradients may be sparse
(``F.embedding(..., sparse=True)``) or dense; a dense gradient's rows that are
exactly zero count as untouched.
"""

from __future__ import annotations

from typing import Iterable

import torch

__all__ = ["RowAdam"]


class RowAdam(torch.optim.Optimizer):
    """Row-wise Adam (module doc) over 2-D parameters [rows, cols]."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        if not lr > 0:
            raise ValueError(f"RowAdam: lr must be positive, got {lr}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(f"RowAdam: parameters must be [rows, cols], got shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    grad = p.grad.coalesce()
                    rows, values = grad.indices()[0], grad.values()  # [k], [k, cols]
                else:
                    rows = p.grad.ne(0).any(1).nonzero()[:, 0]
                    values = p.grad[rows]
                if rows.numel() == 0:
                    continue
                state = self.state[p]
                if not state:
                    state["steps"] = torch.zeros(p.shape[0], dtype=torch.int64, device=p.device)  # [rows]
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["steps"][rows] += 1
                k = state["steps"][rows].to(p.dtype)[:, None]  # [k, 1]
                m = state["exp_avg"][rows].mul_(beta1).add_(values, alpha=1 - beta1)
                v = state["exp_avg_sq"][rows].mul_(beta2).addcmul_(values, values, value=1 - beta2)
                state["exp_avg"][rows] = m
                state["exp_avg_sq"][rows] = v
                m_hat = m / (1 - beta1**k)
                v_hat = v / (1 - beta2**k)
                p[rows] -= group["lr"] * m_hat / (v_hat.sqrt() + group["eps"])
        return loss
