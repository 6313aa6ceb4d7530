"""Property-based fuzzing of ``splat.rasterize`` (hypothesis).

Every call either raises a ValueError/TypeError whose message names the
argument at fault, or returns finite outputs whose gradients (w.r.t. every
input, viewmat, K and means2d included) are finite.  Inputs mix sane scenes
with hostile values: magnitudes from 1e-45 to 1e45 (beyond float32's range),
zeros, reflections, non-rigid cameras, surfels at the camera, degenerate
intrinsics, extreme near/far.  The search is derandomised (the same examples
every run) and bounded by ``max_examples``, a few seconds in CI.
"""

import re

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import splat  # noqa: E402
from splat._backend import has_cuda_kernels  # noqa: E402
from splat.testing import rotmat_to_quat  # noqa: E402

ARGUMENTS = (
    "means",
    "quats",
    "scales",
    "opacities",
    "colors",
    "viewmat",
    "K",
    "width",
    "height",
    "near",
    "far",
    "background",
    "sh_degree",
    "backend",
)
OUTPUTS = ("rgb", "alpha", "depth", "median_depth", "normal", "distortion")

FUZZ = settings(
    max_examples=int(__import__("os").environ.get("SPLAT_FUZZ_EXAMPLES", 200)),
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@st.composite
def magnitude(draw, lo=-45, hi=45, signed=True):
    """0, or +-10^e with e uniform in [lo, hi] (float32 over/underflows at the ends)."""
    if draw(st.integers(0, 9)) == 0:
        return 0.0
    value = 10.0 ** draw(st.floats(lo, hi))
    return -value if signed and draw(st.booleans()) else value


# The CUDA kernels join when a GPU and a CUDA build are present.
BACKENDS = ["cpu", "torch"] + (["cuda"] if torch.cuda.is_available() and has_cuda_kernels() else [])
ATTACKS = (
    "value",
    "camera_depth",
    "reflect",
    "viewmat_scale",
    "viewmat_translate",
    "viewmat_bottom",
    "intrinsics",
    "near_far",
    "unit",
    "quat_magnitude",
    "edge_on",
    "zero_scales",
    "opacity_edges",
)


@st.composite
def calls(draw):
    """A sane random scene, then zero to three attacks on it."""
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    backend = draw(st.sampled_from(BACKENDS))
    n = draw(st.integers(0, 6))
    width, height = draw(st.integers(1, 24)), draw(st.integers(1, 20))
    sh_degree = draw(st.sampled_from([None, None, 0, 1, 3]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    f64 = dict(dtype=torch.float64, generator=g)
    bases = 1 if sh_degree is None else (sh_degree + 1) ** 2
    t = dict(
        means=(torch.rand(n, 3, **f64) * 2 - 1) * 1.5,
        quats=torch.randn(n, 4, **f64),
        scales=torch.rand(n, 2, **f64) * 0.5,
        opacities=torch.rand(n, **f64),
        colors=torch.rand(n, bases, 3, **f64) - 0.2,
        background=torch.rand(3, **f64) if draw(st.booleans()) else None,
    )
    if draw(st.booleans()):
        rot = torch.eye(3, dtype=torch.float64)
    else:
        rot = torch.linalg.qr(torch.randn(3, 3, **f64))[0]
        rot = rot * torch.sign(torch.linalg.det(rot))  # a rotation, det +1
    t["viewmat"] = torch.eye(4, dtype=torch.float64)
    t["viewmat"][:3, :3] = rot
    t["viewmat"][2, 3] = 4.0  # the scene in front of the camera
    fx = draw(st.floats(0.5, 4.0)) * width
    t["K"] = torch.tensor([[fx, 0.0, width / 2], [0.0, fx, height / 2], [0.0, 0.0, 1.0]], dtype=torch.float64)
    near, far = 0.2, 100.0
    for attack in draw(st.lists(st.sampled_from(ATTACKS), max_size=3)):
        if attack == "value":  # one element of one tensor
            name = draw(st.sampled_from(["means", "quats", "scales", "opacities", "colors", "background"]))
            if t[name] is not None and t[name].numel():
                t[name].view(-1)[draw(st.integers(0, t[name].numel() - 1))] = draw(magnitude())
        elif attack == "camera_depth" and n:  # a surfel at camera depth ~0, or at the camera itself
            cam = torch.tensor([0.3, -0.2, draw(st.sampled_from([0.0, 1e-12, -1e-300, 1e-300]))], dtype=torch.float64)
            if draw(st.booleans()):
                cam[:2] = 0.0
            t["means"][0] = rot.T @ (cam - t["viewmat"][:3, 3])
        elif attack == "reflect":
            t["viewmat"][draw(st.integers(0, 2)), :3] *= -1
        elif attack == "viewmat_scale":
            t["viewmat"][:3, :3] *= draw(magnitude())
        elif attack == "viewmat_translate":
            t["viewmat"][draw(st.integers(0, 2)), 3] = draw(magnitude())
        elif attack == "viewmat_bottom":
            t["viewmat"][3, draw(st.integers(0, 3))] = draw(magnitude())
        elif attack == "intrinsics":
            t["K"][draw(st.sampled_from([(0, 0), (1, 1), (0, 2), (1, 2), (0, 1)]))] = draw(magnitude())
        elif attack == "near_far":
            near = draw(st.one_of(st.just(near), magnitude(signed=False)))
            far = draw(st.one_of(st.just(far), magnitude(signed=False), st.just(near * (1 + 1e-9))))
        elif attack == "unit":  # the whole scene in another length unit
            unit = 10.0 ** draw(st.sampled_from([-30.0, -20.0, -8.0, 8.0, 20.0, 30.0]))
            for name in ("means", "scales"):
                t[name] = t[name] * unit
            t["viewmat"][:3, 3] *= unit
            near, far = near * unit, far * unit
        elif attack == "quat_magnitude":
            t["quats"] = t["quats"] * draw(magnitude(signed=False))
        elif attack == "edge_on" and n:  # normal along camera x or facing the camera
            axis = draw(st.sampled_from([(0.5**0.5, 0.0, 0.5**0.5, 0.0), (1.0, 0.0, 0.0, 0.0)]))
            t["quats"][0] = rotmat_to_quat(rot.T[None] @ torch.eye(3, dtype=torch.float64))[0]
            if axis[0] != 1.0:
                t["quats"][0] = torch.tensor(axis, dtype=torch.float64)
        elif attack == "zero_scales" and n:
            t["scales"][: draw(st.integers(1, n))] = 0.0
        elif attack == "opacity_edges" and n:
            t["opacities"][0] = draw(st.sampled_from([0.0, 1.0, 1.0 / 255.0, 1e-30]))
    if sh_degree is None:
        t["colors"] = t["colors"][:, 0]
    device = "cuda" if backend == "cuda" else "cpu"
    t = {k: None if v is None else v.to(dtype=dtype, device=device) for k, v in t.items()}
    return dict(t, width=width, height=height, near=near, far=far, sh_degree=sh_degree, backend=backend)


def _names_an_argument(message):
    return any(re.search(rf"\b{re.escape(name)}\b", message) for name in ARGUMENTS + ("surfels at rows",))


@FUZZ
@given(call=calls())
def test_rasterize_errors_clearly_or_is_finite(call):
    diff = {
        k: call[k].clone().requires_grad_(True)
        for k in ("means", "quats", "scales", "opacities", "colors", "viewmat", "K", "background")
        if call[k] is not None
    }
    args = dict(call, **diff)
    try:
        out = splat.rasterize(**args)
    except (ValueError, TypeError) as e:
        assert _names_an_argument(str(e)), f"error names no argument: {e}"
        assert "\n" not in str(e)
        return
    for k in OUTPUTS:
        value = getattr(out, k)
        assert torch.isfinite(value).all(), f"non-finite {k}"
    assert torch.isfinite(out.means2d).all(), "non-finite means2d"
    # A loss touching every output with O(1) weights of both signs.
    loss = sum((getattr(out, k) * (0.5 - i / 6)).mean() for i, k in enumerate(OUTPUTS))
    out.means2d.retain_grad()
    loss.backward()
    for k, t in list(diff.items()) + [("means2d", out.means2d)]:
        assert t.grad is not None, f"no gradient for {k}"
        assert torch.isfinite(t.grad).all(), f"non-finite gradient for {k}"
