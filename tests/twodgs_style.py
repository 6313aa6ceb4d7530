"""2DGS's own code, written out for the tests and the benchmark of the diff_surfel_rasterization shim.

Camera formulas (utils/graphics_utils.py, scene/cameras.py), its kernel's
ndc2Pix, its renderer's precomputed transform and depth_to_normal, and a
trainer in the shape of its train.py and GaussianModel (create_from_pcd,
Adam groups, the exponential position learning rate, add_densification_stats,
densify_and_clone / densify_and_split / prune, reset_opacity), rendering
through ``diff_surfel_rasterization``'s interface: splat's shim.  Facts and
formulas from hbb1/2d-gaussian-splatting, written anew.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from splat.compat.diff_surfel_rasterization import (
    GaussianRasterizationSettings,
    GaussianRasterizer,
)
from splat.geometry import quat_to_rotmat
from splat.losses import ssim

SH_C0 = 0.28209479177387814


def getWorld2View2(R, t, translate=(0.0, 0.0, 0.0), scale=1.0):
    Rt = np.zeros((4, 4))
    Rt[:3, :3] = R.transpose()
    Rt[:3, 3] = t
    Rt[3, 3] = 1.0
    C2W = np.linalg.inv(Rt)
    C2W[:3, 3] = (C2W[:3, 3] + np.asarray(translate)) * scale
    return np.float32(np.linalg.inv(C2W))


def getProjectionMatrix(znear, zfar, fovX, fovY, shift=(0.0, 0.0), dtype=torch.float32):
    """2DGS's projection; ``shift`` (not in 2DGS) moves the window as forks do for off-centre cameras."""
    top = math.tan(fovY / 2) * znear
    right = math.tan(fovX / 2) * znear
    bottom, left = -top, -right
    left, right = left + shift[0] * right, right + shift[0] * right
    bottom, top = bottom + shift[1] * top, top + shift[1] * top
    P = torch.zeros(4, 4, dtype=dtype)
    P[0, 0] = 2.0 * znear / (right - left)
    P[1, 1] = 2.0 * znear / (top - bottom)
    P[0, 2] = (right + left) / (right - left)
    P[1, 2] = (top + bottom) / (top - bottom)
    P[3, 2] = 1.0
    P[2, 2] = zfar / (zfar - znear)
    P[2, 3] = -(zfar * znear) / (zfar - znear)
    return P


def fov2focal(fov, pixels):
    return pixels / (2 * math.tan(fov / 2))


def focal2fov(focal, pixels):
    return 2 * math.atan(pixels / (2 * focal))


class Cam:
    """2DGS's Camera: R is the camera-to-world rotation (COLMAP's transposed), T the world->camera translation."""

    def __init__(self, R, T, FoVx, FoVy, width, height, shift=(0.0, 0.0), dtype=torch.float32):
        self.FoVx, self.FoVy, self.image_width, self.image_height = FoVx, FoVy, width, height
        self.znear, self.zfar = 0.01, 100.0
        self.world_view_transform = torch.tensor(getWorld2View2(R, T), dtype=dtype).transpose(0, 1)
        self.projection_matrix = getProjectionMatrix(self.znear, self.zfar, FoVx, FoVy, shift, dtype).transpose(0, 1)
        self.full_proj_transform = self.world_view_transform.unsqueeze(0).bmm(self.projection_matrix.unsqueeze(0))[0]
        self.camera_center = self.world_view_transform.inverse()[3, :3]


def cam_from_viewmat(viewmat, width, height, fov_x, fov_y=None, shift=(0.0, 0.0)):
    """A 2DGS camera seeing what the OpenCV world->camera ``viewmat`` sees."""
    vm = viewmat.double().numpy()
    fov_y = fov_y if fov_y is not None else focal2fov(fov2focal(fov_x, width), height)
    return Cam(vm[:3, :3].T, vm[:3, 3], fov_x, fov_y, width, height, shift)


