"""splat's PLY on the web: PlayCanvas ``splat-transform`` reads it (docs/sharing.md).

The pinned tool (``tools/web``, installed by ``npm ci`` there; CI does it in
.ci/run) converts a model's ``point_cloud.ply`` to SPZ and back to PLY; the
columns must match splat's file within SPZ's quantisation, as the SPZ
reference encoder (nianticlabs/spz ``packGaussians``, run by splat-transform
through ``@adobe/spz``) quantises them, every value rounded to the nearest
code, so the error is at most half a step:

* positions: 24-bit fixed point with 12 fractional bits -> |dx| <= 2**-13;
* log scales: one byte ``round((s + 10) * 16)``, clamped to [0, 255] -> after
  clamping ``s`` to [-10, 5.9375], |ds| <= 1/32;
* opacity: one byte ``round(255 * sigmoid(logit))`` -> |d sigmoid| <= 0.5/255;
* SH0 colour: one byte ``round(255 * (0.15 * f_dc + 0.5))`` ->
  |d f_dc| <= 0.5 / (255 * 0.15);
* rotation (SPZ >= 3): the three smallest components of the unit quaternion
  (each at most 1/sqrt(2)) as 9-bit magnitudes of 1/sqrt(2) and a sign, the
  largest recomputed from them: each stored one is off by at most
  d = 0.5 / 511 / sqrt(2), the largest by at most 3 d (its derivative with
  respect to each other component is at most 1 in size), so the unit
  quaternions differ by |e|**2 <= 12 d**2 and 1 - |<q, q'>| = |e|**2 / 2 <= 6 d**2;
* degree-1 SH (``f_rest``): splat-transform packs them with 5 bits
  (``sh1Bits``): ``round(128 x + 128)`` snapped to a multiple of 8 ->
  |dx| <= 4.5/128 for x in [-1, 127/128].

Each bound gets a float32 slack of 1e-6 relative.  Measured on the fixture: every
attribute's largest error is 0.997 to 1.000 of its bound (0.42 for the rotation),
so a coarser encoding would fail; so does a file whose layout is wrong (tried:
``f_rest`` not channel-major, opacity not a logit, a fixed 1e-7 third scale).  A surfel's third scale is
splat's thin axis (splat/ply.py: 1 % of the smaller tangent scale); SPZ's
floor of e**-10 (4.5e-5) clamps it (181 of the fixture's 400), so it comes
back as max(thin, -10).

The HTML test opens the single-file viewer page the tool writes in headless
Chromium (software WebGL: SwiftShader) and requires the model, a ball of
green primitives, to cover a visible part of the canvas: pixels clearly green
(G above R and B by 0.25) over at least 2 % of it.  The page's own UI is
grey, white and orange, and its background dark, so nothing else is green
(measured: 0 % for the same model made invisible, opacity 1e-5).
"""

from __future__ import annotations

import io
import math
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from splat.model import GaussianModel
from splat.ply import PLY_THIN_FACTOR, load_ply, save_ply
from splat.sh import rgb_to_sh

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "web" / "node_modules" / ".bin" / "splat-transform"
pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not TOOL.exists(),
    reason="splat-transform is not installed (needs Node.js; `npm ci` in tools/web, as .ci/run does)",
)

POS_TOL = 2.0**-13
LOG_SCALE_TOL = 1.0 / 32
LOG_SCALE_RANGE = (-10.0, 255 / 16 - 10)
OPACITY_TOL = 0.5 / 255
SH0_TOL = 0.5 / (255 * 0.15)
SH0_RANGE = 0.5 / 0.15
QUAT_TOL = 6 * (0.5 / 511 / math.sqrt(2)) ** 2
SH1_TOL = 4.5 / 128
F32 = 1 + 1e-6


