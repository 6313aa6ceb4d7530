"""Neighbour views for the multi-view consistency terms (``loss.multiview``).

A train camera's neighbours are the other train cameras that look in about
the same direction from about the same place, so that most of what one sees
the other sees too (PGSR's selection, Chen et al. 2024): camera j is a
neighbour of camera i when

    angle(z_i, z_j) < max_angle            z: the viewing direction, R^T (0, 0, 1)
    min_distance < |C_i - C_j| < max_distance     C = -R^T t, the camera centre

nearest centres first (ties: smaller angle first), at most ``max_count``.
Computed once from the poses.
"""

from __future__ import annotations

from typing import List, Sequence

import torch

__all__ = ["neighbour_views", "lonely_cameras_message"]


def neighbour_views(
    viewmats: torch.Tensor,  # [N, 4, 4] world -> camera
    max_angle_deg: float = 30.0,
    min_distance: float = 0.01,
    max_distance: float = 1.5,
    max_count: int = 8,
) -> List[List[int]]:
    """Per camera i, the indices of its neighbours (module doc), nearest first.

    Distances are in the poses' units (the trainer passes them in units of
    the scene radius times ``scene_radius``)."""
    V = viewmats.detach().to(torch.float64)
    R, t = V[:, :3, :3], V[:, :3, 3]  # [N, 3, 3], [N, 3]
    centres = -(R.transpose(1, 2) @ t[:, :, None])[:, :, 0]  # [N, 3]
    dirs = R[:, 2, :]  # [N, 3] third row of R = R^T (0, 0, 1): unit viewing direction in the world
    cos = (dirs @ dirs.T).clamp(-1.0, 1.0)  # [N, N]
    angle = torch.rad2deg(torch.acos(cos))
    dist = torch.cdist(centres, centres)  # [N, N]
    ok = (angle < max_angle_deg) & (dist > min_distance) & (dist < max_distance)
    ok.fill_diagonal_(False)
    out: List[List[int]] = []
    for i in range(V.shape[0]):
        cand = torch.nonzero(ok[i]).flatten().tolist()
        cand.sort(key=lambda j: (float(dist[i, j]), float(angle[i, j]), j))
        out.append(cand[:max_count])
    return out


def lonely_cameras_message(names: Sequence[str], neighbours: Sequence[Sequence[int]], limits: str) -> str | None:
    """One warning line naming the cameras without a neighbour (None if every camera has one)."""
    lonely = [names[i] for i, n in enumerate(neighbours) if not n]
    if not lonely:
        return None
    shown = ", ".join(lonely[:10]) + (f" and {len(lonely) - 10} more" if len(lonely) > 10 else "")
    share = f"{len(lonely)} of {len(names)}"
    return f"loss.multiview: {share} train cameras have no neighbour ({limits}) and get no multi-view loss: {shown}"
