"""Bitwise guard for the C-ABI kernels (splat/_native.py, libsplat_cpu.so)
against the former torch extension (a splat._C built from an older tree):
the same inputs through both, every output and every gradient compared byte
for byte.  Prints JSON (and writes it with --out); exit code 1 on any
difference.

    python bench/wheel_bitwise.py --old-extension OLD_TREE/splat/_C.cpython-311-x86_64-linux-gnu.so \
        --out bench/results/wheel_bitwise.json

Two levels, for surfels and 3D Gaussians, float32 and float64, each CPU
kernel mode (0 reference, 1 scalar, 2 SIMD):

``ops``       each kernel op called directly (projection forward/backward,
              rasterizer forward/backward with its saved state and packed
              records, SSIM, normal loss, exp_float32).
``autograd``  splat.rasterize / rasterize_3dgs with SH colours, then SSIM and the
              depth-normal loss on the outputs, backward: the rendered images and
              the gradients of means, quats, scales, opacities and colours.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import splat  # noqa: E402
import splat._backend as backend  # noqa: E402
import splat.rasterize  # noqa: E402
import splat.rasterize_3dgs  # noqa: E402
from splat._native import kernels  # noqa: E402
from splat.losses import depth_normal_consistency_loss, ssim  # noqa: E402
from splat.testing import surface_scene  # noqa: E402

# the modules (the package exports functions of the same names)
rasterize_mod, rasterize_3dgs_mod = sys.modules["splat.rasterize"], sys.modules["splat.rasterize_3dgs"]


def load_old(path: str):
    spec = importlib.util.spec_from_file_location("splat._C", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def same(a, b) -> bool:
    """Byte equality (NaNs included) of tensors or lists of them."""
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if not isinstance(a, torch.Tensor):
        return a == b
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and a.contiguous().view(-1).view(torch.uint8).equal(b.contiguous().view(-1).view(torch.uint8))
    )


def use(ext):
    """Routes splat's autograd functions to `ext`."""
    for module in (backend, rasterize_mod, rasterize_3dgs_mod):
        module.load_extension = lambda: ext


def scene(n, size, dtype, seed):
    s = surface_scene(n, size, size, dtype=dtype, seed=seed)
    g = torch.Generator().manual_seed(seed)
    s["coeffs"] = (torch.randn(n, 16, 3, generator=g) * 0.2).to(dtype)
    return s


def autograd_case(ext, s, primitive):
    """Renders, losses, backward; returns every output and gradient."""
    use(ext)
    leaves = {k: s[k].clone().requires_grad_(True) for k in ("means", "quats", "scales", "opacities", "coeffs")}
    if primitive == "3dgs":  # a thin third axis
        third = leaves["scales"].detach().min(-1, keepdim=True).values * 0.3
        leaves["scales"] = torch.cat([leaves["scales"].detach(), third], -1).requires_grad_(True)
    fn = splat.rasterize if primitive == "surfels" else splat.rasterize_3dgs
    out = fn(
        leaves["means"], leaves["quats"], leaves["scales"], leaves["opacities"], leaves["coeffs"],
        s["viewmat"], s["K"], s["width"], s["height"], sh_degree=3, backend="cpu",
    )  # fmt: skip
    g = torch.Generator().manual_seed(1)
    gt = torch.rand(out.rgb.shape, generator=g).to(out.rgb.dtype)
    loss = (1 - ssim(out.rgb, gt)) + depth_normal_consistency_loss(
        out.depth, out.normal, out.alpha, s["K"], s["viewmat"]
    )
    for name in ("alpha", "depth", "median_depth", "distortion"):
        loss = loss + (getattr(out, name) * torch.rand(getattr(out, name).shape, generator=g).to(loss.dtype)).sum()
    out.means2d.retain_grad()
    loss.backward()
    images = {k: getattr(out, k).detach() for k in ("rgb", "alpha", "depth", "median_depth", "normal", "distortion")}
    images["radii"] = out.radii
    grads = {f"grad_{k}": v.grad for k, v in leaves.items()}
    grads["grad_means2d"] = out.means2d.grad
    return {"loss": loss.detach(), **images, **grads}


def _packed_payload(packed, rect):
    """The defined bytes of the SIMD kernels' packed surfel records (96 bytes
    each): culled surfels' records are never written, and the last 4 bytes are
    padding, so both are uninitialised memory (they differ between two runs of
    the old extension too)."""
    if packed.numel() == 0:
        return packed
    drawn = (rect[:, 2] > rect[:, 0]) & (rect[:, 3] > rect[:, 1])
    return packed.view(-1, 96)[drawn, :92]