def settings_for(
    cam,
    bg=(0.0, 0.0, 0.0),
    sh_degree=0,
    scale_modifier=1.0,
    prefiltered=False,
    debug=False,
    campos=None,
    dtype=torch.float32,
):
    """What 2DGS's render() passes."""
    return GaussianRasterizationSettings(
        image_height=int(cam.image_height),
        image_width=int(cam.image_width),
        tanfovx=math.tan(cam.FoVx * 0.5),
        tanfovy=math.tan(cam.FoVy * 0.5),
        bg=torch.tensor(bg, dtype=dtype),
        scale_modifier=scale_modifier,
        viewmatrix=cam.world_view_transform,
        projmatrix=cam.full_proj_transform,
        sh_degree=sh_degree,
        campos=cam.camera_center if campos is None else campos,
        prefiltered=prefiltered,
        debug=debug,
    )


def ndc2pix(v, S):
    """2DGS's kernel: NDC to its pixel coordinate, where pixel j's centre is at j."""
    return ((v + 1.0) * S - 1.0) * 0.5


def two_dgs_transform(cam, means, quats, scales, scale_modifier=1.0):
    """2DGS's renderer with compute_cov3D_python: splat2world [N, 4, 4] (row vectors),
    world2pix = full_proj_transform @ ndc2pix (centre (W-1)/2), the [N, 9] transform."""
    n = means.shape[0]
    R = quat_to_rotmat(quats)  # build_rotation: the same (w, x, y, z) quaternion
    L = R * torch.cat([scales * scale_modifier, torch.ones_like(scales[:, :1])], -1)[:, None, :]
    trans = torch.zeros(n, 4, 4, dtype=means.dtype)
    trans[:, :3, :3] = L.permute(0, 2, 1)
    trans[:, 3, :3] = means
    trans[:, 3, 3] = 1
    W, H = cam.image_width, cam.image_height
    near, far = cam.znear, cam.zfar
    ndc = torch.tensor(
        [[W / 2, 0, 0, (W - 1) / 2], [0, H / 2, 0, (H - 1) / 2], [0, 0, far - near, near], [0, 0, 0, 1]],
        dtype=means.dtype,
    ).T
    world2pix = cam.full_proj_transform.to(means.dtype) @ ndc
    return (trans[:, [0, 1, 3]] @ world2pix[:, [0, 1, 3]]).permute(0, 2, 1).reshape(-1, 9)


# ---------------------------------------------------------------------------
# The renderer and the trainer
# ---------------------------------------------------------------------------
def depth_to_normal(view, depth):
    """2DGS's utils/point_utils.py: points from the depth map, normals from central differences."""
    c2w = (view.world_view_transform.T).inverse()
    W, H = view.image_width, view.image_height
    ndc2pix_m = torch.tensor([[W / 2, 0, 0, W / 2], [0, H / 2, 0, H / 2], [0, 0, 0, 1]]).float().T
    intrins = ((c2w.T @ view.full_proj_transform) @ ndc2pix_m)[:3, :3].T
    gx, gy = torch.meshgrid(torch.arange(W).float(), torch.arange(H).float(), indexing="xy")
    pts = torch.stack([gx, gy, torch.ones_like(gx)], -1).reshape(-1, 3)
    rays_d = pts @ intrins.inverse().T @ c2w[:3, :3].T
    points = (depth.reshape(-1, 1) * rays_d + c2w[:3, 3]).reshape(H, W, 3)
    out = torch.zeros_like(points)
    dx = points[2:, 1:-1] - points[:-2, 1:-1]
    dy = points[1:-1, 2:] - points[1:-1, :-2]
    out[1:-1, 1:-1] = torch.nn.functional.normalize(torch.linalg.cross(dx, dy, dim=-1), dim=-1)
    return out


