"""The edge code of the INRIA-family shims (:mod:`splat.compat.diff_surfel_rasterization`,
:mod:`splat.compat.diff_gaussian_rasterization`).

2DGS took its module's interface from INRIA's 3DGS, so both shims read the
same settings (transposed matrices, fields of view, ``campos``, ``bg``,
``prefiltered``, ``debug``) and take the same arguments (empty tensors for
"not given", ``means2D`` whose gradient is the screen-space one in NDC
units).  This module converts those to splat's camera and tensors, checks
the arguments with one-line errors in the INRIA family's names, and carries
``means2D``'s gradient around splat's rasterizers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np
import torch
from torch import nn

from .. import conventions as cv
from ..sh import MAX_SH_DEGREE, eval_sh, num_sh_bases

#: The INRIA-family kernels' near plane (2DGS's near_n, 3DGS's 0.2): their
#: near culling and per-sample test.
NEAR = 0.2
#: splat culls centres at z >= far; the INRIA family culls nothing far, so the
#: shims render with this far.
CULL_FAR = 1e10
#: Principal-point offsets and skews below this (pixels) are float32 rounding
#: of projmatrix, not a camera's.
SNAP_PIXELS = 0.01


@dataclass(frozen=True)
class Camera:
    """splat's camera from the shims' settings: float64, on the CPU."""

    viewmat: torch.Tensor  # [4, 4] world -> camera, OpenCV
    K: torch.Tensor  # [3, 3] pixels, centre of pixel (i, j) at (j + 1/2, i + 1/2)
    width: int
    height: int
    campos: torch.Tensor  # [3]
    campos_is_centre: bool  # campos is the viewmatrix's camera centre (SH fused into splat's projection)

    @property
    def ndc_per_pixel(self):
        """(W/2, H/2): a pixel gradient times this is 2DGS's NDC gradient."""
        return (self.width / 2.0, self.height / 2.0)


#: The settings' scalar fields (``antialiasing`` is 3DGS's current module's).
SCALAR_FIELDS = (
    "image_height",
    "image_width",
    "tanfovx",
    "tanfovy",
    "scale_modifier",
    "sh_degree",
    "prefiltered",
    "debug",
    "antialiasing",
)


def plain_settings(settings: NamedTuple) -> NamedTuple:
    """``settings`` with numpy scalars and one-element tensors in its scalar
    fields replaced by Python numbers (INRIA's binding takes them; a camera
    built with numpy hands over ``np.float32`` fields of view and ``np.int64``
    sizes).  Anything else is left for the checks to refuse by name."""
    changed = {}
    for name in SCALAR_FIELDS:
        value = getattr(settings, name, None)
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
            changed[name] = value.item()
        elif isinstance(value, np.generic):
            changed[name] = value.item()
    if not changed or not hasattr(settings, "_replace"):
        return settings
    return settings._replace(**changed)


def _matrix4(name, m):
    if not isinstance(m, torch.Tensor) or m.shape != (4, 4):
        got = list(m.shape) if isinstance(m, torch.Tensor) else type(m).__name__
        raise ValueError(f"{name} must be a [4, 4] tensor, got {got}")
    m = m.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(m).all()):
        raise ValueError(f"{name} contains NaN or Inf")
    return m


