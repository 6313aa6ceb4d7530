"""Exposure and white balance: a per-image affine colour correction.

Photos taken with a phone's automatic exposure and white balance show one
scene in different colours.  With ``train.appearance=affine`` every train
image ``i`` gets a learned correction applied to the render before the loss::

    rgb'(pixel) = A_i rgb(pixel) + b_i        A_i: 3x3 (starts at I), b_i: 3-vector (starts at 0)

optimised by its own (sparse) Adam at ``train.appearance_lr``.  The surfels then
learn one set of colours for the scene while the corrections absorb each
photo's exposure (a diagonal A_i), white balance (diagonal ratios) and
black level (b_i); the full 3x3 also covers mild colour-matrix differences.
Only differences between images are determined: a correction shared by all
images can move into the surfel colours and back, so A_i and b_i are
meaningful relative to one another (``A_i A_j^-1``), not one by one.

Test images have no learned correction.  The evaluation reports the raw
render (``psnr``) and the render after the closed-form least-squares affine
fit to the test image (``psnr_affine_fit``, :func:`fit_affine`), the number
other appearance-modelling methods report, which leaves out each test
photo's own exposure and white balance.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["AffineAppearance", "make_appearance", "make_optimizer", "fit_affine", "APPEARANCE_MODES"]

APPEARANCE_MODES = ("none", "affine")


class AffineAppearance(nn.Module):
    """Per-image corrections: ``matrix`` [N, 9] (A_i row-major, starts at I)
    and ``offset`` [N, 3] (b_i, starts at 0); see :meth:`matrices`.

    The rows are looked up with sparse gradients, for
    :func:`make_optimizer`'s ``SparseAdam``: a step moves only the image that
    was rendered.  (A dense Adam keeps moving every other image's row along
    its stale momentum for the ~10 steps after each visit, with no gradient
    to stop it; with images visited once per epoch that overshoots and
    oscillates instead of converging.)"""

    def __init__(self, num_images: int):
        super().__init__()
        self.matrix = nn.Parameter(torch.eye(3).reshape(1, 9).repeat(num_images, 1))
        self.offset = nn.Parameter(torch.zeros(num_images, 3))

    @property
    def num_images(self) -> int:
        return int(self.matrix.shape[0])

    def matrices(self) -> torch.Tensor:
        """A_i as [N, 3, 3] (detached)."""
        return self.matrix.detach().reshape(-1, 3, 3)

    def forward(
        self,
        rgb: torch.Tensor,
        index: int,
        alpha: Optional[torch.Tensor] = None,
        background: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """``rgb`` [H, W, 3] as train image ``index`` saw it.

        Without ``alpha``: ``A rgb + b`` on every pixel.  With ``alpha`` [H, W]
        and ``background`` [3] (``rgb`` = scene over background, as
        splat.rasterize composites it): the correction applies to the scene
        only, ``A c + alpha b + (1 - alpha) background`` with ``c = rgb - (1 -
        alpha) background`` the premultiplied scene colour -- a photo's exposure
        changes the photographed scene, not a background colour that the
        loader painted into its masked pixels."""
        i = torch.tensor([int(index)], device=self.matrix.device)
        A = F.embedding(i, self.matrix, sparse=True).reshape(3, 3)
        b = F.embedding(i, self.offset, sparse=True).reshape(3)
        if alpha is None:
            return rgb @ A.T + b
        a = alpha.unsqueeze(-1)  # [H, W, 1]
        bg = background.to(rgb)
        return (rgb - (1 - a) * bg) @ A.T + a * b + (1 - a) * bg


def make_optimizer(appearance: AffineAppearance, lr: float) -> torch.optim.Optimizer:
    """``SparseAdam`` over the corrections: only the rendered image's row moves."""
    return torch.optim.SparseAdam(list(appearance.parameters()), lr=lr)


def make_appearance(
    train_cfg: Dict, num_images: int, device: torch.device | str | None = None
) -> Optional[AffineAppearance]:
    """The correction ``train.appearance`` asks for (None for ``"none"``)."""
    mode = train_cfg["appearance"]
    if mode == "none":
        return None
    if mode == "affine":
        return AffineAppearance(num_images).to(device)
    raise ValueError(f"train.appearance must be one of {APPEARANCE_MODES}, got {mode!r}")


def fit_affine(
    pred: torch.Tensor, target: torch.Tensor, mask: Optional[torch.Tensor] = None
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Least-squares affine colour fit of ``pred`` to ``target`` (both [H, W, 3]).

    Returns ``(fitted, A, b)`` with ``fitted = pred @ A.T + b`` minimising
    ``sum |A pred + b - target|^2`` over the pixels (those with ``mask`` > 0
    if given), solved in float64 (a 4x4 normal-equation system per image:
    closed form, no iterations).  ``fitted`` has ``pred``'s dtype; a
    degenerate ``pred`` (e.g. a flat image) gets the minimum-norm solution.
    """
    X = pred.detach().reshape(-1, 3).double()
    Y = target.detach().reshape(-1, 3).double().to(X.device)
    Xh = torch.cat([X, torch.ones_like(X[:, :1])], dim=1)  # [P, 4]
    if mask is not None:
        keep = mask.reshape(-1).to(X.device) > 0
        Xs, Ys = Xh[keep], Y[keep]
    else:
        Xs, Ys = Xh, Y
    # Solved via the pseudo-inverse of the 4x4 Gram matrix: exact for any full-rank
    # fit and the minimum-norm answer when the render has no colour variation.
    W = torch.linalg.pinv(Xs.T @ Xs) @ (Xs.T @ Ys)  # [4, 3]
    fitted = (Xh @ W).reshape(pred.shape).to(pred.dtype)
    return fitted, W[:3].T.to(pred.dtype), W[3].to(pred.dtype)