def render(view, model, bg):
    """2DGS's gaussian_renderer.render (depth_ratio 0), through the shim."""
    xyz = model["xyz"]
    screenspace_points = torch.zeros_like(xyz, requires_grad=True) + 0
    if screenspace_points.requires_grad:  # 2DGS: try/except around it, for no_grad rendering
        screenspace_points.retain_grad()
    settings = GaussianRasterizationSettings(
        image_height=int(view.image_height),
        image_width=int(view.image_width),
        tanfovx=math.tan(view.FoVx * 0.5),
        tanfovy=math.tan(view.FoVy * 0.5),
        bg=bg,
        scale_modifier=1.0,
        viewmatrix=view.world_view_transform,
        projmatrix=view.full_proj_transform,
        sh_degree=model["active_sh"],
        campos=view.camera_center,
        prefiltered=False,
        debug=False,
    )
    rendered, radii, allmap = GaussianRasterizer(raster_settings=settings)(
        means3D=xyz,
        means2D=screenspace_points,
        shs=torch.cat([model["f_dc"], model["f_rest"]], 1),
        colors_precomp=None,
        opacities=torch.sigmoid(model["opacity"]),
        scales=torch.exp(model["scaling"]),
        rotations=torch.nn.functional.normalize(model["rotation"]),
        cov3D_precomp=None,
    )
    render_alpha = allmap[1:2]
    render_normal = (allmap[2:5].permute(1, 2, 0) @ view.world_view_transform[:3, :3].T).permute(2, 0, 1)
    surf_depth = torch.nan_to_num(allmap[0:1] / render_alpha, 0, 0)  # expected depth
    surf_normal = depth_to_normal(view, surf_depth).permute(2, 0, 1) * render_alpha.detach()
    return dict(
        render=rendered,
        viewspace_points=screenspace_points,
        visibility_filter=radii > 0,
        radii=radii,
        rend_normal=render_normal,
        rend_dist=allmap[6:7],
        surf_normal=surf_normal,
    )


@dataclass
class OptimizationParams:
    """2DGS's arguments.OptimizationParams defaults, plus the steps its train.py
    hard-codes (distortion after 3000, normal loss after 7000, SH up every 1000)."""

    iterations: int = 30_000
    position_lr_init: float = 0.00016
    position_lr_final: float = 0.0000016
    position_lr_max_steps: int = 30_000
    feature_lr: float = 0.0025
    opacity_lr: float = 0.05
    scaling_lr: float = 0.005
    rotation_lr: float = 0.001
    percent_dense: float = 0.01
    lambda_dssim: float = 0.2
    lambda_dist: float = 0.0
    lambda_normal: float = 0.05
    opacity_cull: float = 0.05
    densification_interval: int = 100
    opacity_reset_interval: int = 3000
    densify_from_iter: int = 500
    densify_until_iter: int = 15_000
    densify_grad_threshold: float = 0.0002
    dist_from: int = 3000
    normal_from: int = 7000
    sh_up_every: int = 1000
    #: train.py also resets opacities at densify_from_iter on a white background
    reset_at_densify_from_on_white: bool = True


def learning_rates(opt, extent):
    """GaussianModel.training_setup's Adam groups (xyz scaled by the scene extent)."""
    return {
        "xyz": opt.position_lr_init * extent,
        "f_dc": opt.feature_lr,
        "f_rest": opt.feature_lr / 20.0,
        "opacity": opt.opacity_lr,
        "scaling": opt.scaling_lr,
        "rotation": opt.rotation_lr,
    }


