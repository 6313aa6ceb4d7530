"""Bitwise guard for a change to the CPU rasterizer kernels that must not change
any bit: renders the same scenes with the compiled kernels of several source
trees (each with its built ``splat/_C*.so``) and checks that every output and
every gradient is ``torch.equal`` across them.  Prints JSON (and writes it with
--out).  Not a test: it needs two built trees.

    python bench/bitwise_kernels.py --roots OLD_TREE NEW_TREE --out bench/results/x.json

Cases: surfels (splat.rasterize) and 3D Gaussians (splat.rasterize_3dgs,
plain and antialiased), float32 and float64, several seeds and image sizes
(non-multiples of the 16-pixel tile), a scene with primitives behind the
camera, a clustered one that leaves most tiles empty, and a trained-like
surface scene; each in every CPU kernel mode (0 reference, 1 scalar, 2 SIMD).
Compared per case: rgb, alpha, depth, median_depth, normal, distortion,
radii, the raw kernel sums, and the gradients of a random weighting of all
outputs with respect to means, quats, scales, opacities, colours and means2d.
Every tree runs in its own process with the same OMP_NUM_THREADS.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

SIZES = [(16, 16), (37, 23), (64, 48), (100, 75), (128, 96)]
SEEDS = [0, 1, 2]
MODES = [0, 1, 2]
OUTPUTS = ("rgb", "alpha", "depth", "median_depth", "normal", "distortion", "radii")
PARAMS = ("means", "quats", "scales", "opacities", "colors")


def _scenes(dtype):
    """(name, scene dict, primitive) for every case of one dtype."""
    import torch

    from splat.testing import random_gaussians, random_scene, surface_scene

    for seed in SEEDS:
        for w, h in SIZES:
            n = max(40, w * h // 20)
            scene = random_scene(n, w, h, dtype=dtype, seed=seed)
            gauss = random_gaussians(n, seed=seed, dtype=dtype)
            yield f"random_s{seed}_{w}x{h}", scene, "2dgs"
            yield f"random_s{seed}_{w}x{h}", {**scene, **gauss}, "3dgs"
        # a tenth of the primitives behind the camera (it sits at z = -4 looking at +z)
        scene = random_scene(400, 64, 48, dtype=dtype, seed=seed)
        gauss = random_gaussians(400, seed=seed, dtype=dtype)
        for s in (scene, gauss):
            s["means"] = s["means"].clone()
            s["means"][::10, 2] = -6.0
        yield f"behind_s{seed}", scene, "2dgs"
        yield f"behind_s{seed}", {**scene, **gauss}, "3dgs"
        # clustered in a corner of a larger image: most tiles empty
        scene = random_scene(200, 160, 120, dtype=dtype, seed=seed, scale_range=(0.02, 0.08))
        gauss = random_gaussians(200, seed=seed, dtype=dtype, spread=(0.3, 0.2, 0.3), scale_range=(0.02, 0.08))
        scene["means"] = scene["means"] * 0.2 + torch.tensor([0.8, 0.6, 0.0], dtype=dtype)
        gauss["means"] = gauss["means"] + torch.tensor([0.8, 0.6, 0.0], dtype=dtype)
        yield f"sparse_s{seed}", scene, "2dgs"
        yield f"sparse_s{seed}", {**scene, **gauss}, "3dgs"
        # trained-like sizes and opacities, 3D Gaussians flattened like bench/rasterize.py's
        scene = surface_scene(3000, 96, 80, dtype=dtype, seed=seed)
        yield f"surface_s{seed}", scene, "2dgs"
        s = scene["scales"]
        yield f"surface_s{seed}", {**scene, "scales": torch.cat([s, 0.3 * s.amin(-1, keepdim=True)], -1)}, "3dgs"


def _render(scene, primitive, antialiased):
    import torch

    import splat
    from splat.rasterize_3dgs import rasterize_3dgs

    params = {k: scene[k].clone().requires_grad_(True) for k in PARAMS}
    args = {**scene, **params, "backend": "cpu"}
    out = rasterize_3dgs(**args, antialiased=antialiased) if primitive == "3dgs" else splat.rasterize(**args)
    out.means2d.retain_grad()
    g = torch.Generator().manual_seed(1234)
    loss = 0
    for name in OUTPUTS[:-1]:
        t = getattr(out, name)
        loss = loss + (t * torch.rand(t.shape, generator=g, dtype=torch.float64).to(t.dtype)).sum()
    loss.backward()
    result = {name: getattr(out, name).detach() for name in OUTPUTS}
    result.update({f"grad_{k}": params[k].grad for k in PARAMS})
    result["grad_means2d"] = out.means2d.grad
    return result


def _raw_kernel(scene, primitive):
    """The kernel's own forward outputs (sums, end, median index, totals)."""
    import torch

    from splat._backend import load_extension
    from splat.rasterize import _project
    from splat.rasterize_3dgs import gaussian_kernel_inputs

    ext = load_extension()
    w, h = scene["width"], scene["height"]
    geometry = [scene[k] for k in ("means", "quats", "scales", "opacities", "viewmat", "K")]
    with torch.no_grad():
        if primitive == "3dgs":
            kin = gaussian_kernel_inputs(*geometry, w, h, 0.2, 100.0)
            colors = scene["colors"][kin["ids"]].contiguous()
            res = ext.forward_gaussians_cpu(kin["params"], colors, kin["depth"], kin["pixel_rect"], w, h, 0.2, 100.0)
        else:
            p = _project(*geometry, w, h, 0.2, 100.0)
            res = ext.forward_cpu(
                p["Tuvw"].contiguous(),
                p["center"].contiguous(),
                p["normal"].contiguous(),
                scene["colors"],
                scene["opacities"],
                p["depth"],
                p["pixel_rect"],
                w,
                h,
                0.2,
                100.0,
            )
    # uint8 results are the SIMD kernels' packed records handed to the backward:
    # scratch with padding bytes and skipped (culled) entries, not outputs.
    return {f"kernel_{i}": t for i, t in enumerate(res) if isinstance(t, torch.Tensor) and t.dtype != torch.uint8}