def run_tool(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``splat-transform -w ARGS``; fails the test with its output on an error."""
    proc = subprocess.run([str(TOOL), "-w", *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"splat-transform {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def spread_model(primitive: str, n: int = 400, seed: int = 0) -> GaussianModel:
    """A degree-1 model whose values span what training produces, inside SPZ's ranges."""
    g = torch.Generator().manual_seed(seed)

    def uniform(lo, hi, *shape):
        return lo + (hi - lo) * torch.rand(*shape, generator=g)

    params = {
        "means": uniform(-3.0, 3.0, n, 3),
        "quats": torch.randn(n, 4, generator=g),
        "scales": uniform(-7.0, -1.0, n, 2 if primitive == "2dgs" else 3),
        "opacities": uniform(-5.0, 5.0, n),
        "sh0": uniform(-2.0, 2.0, n, 1, 3),
        "shN": uniform(-0.6, 0.6, n, 3, 3),
    }
    return GaussianModel(params, sh_degree=1)


def ply_columns(path: Path) -> dict:
    from plyfile import PlyData

    v = PlyData.read(str(path))["vertex"]
    return {p.name: np.asarray(v[p.name], dtype=np.float64) for p in v.properties}


def inria_columns(model: GaussianModel) -> dict:
    """What an INRIA-layout file of ``model`` holds, from its parameters (not from splat/ply.py):
    logit opacity, log scales (a surfel's thin third one), ``f_rest`` channel-major."""
    p = {k: v.detach().double().numpy() for k, v in model.params.items()}
    cols = {name: p["means"][:, i] for i, name in enumerate("xyz")}
    cols.update({f"f_dc_{c}": p["sh0"][:, 0, c] for c in range(3)})
    k = p["shN"].shape[1]
    cols.update({f"f_rest_{c * k + j}": p["shN"][:, j, c] for c in range(3) for j in range(k)})
    cols["opacity"] = p["opacities"]
    scales = p["scales"]
    if model.primitive == "2dgs":
        scales = np.concatenate([scales, scales.min(axis=1, keepdims=True) + math.log(PLY_THIN_FACTOR)], axis=1)
    cols.update({f"scale_{i}": scales[:, i] for i in range(3)})
    cols.update({f"rot_{i}": p["quats"][:, i] for i in range(4)})
    return cols


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@pytest.mark.parametrize("primitive", ["2dgs", "3dgs"])
def test_spz_round_trip_within_quantisation(tmp_path, primitive):
    model = spread_model(primitive)
    ply, spz, back = tmp_path / "point_cloud.ply", tmp_path / "scene.spz", tmp_path / "back.ply"
    save_ply(model, ply)
    run_tool(str(ply), str(spz))
    run_tool(str(spz), str(back))
    a, b = inria_columns(model), ply_columns(back)
    written = ply_columns(ply)
    for name, values in a.items():  # splat's file is the INRIA layout of the model (float32)
        assert np.allclose(written[name], values, rtol=1e-6, atol=1e-6), name
    assert len(b["x"]) == model.num_gaussians

    for name in ("x", "y", "z"):
        assert np.abs(b[name] - a[name]).max() <= POS_TOL * F32, name
    for name in ("scale_0", "scale_1", "scale_2"):
        expected = np.clip(a[name], *LOG_SCALE_RANGE)
        assert np.abs(b[name] - expected).max() <= LOG_SCALE_TOL * F32, name
    assert np.abs(sigmoid(b["opacity"]) - sigmoid(a["opacity"])).max() <= OPACITY_TOL * F32
    for name in ("f_dc_0", "f_dc_1", "f_dc_2"):
        assert np.abs(a[name]).max() < SH0_RANGE  # the fixture stays in SPZ's colour range
        assert np.abs(b[name] - a[name]).max() <= SH0_TOL * F32, name
    for i in range(9):  # degree 1
        assert np.abs(b[f"f_rest_{i}"] - a[f"f_rest_{i}"]).max() <= SH1_TOL * F32, f"f_rest_{i}"
    qa = np.stack([a[f"rot_{i}"] for i in range(4)], axis=1)  # [N, 4] wxyz
    qa /= np.linalg.norm(qa, axis=1, keepdims=True)
    qb = np.stack([b[f"rot_{i}"] for i in range(4)], axis=1)  # [N, 4] unit
    assert (1 - np.abs((qa * qb).sum(axis=1))).max() <= QUAT_TOL + 1e-6

    if primitive == "2dgs":
        # The thin axis (1 % of the smaller tangent scale, floored by SPZ) stays the thinnest.
        assert np.all(b["scale_2"] <= np.minimum(b["scale_0"], b["scale_1"]) + LOG_SCALE_TOL)

    # splat reads the tool's PLY back (no normals, no primitive comment: say which).
    again = load_ply(back, primitive=primitive)
    assert again.num_gaussians == model.num_gaussians
    assert torch.allclose(again.means, model.means, atol=POS_TOL * F32)


def green_ball(primitive: str, opacity: float, n: int = 600, seed: int = 1) -> GaussianModel:
    """``n`` green primitives in a unit ball, each 0.12 across: seen from any side."""
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(n, 3, generator=g)
    means = d / d.norm(dim=1, keepdim=True) * torch.rand(n, 1, generator=g) ** (1 / 3)  # [N, 3]
    k = 2 if primitive == "2dgs" else 3
    params = {
        "means": means,
        "quats": torch.randn(n, 4, generator=g),
        "scales": torch.full((n, k), math.log(0.12)),
        "opacities": torch.full((n,), math.log(opacity / (1 - opacity))),
        "sh0": rgb_to_sh(torch.tensor([0.1, 0.85, 0.15])).expand(n, 1, 3).clone(),
        "shN": torch.zeros(n, 0, 3),
    }
    return GaussianModel(params, sh_degree=0)


CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--use-angle=swiftshader",
    "--enable-unsafe-swiftshader",
    "--ignore-gpu-blocklist",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
]
GREEN_MARGIN = 0.25
GREEN_FRACTION_MIN = 0.02


def green_fraction(png: bytes) -> float:
    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.float32) / 255  # [H, W, 3]
    r, g, b = img[..., 0], img[..., 1], img[..., 2]
    return float(((g > r + GREEN_MARGIN) & (g > b + GREEN_MARGIN)).mean())


def page_green_fraction(html: Path, timeout: float = 90.0) -> float:
    """The largest green fraction of the page's screenshots until it reaches the bound or ``timeout``."""
    from playwright.sync_api import sync_playwright

    best = 0.0
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 640, "height": 480})
            page.goto(html.as_uri())
            t_end = time.monotonic() + timeout
            while time.monotonic() < t_end and best < GREEN_FRACTION_MIN:
                time.sleep(1.0)
                best = max(best, green_fraction(page.screenshot()))
        finally:
            browser.close()
    return best


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium); CI installs it")
def test_html_viewer_page_shows_the_model(tmp_path):
    """Surfels, which web viewers draw as thin 3D Gaussians (3D Gaussians: the same path, 13 s more)."""
    ply, html = tmp_path / "point_cloud.ply", tmp_path / "scene.html"
    save_ply(green_ball("2dgs", opacity=0.95), ply)
    run_tool("-g", "cpu", str(ply), str(html))  # the page embeds SOG: '-g cpu' runs its k-means without a GPU
    assert html.stat().st_size > 0
    fraction = page_green_fraction(html)
    print("green fraction", fraction)
    assert fraction >= GREEN_FRACTION_MIN