def camera_from_settings(settings: NamedTuple) -> Camera:
    """Converts the INRIA family's camera (2DGS's and 3DGS's settings: transposed
    matrices, fields of view) to splat's (viewmat, K).

    P = (viewmatrix^-1 projmatrix)^T is the pinhole projection; a camera point
    (X, Y, Z) lands at 2DGS's pixel x = W/2 (P0 . (X, Y, Z, 1) / Z + 1) - 1/2
    (column j's centre at x = j), which is splat's x - 1/2.  Hence
    K = [[W / (2 tanfovx), W/2 P01, W/2 (1 + P02)], [0, H / (2 tanfovy), H/2 (1 + P12)], [0, 0, 1]].
    """
    width, height = settings.image_width, settings.image_height
    for name, value in (("image_width", width), ("image_height", height)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {describe_value(value)}")
    view_t = _matrix4("viewmatrix", settings.viewmatrix)
    full_t = _matrix4("projmatrix", settings.projmatrix)
    if not torch.allclose(view_t[:, 3], view_t.new_tensor([0, 0, 0, 1]), atol=1e-6):
        raise ValueError(
            "viewmatrix must be 2DGS's world_view_transform (world->camera transposed: translation "
            f"in the last row, last column (0, 0, 0, 1)), got last column {view_t[:, 3].tolist()}"
        )
    viewmat = view_t.T.contiguous()
    P = torch.linalg.solve(view_t, full_t).T  # [4, 4]; full_t = view_t @ P^T
    big = float(P[:2, :3].abs().max())
    tol = 1e-5 * max(big, 1.0)
    if not (
        torch.allclose(P[3], P.new_tensor([0, 0, 1, 0]), atol=tol)
        and abs(float(P[1, 0])) <= tol
        and abs(float(P[0, 3])) <= tol
        and abs(float(P[1, 3])) <= tol
    ):
        raise ValueError(
            "projmatrix must be world_view_transform @ projection_matrix with a pinhole projection "
            "whose w is the camera z (2DGS's getProjectionMatrix, transposed)"
        )
    for name, tan, p in (("tanfovx", settings.tanfovx, float(P[0, 0])), ("tanfovy", settings.tanfovy, float(P[1, 1]))):
        if not (isinstance(tan, (int, float)) and not isinstance(tan, bool) and math.isfinite(tan) and tan > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {describe_value(tan)}")
        if abs(p * tan - 1.0) > 1e-4:
            raise ValueError(f"{name}={tan!r} disagrees with projmatrix, whose focal term is 1/{name} = {p!r}")
    fx = width / (2.0 * settings.tanfovx)
    fy = height / (2.0 * settings.tanfovy)

    def snapped(value):
        return 0.0 if abs(value) < SNAP_PIXELS else value

    skew = snapped(width / 2.0 * float(P[0, 1]))
    cx = width / 2.0 + snapped(width / 2.0 * float(P[0, 2]))
    cy = height / 2.0 + snapped(height / 2.0 * float(P[1, 2]))
    K = torch.tensor([[fx, skew, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]], dtype=torch.float64)
    campos = settings.campos
    if not isinstance(campos, torch.Tensor) or campos.numel() != 3:
        raise ValueError(f"campos must be a [3] tensor, got {describe_shape(campos)}")
    campos = campos.detach().to("cpu", torch.float64).reshape(3)
    centre = -viewmat[:3, :3].T @ viewmat[:3, 3]
    is_centre = bool(torch.allclose(campos, centre, rtol=1e-5, atol=1e-5 * max(1.0, float(centre.norm()))))
    return Camera(viewmat=viewmat, K=K, width=width, height=height, campos=campos, campos_is_centre=is_centre)


def check_inputs(
    settings,
    means3D,
    means2D,
    opacities,
    shs,
    colors_precomp,
    scales,
    rotations,
    cov3D_precomp,
    num_scales=2,
    cov_size=9,
):
    """2DGS's (and INRIA's: ``num_scales=3``, ``cov_size=6``) argument rules,
    with one-line errors that use their names."""
    if (shs is None) == (colors_precomp is None):
        raise ValueError("pass exactly one of shs and colors_precomp")
    pair_given = scales is not None or rotations is not None
    if (cov3D_precomp is None and (scales is None or rotations is None)) or (cov3D_precomp is not None and pair_given):
        raise ValueError("pass either scales and rotations, or cov3D_precomp (not both)")
    if not isinstance(means3D, torch.Tensor) or means3D.dim() != 2 or means3D.shape[1] != 3:
        raise ValueError(f"means3D must be a [N, 3] tensor, got {describe_shape(means3D)}")
    n = means3D.shape[0]
    shapes = {
        "opacities": ((n, 1), (n,)),
        "scales": ((n, num_scales),),
        "rotations": ((n, 4),),
        "colors_precomp": ((n, 3),),
        "cov3D_precomp": ((n, cov_size),),
        "means2D": ((n, 2), (n, 3)),
    }
    values = {
        "opacities": opacities,
        "scales": scales,
        "rotations": rotations,
        "colors_precomp": colors_precomp,
        "cov3D_precomp": cov3D_precomp,
        "means2D": means2D,
    }
    for name, value in values.items():
        if value is not None and (not isinstance(value, torch.Tensor) or tuple(value.shape) not in shapes[name]):
            want = " or ".join(str(list(s)) for s in shapes[name])
            extra = " (surfels have two scales)" if name == "scales" and num_scales == 2 else ""
            raise ValueError(f"{name} must have shape {want}{extra}, got {describe_shape(value)}")
    if shs is not None:
        degree = settings.sh_degree
        if not isinstance(degree, int) or isinstance(degree, bool) or not 0 <= degree <= MAX_SH_DEGREE:
            raise ValueError(f"sh_degree must be an int in 0..{MAX_SH_DEGREE}, got {describe_value(degree)}")
        if (
            not isinstance(shs, torch.Tensor)
            or shs.dim() != 3
            or shs.shape[0] != n
            or shs.shape[2] != 3
            or shs.shape[1] < num_sh_bases(degree)
        ):
            raise ValueError(
                f"shs must be [N, >= {num_sh_bases(degree)}, 3] for sh_degree={degree}, got {describe_shape(shs)}"
            )
    modifier = settings.scale_modifier
    if not isinstance(modifier, (int, float)) or not math.isfinite(modifier) or modifier < 0:
        raise ValueError(f"scale_modifier must be a finite number >= 0, got {describe_value(modifier)}")
    bg = settings.bg
    if not isinstance(bg, torch.Tensor) or bg.numel() != 3:
        raise ValueError(f"bg must be a [3] tensor, got {describe_shape(bg)}")


def describe_shape(t):
    return list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def describe_value(value) -> str:
    """A setting's value for a one-line error: a tensor by its shape (its repr spans lines)."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def colors_for_splat(cam, settings, means3D, shs, colors_precomp, may_fuse):
    """(colours, sh_degree) for splat: SH coefficients handed to splat's fused
    projection when it would use the same direction, else RGB evaluated here
    along the unit vector from ``campos``."""
    if colors_precomp is not None:
        return colors_precomp.to(means3D.dtype), None
    shs = shs.to(means3D.dtype)
    if may_fuse and cam.campos_is_centre:
        return shs, settings.sh_degree
    dirs = means3D - cam.campos.to(means3D)
    dirs = dirs / torch.clamp_min(dirs.norm(dim=-1, keepdim=True), 1e-12)
    return torch.clamp_min(eval_sh(settings.sh_degree, shs, dirs) + cv.SH_COLOR_OFFSET, 0.0), None


def edge_tensors(cam, settings, means3D, opacities, bg):
    """(viewmat, K, opacities [N], background [3]) in means3D's dtype and
    device; with ``prefiltered``, the promise that no mean lies at camera
    z <= NEAR is checked (the INRIA-family kernels trap where it is broken)."""
    dtype, device = means3D.dtype, means3D.device
    viewmat = cam.viewmat.to(dtype=dtype, device=device)
    if settings.prefiltered and means3D.shape[0]:
        z = (means3D.detach().double() @ viewmat[:3, :3].T.double() + viewmat[:3, 3].double())[:, 2]
        if bool((z <= NEAR).any()):
            rows = (z <= NEAR).nonzero().flatten()[:5].tolist()
            raise ValueError(
                f"prefiltered=True, but means3D rows {rows} lie at camera z <= {NEAR} (the original kernel traps here)"
            )
    return (
        viewmat,
        cam.K.to(dtype=dtype, device=device),
        opacities.reshape(means3D.shape[0]).to(dtype),
        bg.reshape(3).to(dtype=dtype, device=device),
    )


def snapshot(path, tensors):
    torch.save(tuple(t.detach().cpu().clone() if isinstance(t, torch.Tensor) else t for t in tensors), path)
    print(f"\nAn error occurred; the inputs are in {path} (debug=True).")


class RenderWithMeans2D(torch.autograd.Function):
    """Runs ``render`` (a shim's ``_render``: surfels or 3D Gaussians) with
    its own graph, so that ``means2D`` (which splat's rasterize does not take)
    receives the gradient of splat's pixel handle in NDC units; every other
    gradient is the inner graph's, unchanged.  ``render`` returns (color,
    radii, one more image, handle), where handle is a pixel handle [N, 2] or
    a tuple of them (one per rendering pass; their gradients add up).

    The inner graph lives as long as the outer one: a backward with
    ``retain_graph=True`` (and gradcheck, which calls backward many times)
    keeps it for the next backward, one without frees it as torch frees its
    own graphs."""

    @staticmethod
    def forward(ctx, render, cam, settings, means2D, *tensors):
        needs = list(ctx.needs_input_grad[4:])
        if ctx.needs_input_grad[3] and not any(needs):
            needs[0] = True  # splat draws its pixel handle only for a graph; means3D's own gradient is dropped
        with torch.enable_grad():
            leaves = tuple(
                t.detach().requires_grad_(need) if isinstance(t, torch.Tensor) else t for t, need in zip(tensors, needs)
            )
            color, radii, allmap, handle = render(cam, settings, *leaves, want_handle=ctx.needs_input_grad[3])
        ctx.inner = (leaves, color, allmap, handle)
        ctx.cam, ctx.settings = cam, settings
        ctx.means2D_like = means2D.detach() if means2D is not None else None
        ctx.mark_non_differentiable(radii)
        return color.detach(), radii, allmap.detach()

    @staticmethod
    def backward(ctx, v_color, v_radii, v_allmap):
        if ctx.inner is None:
            raise RuntimeError(
                "Trying to backward through the graph a second time (or directly access saved tensors after "
                "they have already been freed); specify retain_graph=True on the first backward"
            )
        keep_graph = _outer_keep_graph()
        leaves, color, allmap, handle = ctx.inner
        if not keep_graph:
            ctx.inner = None  # this backward's locals hold it until it returns
        handles = handle if isinstance(handle, tuple) else (handle,)
        wanted = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
        wanted += [h for h in handles if h is not None and h.requires_grad]
        outputs = [(o, g) for o, g in ((color, v_color), (allmap, v_allmap)) if g is not None and o.requires_grad]
        if not outputs or not wanted:
            return (None,) * (4 + len(leaves))
        try:
            grads = torch.autograd.grad(
                [o for o, _ in outputs],
                wanted,
                [g for _, g in outputs],
                retain_graph=keep_graph,
                allow_unused=True,
            )
        except Exception:
            if ctx.settings.debug:
                snapshot("snapshot_bw.dump", leaves + (v_color, v_allmap))
            raise
        by_id = {id(t): g for t, g in zip(wanted, grads)}
        v_means2D = None
        if ctx.needs_input_grad[3]:
            v_means2D = torch.zeros_like(ctx.means2D_like)
            for h in handles:
                v_handle = by_id.get(id(h))
                if v_handle is not None:
                    scale = v_handle.new_tensor(ctx.cam.ndc_per_pixel)
                    v_means2D[:, :2] += (v_handle * scale).to(v_means2D.dtype)
        v_tensors = tuple(
            by_id.get(id(t)) if isinstance(t, torch.Tensor) and need else None
            for t, need in zip(leaves, ctx.needs_input_grad[4:])
        )
        return (None, None, None, v_means2D) + v_tensors


def _outer_keep_graph() -> bool:
    """Whether the backward now running was asked to retain its graph (the
    inner graph follows it, as torch's AOTAutograd does for its compiled
    backward).  Where torch does not say, the inner graph is kept: a later
    backward then works, at the cost of holding it as long as the outputs."""
    probe = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return True if probe is None else bool(probe())


def functional_entry(
    rasterizer_cls, means3D, means2D, sh, colors_precomp, opacities, scales, rotations, cov3Ds_precomp, raster_settings
):
    """The INRIA-family ``rasterize_gaussians(...)``: ``rasterizer_cls(raster_settings)`` called with
    empty tensors (how those modules say "not given") as None."""

    def given(t):
        return None if isinstance(t, torch.Tensor) and t.numel() == 0 and means3D.shape[0] > 0 else t

    rasterizer = rasterizer_cls(raster_settings)
    return rasterizer(
        means3D,
        means2D,
        opacities,
        shs=given(sh),
        colors_precomp=given(colors_precomp),
        scales=given(scales),
        rotations=given(rotations),
        cov3D_precomp=given(cov3Ds_precomp),
    )


def run_render(render, cam: Camera, settings: NamedTuple, means2D: Optional[torch.Tensor], tensors: tuple):
    """(color, radii, third image) of ``render`` (a shim's ``_render``): through
    :class:`RenderWithMeans2D` when any input needs a gradient, so that
    ``means2D`` gets one; with ``settings.debug``, the inputs are saved to
    ``snapshot_fw.dump`` when it raises (as the INRIA family's kernels do)."""
    try:
        if torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in tensors + (means2D,)
        ):
            return RenderWithMeans2D.apply(render, cam, settings, means2D, *tensors)
        color, radii, third, _ = render(cam, settings, *tensors, want_handle=False)
        return color, radii, third
    except Exception:
        if settings.debug:
            snapshot("snapshot_fw.dump", tensors)
        raise


class InriaRasterizer(nn.Module):
    """What the shims' ``GaussianRasterizer`` classes share: the settings, and
    ``markVisible`` (2DGS's, which is INRIA's)."""

    def __init__(self, raster_settings: NamedTuple):
        super().__init__()
        self.raster_settings = raster_settings

    def plain_settings(self) -> NamedTuple:
        """The settings with Python numbers for numpy and tensor scalars, read once per call."""
        return plain_settings(self.raster_settings)

    def markVisible(self, positions: torch.Tensor) -> torch.Tensor:
        """[N] bool: means in front of the near plane (camera z > 0.2), the INRIA family's only frustum test."""
        cam = camera_from_settings(self.plain_settings())
        with torch.no_grad():
            viewmat = cam.viewmat.to(positions.device)
            z = positions.double() @ viewmat[:3, :3].T[:, 2] + viewmat[2, 3]
            return z > NEAR
