"""PLY I/O and model helpers (no rasterizer needed)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from splat.geometry import knn_mean_distance, project_points, quat_to_rotmat, random_points_in_frustums, seen_by
from splat.model import GaussianModel, create_from_points
from splat.ply import PLY_THIN_FACTOR, load_ply, ply_attribute_names, save_ply
from splat.sh import rgb_to_sh, sh_to_rgb


def random_model(n: int = 50, degree: int = 3, seed: int = 0) -> GaussianModel:
    g = torch.Generator().manual_seed(seed)
    k = (degree + 1) ** 2
    params = {
        "means": torch.randn(n, 3, generator=g),
        "quats": torch.randn(n, 4, generator=g),
        "scales": torch.randn(n, 2, generator=g) - 3,
        "opacities": torch.randn(n, generator=g),
        "sh0": torch.randn(n, 1, 3, generator=g),
        "shN": torch.randn(n, k - 1, 3, generator=g),
    }
    return GaussianModel(params, degree)


@pytest.mark.parametrize("degree", [0, 1, 3])
def test_ply_round_trip_is_lossless(tmp_path, degree):
    m = random_model(degree=degree)
    path = tmp_path / "pc.ply"
    save_ply(m, path)
    m2 = load_ply(path)
    assert m2.sh_degree == degree
    for k, v in m.params.items():
        assert torch.equal(v.detach(), m2.params[k].detach()), k  # float32 -> float32: bit-exact


def test_ply_attribute_names_and_layout(tmp_path):
    from plyfile import PlyData

    m = random_model(n=7, degree=3)
    path = tmp_path / "pc.ply"
    save_ply(m, path)
    v = PlyData.read(str(path))["vertex"]
    names = [p.name for p in v.properties]
    expected = (
        ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
        + [f"f_rest_{i}" for i in range(45)]
        + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    )
    assert names == expected == ply_attribute_names(3)
    assert all(p.val_dtype in ("f4", "float32") for p in v.properties)
    shN = m.params["shN"].detach()  # [N, 15, 3]
    # INRIA channel-major order: f_rest_0..14 are red, 15..29 green, 30..44 blue.
    assert np.allclose(v["f_rest_0"], shN[:, 0, 0].numpy())
    assert np.allclose(v["f_rest_1"], shN[:, 1, 0].numpy())
    assert np.allclose(v["f_rest_15"], shN[:, 0, 1].numpy())
    assert np.allclose(v["f_rest_44"], shN[:, 14, 2].numpy())
    # logit opacity and log scales are stored raw; the normal axis is thin.
    assert np.allclose(v["opacity"], m.params["opacities"].detach().numpy())
    log_s = m.params["scales"].detach()
    assert np.allclose(v["scale_1"], log_s[:, 1].numpy())
    assert np.allclose(v["scale_2"], (log_s.min(1).values + math.log(PLY_THIN_FACTOR)).numpy(), atol=1e-5)
    # rot_0 is w; nx ny nz is the surfel normal (third rotation column).
    assert np.allclose(v["rot_0"], m.params["quats"].detach()[:, 0].numpy())
    n = quat_to_rotmat(m.params["quats"].detach())[..., 2]
    assert np.allclose(np.stack([v["nx"], v["ny"], v["nz"]], 1), n.numpy(), atol=1e-6)


def test_activations_and_colors():
    m = random_model(n=5, degree=2)
    assert torch.allclose(m.scales, m.params["scales"].exp())
    assert torch.allclose(m.opacities, torch.sigmoid(m.params["opacities"]))
    assert m.colors(0).shape == (5, 1, 3)
    assert m.colors(1).shape == (5, 4, 3)
    assert m.colors().shape == (5, 9, 3)
    rgb = torch.rand(4, 3)
    assert torch.allclose(sh_to_rgb(rgb_to_sh(rgb)), rgb, atol=1e-6)


def test_quat_to_rotmat_is_rotation():
    R = quat_to_rotmat(torch.randn(20, 4) * 3)
    eye = torch.eye(3).expand(20, 3, 3)
    assert torch.allclose(R @ R.transpose(1, 2), eye, atol=1e-5)
    assert torch.allclose(torch.linalg.det(R), torch.ones(20), atol=1e-5)
    # identity quaternion: normal is +z
    assert torch.allclose(quat_to_rotmat(torch.tensor([[2.0, 0, 0, 0]]))[0], torch.eye(3))


def test_knn_and_init_from_points():
    # points on a grid with spacing 0.1: the 3 nearest neighbours are at 0.1
    g = torch.stack(torch.meshgrid(*[torch.arange(6.0)] * 3, indexing="ij"), -1).reshape(-1, 3) * 0.1
    d = knn_mean_distance(g, k=3)
    assert torch.allclose(d, torch.full_like(d, 0.1), atol=1e-6)
    # Against brute force on scattered points (and the k-d tree's exact distances).
    p = torch.rand(500, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    brute = torch.cdist(p, p).topk(4, dim=1, largest=False).values[:, 1:].mean(1)
    assert torch.allclose(knn_mean_distance(p, k=3), brute, rtol=1e-12, atol=0)
    cols = torch.rand(g.shape[0], 3)
    m = create_from_points(g, cols, sh_degree=2, init_opacity=0.1)
    assert m.num_gaussians == g.shape[0]
    assert torch.allclose(m.scales, torch.full((g.shape[0], 2), 0.1), atol=1e-5)
    assert torch.allclose(m.opacities, torch.full((g.shape[0],), 0.1), atol=1e-5)
    assert torch.allclose(sh_to_rgb(m.params["sh0"][:, 0]), cols, atol=1e-5)
    assert m.params["shN"].shape == (g.shape[0], 8, 3) and not m.params["shN"].any()


def test_random_points_are_seen_by_cameras():
    # one camera at z = -5 looking along +z: points must be in front and inside its image
    viewmat = torch.eye(4)
    viewmat[2, 3] = 5.0
    K = torch.tensor([[20.0, 0, 16], [0, 20.0, 16], [0, 0, 1]])
    pts = random_points_in_frustums(500, viewmat[None], K[None], 32, 32, torch.zeros(3), 2.0)
    assert pts.shape == (500, 3)
    assert (pts.norm(dim=1) <= 2.0 + 1e-5).all()
    cam = pts + torch.tensor([0, 0, 5.0])
    u = 20 * cam[:, 0] / cam[:, 2] + 16
    assert ((u >= 0) & (u < 32)).all()


def test_seen_by_per_camera_sizes():
    """Cameras of different image sizes (widths/heights [C, 1]) and an int
    size agree with the projection tested point by point; behind is unseen."""
    g = torch.Generator().manual_seed(0)
    pts = torch.randn(3000, 3, generator=g) * 2
    V = torch.eye(4).repeat(3, 1, 1)
    V[:, 2, 3] = torch.tensor([5.0, 4.0, -3.0])  # the third camera has most points behind it
    K = torch.tensor([[20.0, 0, 16], [0, 20.0, 12], [0, 0, 1]]).repeat(3, 1, 1)
    W, H = torch.tensor([[32.0], [20.0], [32.0]]), torch.tensor([[24.0], [30.0], [24.0]])
    seen = seen_by(pts, V, K, W, H)
    uv, z = project_points(pts, V, K)
    expect = (z > 1e-6) & (uv[..., 0] >= 0) & (uv[..., 0] < W) & (uv[..., 1] >= 0) & (uv[..., 1] < H)
    assert torch.equal(seen, expect) and seen.any(1).all() and not seen.all()
    assert torch.equal(seen_by(pts, V, K, 32, 24)[0], expect[0])
    assert seen_by(pts[:0], V, K, 32, 24).shape == (3, 0)


# ------------------------------------------------ bad PLY files (issue 9)
def _ply_with(tmp_path, edit):
    """A valid model's PLY with one column edited (``edit(arr)`` in place)."""
    from plyfile import PlyData, PlyElement

    path = tmp_path / "m.ply"
    save_ply(random_model(6, degree=1), path)
    arr = PlyData.read(str(path))["vertex"].data.copy()
    arr = edit(arr) if edit is not None else arr
    PlyData([PlyElement.describe(arr, "vertex")]).write(str(path))
    return path