def create_from_pcd(points, colors, g, sh_degree=3):
    """GaussianModel.create_from_pcd: SH DC from the colours, scales the root mean
    squared distance to the 3 nearest neighbours (distCUDA2), random rotations, opacity 0.1."""
    n = points.shape[0]
    dist2 = torch.cat(
        [
            torch.cdist(chunk, points).pow(2).topk(4, largest=False).values[:, 1:].mean(-1)
            for chunk in points.split(2048)
        ]
    ).clamp_min(1e-7)
    return {
        "xyz": points.float(),
        "f_dc": ((colors.float() - 0.5) / SH_C0)[:, None, :],
        "f_rest": torch.zeros(n, (sh_degree + 1) ** 2 - 1, 3),
        "scaling": torch.log(torch.sqrt(dist2))[:, None].repeat(1, 2).float(),
        "rotation": torch.rand(n, 4, generator=g),
        "opacity": torch.logit(torch.full((n, 1), 0.1)),
        "active_sh": 0,
        "max_sh": sh_degree,
    }


def _replace_params(model, optimizer, make):
    """2DGS's _prune_optimizer / cat_tensors_to_optimizer / replace_tensor_to_optimizer:
    new tensors and Adam moments by ``make(old, name, is_moment)``."""
    for group in optimizer.param_groups:
        old = group["params"][0]
        new = torch.nn.Parameter(make(old.detach(), group["name"], False))
        state = optimizer.state.pop(old, None)
        if state:
            state["exp_avg"] = make(state["exp_avg"], group["name"], True)
            state["exp_avg_sq"] = make(state["exp_avg_sq"], group["name"], True)
            optimizer.state[new] = state
        group["params"][0] = new
        model[group["name"]] = new


def densify_and_prune(model, optimizer, stats, opt, extent, max_screen_size):
    """2DGS's densify_and_clone, densify_and_split (N = 2) and pruning."""
    names = [g["name"] for g in optimizer.param_groups]
    grads = stats["accum"] / stats["denom"]
    grads[grads.isnan()] = 0.0
    scaling = torch.exp(model["scaling"].detach())
    big = scaling.max(dim=1).values > opt.percent_dense * extent
    selected = grads.norm(dim=-1) >= opt.densify_grad_threshold
    clone, split = selected & ~big, selected & big
    cloned = {k: model[k].detach()[clone] for k in names}
    # split: two samples in the tangent plane (no spread along the normal), scales / (0.8 N)
    stds = torch.cat([scaling[split], torch.zeros_like(scaling[split][:, :1])], -1).repeat(2, 1)
    samples = torch.normal(torch.zeros_like(stds), stds)
    rots = quat_to_rotmat(model["rotation"].detach()[split]).repeat(2, 1, 1)
    halves = {k: model[k].detach()[split].repeat(2, *[1] * (model[k].dim() - 1)) for k in names}
    halves["xyz"] = torch.bmm(rots, samples[..., None])[..., 0] + model["xyz"].detach()[split].repeat(2, 1)
    halves["scaling"] = torch.log(scaling[split].repeat(2, 1) / (0.8 * 2))
    added = {k: torch.cat([cloned[k], halves[k]]) for k in names}
    _replace_params(
        model,
        optimizer,
        lambda t, name, moment: torch.cat([t, torch.zeros_like(added[name]) if moment else added[name]]),
    )
    n_added = added["xyz"].shape[0]
    prune = torch.cat([split, torch.zeros(n_added, dtype=torch.bool)])
    prune |= (torch.sigmoid(model["opacity"].detach()) < opt.opacity_cull).squeeze(-1)
    if max_screen_size:
        max_radii = torch.cat([stats["max_radii"], torch.zeros(n_added)])
        prune |= (max_radii > max_screen_size) | (torch.exp(model["scaling"].detach()).amax(1) > 0.1 * extent)
    _replace_params(model, optimizer, lambda t, name, moment: t[~prune])
    n = model["xyz"].shape[0]
    stats.update(accum=torch.zeros(n, 1), denom=torch.zeros(n, 1), max_radii=torch.zeros(n))
    return int(clone.sum()), int(split.sum())


def reset_opacity(model, optimizer):
    """2DGS's reset_opacity: opacities capped at 0.01, their Adam moments zeroed."""
    capped = torch.logit(torch.clamp_max(torch.sigmoid(model["opacity"].detach()), 0.01))
    _replace_params(
        model,
        optimizer,
        lambda t, name, moment: t if name != "opacity" else (torch.zeros_like(t) if moment else capped),
    )