def child(out_path):
    import torch

    from splat._backend import load_extension

    ext = load_extension()
    results = {}
    for dtype in (torch.float32, torch.float64):
        for name, scene, primitive in _scenes(dtype):
            variants = [("", False)] + ([("_aa", True)] if primitive == "3dgs" else [])
            for mode in MODES:
                ext.set_cpu_kernel_mode(mode)
                for suffix, aa in variants:
                    key = f"{primitive}{suffix}/{str(dtype)[6:]}/{name}/mode{mode}"
                    r = _render(scene, primitive, aa)
                    if not aa:
                        r.update(_raw_kernel(scene, primitive))
                    results[key] = r
    ext.set_cpu_kernel_mode(2)
    torch.save(results, out_path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--roots", nargs="+", required=True, help="source trees to compare (each with its built _C)")
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS for every tree")
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--child", nargs=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0])
        return
    import torch

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, root in enumerate(args.roots):
            path = os.path.join(tmp, f"{i}.pt")
            env = {**os.environ, "PYTHONPATH": os.path.abspath(root), "OMP_NUM_THREADS": str(args.threads)}
            subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--roots", root, "--child", path],
                env=env,
                check=True,
                cwd=os.path.abspath(root),
            )
            runs.append(torch.load(path))
    base = runs[0]
    mismatches, compared = [], 0
    for key, tensors in base.items():
        for other_i, other in enumerate(runs[1:], 1):
            for name, t in tensors.items():
                compared += 1
                u = other[key].get(name)
                if u is None or not torch.equal(t, u):
                    diff = None if u is None or t.shape != u.shape else float((t.double() - u.double()).abs().max())
                    mismatches.append({"case": key, "tensor": name, "root": args.roots[other_i], "max_abs_diff": diff})
    report = {
        "command": "python bench/bitwise_kernels.py " + " ".join(sys.argv[1:]),
        "roots": args.roots,
        "threads": args.threads,
        "cases": len(base),
        "tensors_compared": compared,
        "mismatches": len(mismatches),
        "first_mismatches": mismatches[:40],
        "bitwise_equal": not mismatches,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