def _drop(name):
    def edit(arr):
        keep = [n for n in arr.dtype.names if n != name]
        out = np.empty(len(arr), dtype=[(n, arr.dtype[n]) for n in keep])
        for n in keep:
            out[n] = arr[n]
        return out

    return edit


def _set(name, value, row=2):
    def edit(arr):
        arr[name][row] = value
        return arr

    return edit


def _zero_quaternion(row):
    def edit(arr):
        for i in range(4):
            arr[f"rot_{i}"][row] = 0.0
        return arr

    return edit


def _truncated(tmp_path):
    path = _ply_with(tmp_path, None)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 37])
    return path


def _garbage(tmp_path):
    path = tmp_path / "m.ply"
    path.write_bytes(b"ply\nformat ascii 1.0\nelement vertex 2\nproperty float x\nend_header\n1.0\nbanana\n")
    return path


def _not_ply(tmp_path):
    path = tmp_path / "m.ply"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    return path


def _sh_degree_4(tmp_path):
    """An INRIA-layout PLY with 72 ``f_rest_*`` (SH degree 4)."""
    from plyfile import PlyData, PlyElement

    path = tmp_path / "m.ply"
    names = [n for n in ply_attribute_names(3) if not n.startswith("f_rest_")]
    names[names.index("opacity") : names.index("opacity")] = [f"f_rest_{i}" for i in range(72)]
    arr = np.zeros(3, dtype=[(n, "f4") for n in names])
    arr["rot_0"] = 1.0
    PlyData([PlyElement.describe(arr, "vertex")]).write(str(path))
    return path