def train(views, model, opt, g, bg, extent, log_every=0):
    """2DGS's train.py loop.  ``views`` carry 2DGS's camera fields and
    ``original_image`` [3, H, W]; returns (model, counters)."""
    rates = learning_rates(opt, extent)
    for k in rates:
        model[k] = torch.nn.Parameter(model[k])
    optimizer = torch.optim.Adam([{"params": [model[k]], "lr": rates[k], "name": k} for k in rates], lr=0.0, eps=1e-15)
    n = model["xyz"].shape[0]
    stats = dict(accum=torch.zeros(n, 1), denom=torch.zeros(n, 1), max_radii=torch.zeros(n))
    white = bool((bg == 1).all()) and opt.reset_at_densify_from_on_white
    counters = dict(cloned=0, split=0, grad_peak=0.0, resets=0)
    stack, start = [], time.perf_counter()
    for iteration in range(1, opt.iterations + 1):
        t = min(iteration / opt.position_lr_max_steps, 1.0)  # get_expon_lr_func, no delay
        optimizer.param_groups[0]["lr"] = math.exp(
            (1 - t) * math.log(opt.position_lr_init * extent) + t * math.log(opt.position_lr_final * extent)
        )
        if iteration % opt.sh_up_every == 0:
            model["active_sh"] = min(model["active_sh"] + 1, model["max_sh"])
        if not stack:
            stack = list(range(len(views)))
        view = views[stack.pop(int(torch.randint(len(stack), (1,), generator=g)))]
        pkg = render(view, model, bg)
        image, gt = pkg["render"], view.original_image
        Ll1 = (image - gt).abs().mean()
        loss = (1.0 - opt.lambda_dssim) * Ll1 + opt.lambda_dssim * (
            1.0 - ssim(image.permute(1, 2, 0), gt.permute(1, 2, 0))
        )
        lambda_normal = opt.lambda_normal if iteration > opt.normal_from else 0.0
        lambda_dist = opt.lambda_dist if iteration > opt.dist_from else 0.0
        normal_error = (1 - (pkg["rend_normal"] * pkg["surf_normal"]).sum(dim=0))[None]
        total = loss + lambda_dist * pkg["rend_dist"].mean() + lambda_normal * normal_error.mean()
        total.backward()
        with torch.no_grad():
            vis, grad = pkg["visibility_filter"], pkg["viewspace_points"].grad
            counters["grad_peak"] = max(counters["grad_peak"], float(grad[vis, :2].norm(dim=-1).max()))
            if iteration < opt.densify_until_iter:
                stats["max_radii"][vis] = torch.max(stats["max_radii"][vis], pkg["radii"][vis].float())
                stats["accum"][vis] += torch.norm(grad[vis, :2], dim=-1, keepdim=True)
                stats["denom"][vis] += 1
                if iteration > opt.densify_from_iter and iteration % opt.densification_interval == 0:
                    size_threshold = 20 if iteration > opt.opacity_reset_interval else None
                    c, s = densify_and_prune(model, optimizer, stats, opt, extent, size_threshold)
                    counters["cloned"] += c
                    counters["split"] += s
                # A reset on the last step would be the final model's (no step follows it): skipped.
                if (
                    iteration % opt.opacity_reset_interval == 0 or (white and iteration == opt.densify_from_iter)
                ) and iteration < opt.iterations:
                    reset_opacity(model, optimizer)
                    counters["resets"] += 1
            if iteration < opt.iterations:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if log_every and iteration % log_every == 0:
                print(
                    f"step {iteration}: loss {float(loss):.4f}, {model['xyz'].shape[0]} surfels, "
                    f"{time.perf_counter() - start:.0f} s",
                    flush=True,
                )
    return model, counters