def op_cases(ext, s):
    """Every op called directly on the scene; returns name -> outputs."""
    dtype = s["means"].dtype
    g = torch.Generator().manual_seed(2)
    res = {}
    lim = rasterize_mod._magnitude_limits(dtype)
    args = (s["means"], s["quats"], s["scales"], s["opacities"], s["coeffs"], 3, s["viewmat"], s["K"])
    image = (s["width"], s["height"], 0.2, 100.0)
    proj = ext.project_forward_cpu(*args, *image, *lim)
    res["project_forward"] = proj
    n = s["means"].shape[0]
    ups = [torch.randn(n, c, generator=g).to(dtype) for c in (9, 2, 3, 3)]
    res["project_backward"] = ext.project_backward_cpu(*args, *image, *ups)
    raster_in = (proj[0], proj[1], proj[2], proj[3], s["opacities"], proj[4], proj[5])
    fwd = ext.forward_cpu(*raster_in, *image)
    res["forward"] = fwd[:11] + [_packed_payload(fwd[11], proj[5])]
    H, W = s["height"], s["width"]
    up = [
        torch.randn(*shape, generator=g).to(dtype) for shape in ((H, W, 3), (H, W), (H, W), (H, W, 3), (H, W), (H, W))
    ]
    state = [fwd[9], fwd[10], fwd[6], fwd[7], fwd[1], fwd[8]]
    res["backward"] = ext.backward_cpu(*raster_in, *image, *state, *up, fwd[11])
    res["backward_repacked"] = ext.backward_cpu(*raster_in, *image, *state, *up, torch.empty(0, dtype=torch.uint8))
    # 3D Gaussians: the kernel inputs of splat.rasterize_3dgs
    params = torch.randn(n, ext.gauss_params_size, generator=g).to(dtype) * 0.01
    # (raw random records: the autograd level covers real Gaussian parameters)
    rect = proj[5]
    gin = (params, proj[3] if proj[3].numel() else torch.rand(n, 3, generator=g).to(dtype), proj[4], rect)
    gf = ext.forward_gaussians_cpu(*gin, *image)
    res["forward_gaussians"] = gf
    gstate = [gf[9], gf[10], gf[6], gf[7], gf[1], gf[8]]
    res["backward_gaussians"] = ext.backward_gaussians_cpu(*gin, *image, *gstate, *up)
    x, y = torch.rand(H, W, 3, generator=g).to(dtype), torch.rand(H, W, 3, generator=g).to(dtype)
    window = torch.tensor([0.1, 0.2, 0.4, 0.2, 0.1], dtype=dtype)
    m, maps = ext.ssim_forward_cpu(x, y, window, 1e-4, 9e-4, True)
    res["ssim_forward"] = [m, maps]
    res["ssim_backward"] = ext.ssim_backward_cpu(x, y, window, 1e-4, 9e-4, maps, 0.37)
    depth, normal, alpha = (
        torch.rand(H, W, generator=g).to(dtype) + 1,
        torch.randn(H, W, 3, generator=g).to(dtype),
        x[..., 0],
    )
    alpha = alpha.contiguous()
    res["normal_loss_forward"] = ext.normal_loss_forward_cpu(depth, normal, alpha, s["K"], s["viewmat"])
    res["normal_loss_backward"] = ext.normal_loss_backward_cpu(depth, normal, alpha, s["K"], s["viewmat"], 0.5)
    if dtype == torch.float32:
        res["exp_float32"] = ext.exp_float32(torch.randn(4096, generator=g) * 30)
    return res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old-extension", required=True, help="the former splat._C .so to compare against")
    parser.add_argument("--surfels", type=int, default=3000)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    old, new = load_old(args.old_extension), kernels()
    cases, failures = [], []
    for dtype in (torch.float32, torch.float64):
        for mode in (0, 1, 2):
            old.set_cpu_kernel_mode(mode)
            new.set_cpu_kernel_mode(mode)
            s = scene(args.surfels, args.size, dtype, seed=mode)
            compared = 0
            a, b = op_cases(old, s), op_cases(new, s)
            for key in a:
                compared += 1
                if not same(a[key], b[key]):
                    failures.append(f"ops {key} {dtype} mode {mode}")
            for primitive in ("surfels", "3dgs"):
                a, b = autograd_case(old, s, primitive), autograd_case(new, s, primitive)
                for key in a:
                    compared += 1
                    if not same(a[key], b[key]):
                        failures.append(f"autograd {primitive} {key} {dtype} mode {mode}")
            cases.append({"dtype": str(dtype), "cpu_kernel_mode": mode, "comparisons": compared})
    result = {
        "what": "old splat._C vs the C-ABI library, same inputs, byte equality of every output and gradient",
        "command": "python bench/wheel_bitwise.py --old-extension OLD/splat/_C*.so",
        "surfels": args.surfels,
        "size": args.size,
        "threads": torch.get_num_threads(),
        "cases": cases,
        "failures": failures,
        "bitwise_equal": not failures,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