def _faces_only(tmp_path):
    from plyfile import PlyData, PlyElement

    path = tmp_path / "m.ply"
    arr = np.zeros(2, dtype=[("vertex_indices", "i4", (3,))])
    PlyData([PlyElement.describe(arr, "face")]).write(str(path))
    return path


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda t: t / "missing.ply", "PLY file not found"),
        (_truncated, "not a readable PLY"),
        (_garbage, "not a readable PLY"),
        (_not_ply, "not a readable PLY"),
        (_faces_only, "no 'vertex' element"),
        (lambda t: _ply_with(t, _drop("rot_2")), r"lacks attribute\(s\) \['rot_2'\]"),
        (lambda t: _ply_with(t, _drop("f_rest_4")), "not a valid SH layout"),
        (_sh_degree_4, r"72 f_rest attributes \(SH degree 4\); at most 45 \(degree 3\)"),
        (lambda t: _ply_with(t, _set("x", np.nan)), "'x' is not finite at vertex 2"),
        (lambda t: _ply_with(t, _set("opacity", np.inf)), "'opacity' is not finite at vertex 2"),
        (lambda t: _ply_with(t, _zero_quaternion(4)), "zero quaternion .* at vertex 4"),
        (lambda t: _ply_with(t, _set("scale_1", 200.0, row=3)), "log-scale 200.0 at vertex 3 overflows"),
    ],
    ids=[
        "missing",
        "truncated",
        "garbage",
        "not_ply",
        "faces_only",
        "missing_attribute",
        "bad_sh_layout",
        "sh_degree_4",
        "nan_position",
        "inf_opacity",
        "zero_quaternion",
        "huge_log_scale",
    ],
)
def test_bad_ply_raises_input_error_naming_the_file(tmp_path, make, message):
    from splat.errors import SplatInputError

    path = make(tmp_path)
    with pytest.raises(SplatInputError, match=message) as info:
        load_ply(path)
    assert str(path) in str(info.value)
