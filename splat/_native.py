"""The kernels' C libraries (splat/kernels/splat_api.h), loaded with
ctypes: no torch C++ ABI and no Python extension module, so one build serves
every torch and CPython.

``kernels()`` returns an object with the operations of the former torch
extension (forward_cpu, backward_cpu, forward_gaussians_cpu, project_*,
ssim_*, normal_loss_*, exp_float32, the CPU kernel mode and scratch cache),
with the same arguments and results, so the autograd code calls them as before.
Inputs are checked here (the C side receives pointers and sizes only), and a
failure in the library comes back as an error code and a one-line message,
raised as RuntimeError.  Outputs the library allocates (in its reused scratch
memory) arrive as DLPack tensors and are adopted without a copy.
"""

from __future__ import annotations

import ctypes
import os
import threading
from functools import cache
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
_API_VERSION = 3
_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_INT = ctypes.c_int
_F64 = ctypes.c_double
_ERR = ctypes.c_char_p
_SIZE = ctypes.c_size_t
_PP = ctypes.POINTER(ctypes.c_void_p)
_I64P = ctypes.POINTER(ctypes.c_int64)
_CALL_TAIL = [_ERR, _SIZE]

# name: argument types before (err, err_len); every function returns int.
_SIGNATURES = {
    "splat_forward_cpu": [_INT, _PP, _I64, _I64, _I64, _F64, _F64, _INT, _PP],
    "splat_backward_cpu": [_INT, _PP, _I64, _I64, _I64, _F64, _F64, _PP, _PP, _I64P, _P, _I64, _INT, _PP],
    "splat_forward_gaussians_cpu": [_INT, _PP, _I64, _I64, _I64, _F64, _F64, _INT, _PP],
    "splat_backward_gaussians_cpu": [_INT, _PP, _I64, _I64, _I64, _F64, _F64, _PP, _PP, _I64P, _INT, _PP],
    "splat_project_forward_cpu": [_INT, _PP, _I64, _I64, _I64, _P, _P, _I64, _I64, _F64, _F64, _F64, _F64, _INT]
    + [_PP],
    "splat_project_backward_cpu": [_INT, _PP, _I64, _I64, _I64, _P, _P, _I64, _I64, _F64, _F64, _PP, _I64P, _P]
    + [_INT, _PP],
    # -- the fused projection of 3D Gaussians (kept together: see splat_api.h) --
    "splat_project_gaussians_forward_cpu": [_INT, _PP, _I64, _P, _P, _P, _I64, _I64, _F64, _F64, _INT, _INT, _PP],
    "splat_project_gaussians_backward_cpu": [_INT, _PP, _I64, _I64, _P, _P, _P, _I64, _I64, _INT, _PP, _I64P, _INT]
    + [_INT, _PP],
    # -- end of the 3D Gaussians' projection --
    "splat_ssim_forward_cpu": [_INT, _P, _P, _P, _I64, _I64, _I64, _I64, _F64, _F64, _INT, _INT, _PP],
    "splat_ssim_backward_cpu": [_INT, _P, _P, _P, _I64, _I64, _I64, _I64, _F64, _F64, _P, _F64, _INT, _PP],
    "splat_normal_loss_forward_cpu": [_INT, _P, _P, _P, _P, _P, _I64, _I64, _INT, _PP],
    "splat_normal_loss_backward_cpu": [_INT, _P, _P, _P, _P, _P, _I64, _I64, _F64, _INT, _PP],
    "splat_exp_float32": [_P, _I64, _P, _P],
    "splat_set_cpu_kernel_mode": [_INT],
}

_DTYPES = {torch.float32: 0, torch.float64: 1}
_CAPSULE_NAME = b"dltensor"  # kept alive: the capsules point at it
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_from_capsule = getattr(torch._C, "_from_dlpack", None) or torch.utils.dlpack.from_dlpack
_local = threading.local()


def _err_buffer():
    buf = getattr(_local, "err", None)
    if buf is None:
        buf = _local.err = ctypes.create_string_buffer(512)
    return buf


def _adopt(pointers, count):
    """Tensors from the first `count` DLManagedTensor pointers."""
    return [_from_capsule(_capsule_new(pointers[i], _CAPSULE_NAME, None)) for i in range(count)]


def _fail(err):
    raise RuntimeError(err.value.decode(errors="replace") or "splat kernel failed")


def _dtype_code(t, name):
    code = _DTYPES.get(t.dtype)
    if code is None:
        raise RuntimeError(f"{name}: dtype {t.dtype} is not supported (float32 or float64)")
    return code


def _check_input(t, name, n, cols, dtype):
    """bindings' check_input: a contiguous CPU tensor of dtype with n rows, [n, cols] when cols > 0."""
    shape = t.shape
    if t.dtype == dtype and t.is_cpu and t.is_contiguous() and (shape == (n, cols) if cols else shape[:1] == (n,)):
        return  # the fast path: one expression, no message built
    if not t.is_cpu:
        raise RuntimeError(f"{name} must be a CPU tensor, got one on {t.device}")
    if not t.is_contiguous():
        raise RuntimeError(f"{name} must be contiguous")
    if t.dtype != dtype:
        raise RuntimeError(f"{name} has dtype {t.dtype}, expected {dtype}")
    if shape[:1] != (n,):
        raise RuntimeError(f"{name} has {shape[0] if t.dim() else 0} rows, expected {n}")
    raise RuntimeError(f"{name} must be [N, {cols}]")


def _check_rows(t, name, n, cols, dtype):
    """An [n, cols] matrix with unit column stride (rows may be strided)."""
    if t.dtype == dtype and t.shape == (n, cols) and t.stride(1) == 1 and t.stride(0) >= cols:
        return  # the fast path
    if t.dtype != dtype:
        raise RuntimeError(f"{name} has dtype {t.dtype}, expected {dtype}")
    if t.dim() != 2 or t.shape[0] != n or t.shape[1] != cols:
        raise RuntimeError(f"{name} must be [{n}, {cols}]")
    if t.stride(1) != 1 or t.stride(0) < cols:
        raise RuntimeError(f"{name} must have contiguous rows (unit column stride)")


def _pointers(tensors):
    return (ctypes.c_void_p * len(tensors))(*map(torch.Tensor.data_ptr, tensors))


_UP_NAMES = ("v_color_sum", "v_transmittance", "v_depth_sum", "v_normal_sum", "v_distortion", "v_median_depth")


def _upstream(ups, dtype, width, height):
    """The six upstream gradients' pointers and strides (raster_args.h UpstreamGrads):
    each contiguous, or broadcast to every pixel (stride 0)."""
    strides = (ctypes.c_int64 * 8)()
    image, rgb = (height, width), (height, width, 3)
    if all(t.dtype == dtype and t.is_contiguous() for t in ups) and all(
        t.shape == (rgb if a in (0, 3) else image) for a, t in enumerate(ups)
    ):  # the fast path: every gradient a whole contiguous image
        strides[:] = (3, 1, 1, 3, 1, 1, 1, 1)
        return _pointers(ups), strides
    for a, t in enumerate(ups):
        channels = 3 if a in (0, 3) else 0
        if (
            t.dtype != dtype
            or t.dim() != (3 if channels else 2)
            or t.shape[0] != height
            or t.shape[1] != width
            or (channels and t.shape[2] != channels)
        ):
            raise RuntimeError(f"{_UP_NAMES[a]} must be [H, W{', 3' if channels else ''}] of the input dtype")
        broadcast = t.stride(0) == 0 and t.stride(1) == 0 and (not channels or t.stride(2) <= 1)
        if not (t.is_contiguous() or broadcast):
            raise RuntimeError(f"{_UP_NAMES[a]} must be contiguous or broadcast to every pixel")
        strides[a] = 0 if broadcast else (channels or 1)
        if a == 0:
            strides[6] = t.stride(2)
        elif a == 3:
            strides[7] = t.stride(2)
    return _pointers(ups), strides


_STATE = (("tile_offsets", torch.int64), ("point_list", torch.int32), ("end", torch.int32))
_STATE += (("median_index", torch.int32),)


def _state(state, dtype, width, height):
    """forward's saved tile binning and per-pixel state, checked."""
    tiles = ((width + 15) // 16) * ((height + 15) // 16)
    tile_offsets, point_list, end, median_index, transmittance, totals = state
    for (name, want), t in zip(_STATE, state):
        if t.dtype != want or not t.is_contiguous():
            raise RuntimeError(f"{name} must be a contiguous {want} tensor")
    if tile_offsets.numel() != tiles + 1:
        raise RuntimeError(f"tile_offsets has {tile_offsets.numel()} entries, expected {tiles + 1}")
    if end.shape != (height, width) or median_index.shape != (height, width):
        raise RuntimeError(f"end and median_index must be [{height}, {width}]")
    if transmittance.dtype != dtype or not transmittance.is_contiguous() or transmittance.shape != (height, width):
        raise RuntimeError(f"transmittance must be a contiguous [{height}, {width}] tensor of the input dtype")
    if totals.dtype != dtype or not totals.is_contiguous() or totals.shape[:2] != (height, width):
        raise RuntimeError(f"totals must be a contiguous [{height}, {width}, 4] tensor of the input dtype")
    return _pointers(state)


def _camera(viewmat, K, dtype):
    """viewmat [4, 4] and K [3, 3] as contiguous CPU tensors of ``dtype``."""
    if (
        viewmat.dtype == dtype
        and K.dtype == dtype
        and viewmat.is_cpu
        and K.is_cpu
        and viewmat.is_contiguous()
        and K.is_contiguous()
        and viewmat.numel() == 16
        and K.numel() == 9
    ):
        return viewmat, K  # the fast path: no copies
    if viewmat.numel() != 16 or K.numel() != 9:
        raise RuntimeError("viewmat must be [4, 4] and K [3, 3]")
    cam = [m.to("cpu").contiguous() for m in (viewmat, K)]
    if cam[0].dtype != dtype or cam[1].dtype != dtype:
        raise RuntimeError(f"viewmat and K must have dtype {dtype}")
    return cam


def _threads():
    # torch's thread count, as the extension had when it shared torch's OpenMP
    return torch.get_num_threads()


def _cuda_extension():
    """The CUDA operations (splat._native_cuda: libsplat_cuda.so, else the
    torch extension splat._C of a source build), or None.  Looked for only
    once a CUDA op is asked for with a GPU present, so a CPU-only torch never
    touches them."""
    from splat._native_cuda import cuda_kernels

    return cuda_kernels()


class _GaussianProjection:
    """CpuKernels' operations of the fused 3D Gaussian projection
    (cpu/project_gaussians_cpu.h); a mixin, so that they stay in one block."""

    _lib: ctypes.CDLL
    gauss_params_size: int

    def _gauss_project_inputs(self, means, quats, scales, opacities, ids, viewmat, K, K_inv):
        n = means.shape[0]
        code, dtype = _dtype_code(means, "means"), means.dtype
        _check_input(means, "means", n, 3, dtype)
        _check_input(quats, "quats", n, 4, dtype)
        _check_input(scales, "scales", n, 3, dtype)
        _check_input(opacities, "opacities", n, 0, dtype)
        m = 0
        if ids is not None:
            m = ids.shape[0] if ids.dim() == 1 else -1
            _check_input(ids, "ids", m, 0, torch.int64)
        if viewmat.numel() != 16 or K.numel() != 9 or K_inv.numel() != 9:
            raise RuntimeError("viewmat must be [4, 4], K and K_inv [3, 3]")
        cam = [t.detach().to("cpu").contiguous() for t in (viewmat, K, K_inv)]
        if any(t.dtype != dtype for t in cam):
            raise RuntimeError(f"viewmat, K and K_inv must have dtype {dtype}")
        ins = _pointers((means, quats, scales, opacities) + (() if ids is None else (ids,)))
        return code, n, m, ins, cam

    def project_gaussians_forward_cpu(self, means, quats, scales, opacities, viewmat, K, K_inv, *rest):
        """Culls and projects: returns [ids, params, centre, depth, pixel_rect,
        radii, non-finite row count]."""
        width, height, near, far, antialiased = rest
        code, n, _, ins, cam = self._gauss_project_inputs(means, quats, scales, opacities, None, viewmat, K, K_inv)
        outs, err = (ctypes.c_void_p * 7)(), _err_buffer()
        if self._lib.splat_project_gaussians_forward_cpu(
            code, ins, n, *(t.data_ptr() for t in cam), width, height, near, far, int(bool(antialiased)),
            _threads(), outs, err, 512,
        ):  # fmt: skip
            _fail(err)
        return _adopt(outs, 7)

    def project_gaussians_backward_cpu(self, means, quats, scales, opacities, ids, viewmat, K, K_inv, *rest):
        """Returns [v_means, v_quats, v_scales, v_opacities, v_means2d] and,
        with_camera, [v_viewmat, v_K, v_K_inv]; v_centre may be None."""
        width, height, antialiased, v_params, v_centre, with_camera = rest
        code, n, m, ins, cam = self._gauss_project_inputs(means, quats, scales, opacities, ids, viewmat, K, K_inv)
        dtype = means.dtype
        _check_rows(v_params, "v_params", m, self.gauss_params_size, dtype)
        if v_centre is not None:
            _check_rows(v_centre, "v_centre", m, 2, dtype)
        grads = (ctypes.c_void_p * 2)(v_params.data_ptr(), None if v_centre is None else v_centre.data_ptr())
        strides = (ctypes.c_int64 * 2)(v_params.stride(0), 2 if v_centre is None else v_centre.stride(0))
        count = 8 if with_camera else 5
        outs, err = (ctypes.c_void_p * count)(), _err_buffer()
        if self._lib.splat_project_gaussians_backward_cpu(
            code, ins, n, m, *(t.data_ptr() for t in cam), width, height, int(bool(antialiased)), grads, strides,
            int(bool(with_camera)), _threads(), outs, err, 512,
        ):  # fmt: skip
            _fail(err)
        return _adopt(outs, count)


class CpuKernels(_GaussianProjection):
    """The CPU library's operations, with splat._C's former signatures; the
    *_cuda operations come from the CUDA library (or extension) when there is one."""

    @property
    def with_cuda(self) -> bool:
        return _cuda_extension() is not None

    def __getattr__(self, name):
        if name.endswith("_cuda") and _cuda_extension() is not None:
            return getattr(_cuda_extension(), name)
        raise AttributeError(f"splat's kernels have no operation {name!r} here (no CUDA kernels)")

    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        if lib.splat_api_version() != _API_VERSION:
            raise ImportError(f"{path} has C ABI version {lib.splat_api_version()}, expected {_API_VERSION}")
        for name, args in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = args + _CALL_TAIL
            fn.restype = ctypes.c_int
        lib.splat_release_cpu_scratch.restype = ctypes.c_int64
        consts = (ctypes.c_int64 * 6)()
        lib.splat_constants(consts)
        self.grad_record_size, self.gauss_params_size, self.gauss_grad_record_size, self.tile_size = consts[:4]
        self._lib = lib
        self.__file__ = str(path)

    # -- rasterizer: surfels ------------------------------------------------
    def _surfel_inputs(self, Tuvw, center, normal, color, opacity, depth, pixel_rect):
        n = Tuvw.shape[0]
        code = _dtype_code(Tuvw, "Tuvw")
        dtype = Tuvw.dtype
        _check_input(Tuvw, "Tuvw", n, 9, dtype)
        _check_input(center, "center", n, 2, dtype)
        _check_input(normal, "normal", n, 3, dtype)
        _check_input(color, "color", n, 3, dtype)
        _check_input(opacity, "opacity", n, 0, dtype)
        _check_input(depth, "depth", n, 0, dtype)
        _check_input(pixel_rect, "pixel_rect", n, 4, torch.int32)
        return code, n, _pointers((Tuvw, center, normal, color, opacity, depth, pixel_rect))

    def forward_cpu(self, Tuvw, center, normal, color, opacity, depth, pixel_rect, width, height, near, far):
        code, n, ins = self._surfel_inputs(Tuvw, center, normal, color, opacity, depth, pixel_rect)
        outs, err = (ctypes.c_void_p * 12)(), _err_buffer()
        if self._lib.splat_forward_cpu(code, ins, n, width, height, near, far, _threads(), outs, err, 512):
            _fail(err)
        return _adopt(outs, 12)

    def backward_cpu(self, Tuvw, center, normal, color, opacity, depth, pixel_rect, width, height, near, far, *rest):
        state, ups, packed = rest[:6], rest[6:12], rest[12]
        code, n, ins = self._surfel_inputs(Tuvw, center, normal, color, opacity, depth, pixel_rect)
        st = _state(state, Tuvw.dtype, width, height)
        up, strides = _upstream(ups, Tuvw.dtype, width, height)
        reuse = packed.dtype == torch.uint8 and packed.is_contiguous() and packed.numel() > 0
        out, err = (ctypes.c_void_p * 1)(), _err_buffer()
        packed_ptr, packed_bytes = (packed.data_ptr(), packed.numel()) if reuse else (None, 0)
        if self._lib.splat_backward_cpu(
            code, ins, n, width, height, near, far, st, up, strides, packed_ptr, packed_bytes, _threads(), out, err, 512
        ):
            _fail(err)
        return _adopt(out, 1)[0]

    # -- rasterizer: 3D Gaussians --------------------------------------------
    def _gaussian_inputs(self, params, color, depth, pixel_rect):
        n = params.shape[0]
        code = _dtype_code(params, "params")
        _check_input(params, "params", n, self.gauss_params_size, params.dtype)
        _check_input(color, "color", n, 3, params.dtype)
        _check_input(depth, "depth", n, 0, params.dtype)
        _check_input(pixel_rect, "pixel_rect", n, 4, torch.int32)
        return code, n, _pointers((params, color, depth, pixel_rect))

    def forward_gaussians_cpu(self, params, color, depth, pixel_rect, width, height, near, far):
        code, n, ins = self._gaussian_inputs(params, color, depth, pixel_rect)
        outs, err = (ctypes.c_void_p * 11)(), _err_buffer()
        if self._lib.splat_forward_gaussians_cpu(code, ins, n, width, height, near, far, _threads(), outs, err, 512):
            _fail(err)
        return _adopt(outs, 11)

    def backward_gaussians_cpu(self, params, color, depth, pixel_rect, width, height, near, far, *rest):
        code, n, ins = self._gaussian_inputs(params, color, depth, pixel_rect)
        st = _state(rest[:6], params.dtype, width, height)
        up, strides = _upstream(rest[6:12], params.dtype, width, height)
        out, err = (ctypes.c_void_p * 1)(), _err_buffer()
        if self._lib.splat_backward_gaussians_cpu(
            code, ins, n, width, height, near, far, st, up, strides, _threads(), out, err, 512
        ):
            _fail(err)
        return _adopt(out, 1)[0]

    # -- the fused projection ------------------------------------------------
    def _project_inputs(self, means, quats, scales, opacities, coeffs, sh_degree, viewmat, K):
        n = means.shape[0]
        code, dtype = _dtype_code(means, "means"), means.dtype
        _check_input(means, "means", n, 3, dtype)
        _check_input(quats, "quats", n, 4, dtype)
        _check_input(scales, "scales", n, 2, dtype)
        _check_input(opacities, "opacities", n, 0, dtype)
        with_sh = coeffs.numel() > 0
        if with_sh:
            _check_input(coeffs, "coeffs", n, 0, dtype)
            if coeffs.dim() != 3 or coeffs.shape[2] != 3:
                raise RuntimeError("coeffs must be [N, K, 3]")
            if not (0 <= sh_degree <= 3 and coeffs.shape[1] >= (sh_degree + 1) ** 2):
                raise RuntimeError(f"coeffs has too few SH coefficients for sh_degree {sh_degree}")
        cam = _camera(viewmat, K, dtype)
        ins = (ctypes.c_void_p * 5)(
            means.data_ptr(),
            quats.data_ptr(),
            scales.data_ptr(),
            opacities.data_ptr(),
            coeffs.data_ptr() if with_sh else None,
        )
        return code, n, (coeffs.shape[1] if with_sh else 0), ins, cam

    def project_forward_cpu(self, means, quats, scales, opacities, coeffs, sh_degree, viewmat, K, *rest):
        width, height, near, far, limit_finite, limit_drawn = rest
        code, n, num_coeffs, ins, cam = self._project_inputs(
            means, quats, scales, opacities, coeffs, sh_degree, viewmat, K
        )
        outs, err = (ctypes.c_void_p * 8)(), _err_buffer()
        if self._lib.splat_project_forward_cpu(
            code, ins, n, num_coeffs, sh_degree, cam[0].data_ptr(), cam[1].data_ptr(), width, height, near, far,
            limit_finite, limit_drawn, _threads(), outs, err, 512,
        ):  # fmt: skip
            _fail(err)
        return _adopt(outs, 8)

    def project_backward_cpu(self, means, quats, scales, opacities, coeffs, sh_degree, viewmat, K, *rest):
        width, height, near, far, v_Tuvw, v_center, v_normal, v_color = rest
        code, n, num_coeffs, ins, cam = self._project_inputs(
            means, quats, scales, opacities, coeffs, sh_degree, viewmat, K
        )
        dtype = means.dtype
        _check_rows(v_Tuvw, "v_Tuvw", n, 9, dtype)
        _check_rows(v_center, "v_center", n, 2, dtype)
        _check_rows(v_normal, "v_normal", n, 3, dtype)
        with_sh = num_coeffs > 0
        if with_sh:
            _check_rows(v_color, "v_color", n, 3, dtype)
        grads = (ctypes.c_void_p * 4)(
            v_Tuvw.data_ptr(), v_center.data_ptr(), v_normal.data_ptr(), v_color.data_ptr() if with_sh else None
        )
        strides = (ctypes.c_int64 * 4)(
            v_Tuvw.stride(0), v_center.stride(0), v_normal.stride(0), v_color.stride(0) if with_sh else 3
        )
        v_coeffs = torch.empty_like(coeffs)
        outs, err = (ctypes.c_void_p * 4)(), _err_buffer()
        if self._lib.splat_project_backward_cpu(
            code, ins, n, num_coeffs, sh_degree, cam[0].data_ptr(), cam[1].data_ptr(), width, height, near, far,
            grads, strides, v_coeffs.data_ptr() if with_sh else None, _threads(), outs, err, 512,
        ):  # fmt: skip
            _fail(err)
        v_means, v_quats, v_scales, v_means2d = _adopt(outs, 4)
        return [v_means, v_quats, v_scales, v_coeffs, v_means2d]

    # -- SSIM ------------------------------------------------------------------
    @staticmethod
    def _ssim_check(x, y, window):
        if x.dim() != 3 or y.shape != x.shape:
            raise RuntimeError("ssim: x and y must both be [H, W, C]")
        if not (x.is_contiguous() and y.is_contiguous() and window.is_contiguous()) or not (
            y.dtype == x.dtype and window.dtype == x.dtype
        ):
            raise RuntimeError("ssim: x, y and window must be contiguous and of one dtype")
        if window.dim() != 1 or window.shape[0] % 2 != 1:
            raise RuntimeError("ssim: window must be [K], K odd")
        return _dtype_code(x, "ssim")

    def ssim_forward_cpu(self, x, y, window, c1, c2, with_grad):
        code = self._ssim_check(x, y, window)
        outs, err = (ctypes.c_void_p * 2)(), _err_buffer()
        if self._lib.splat_ssim_forward_cpu(
            code, x.data_ptr(), y.data_ptr(), window.data_ptr(), window.shape[0], *x.shape, c1, c2,
            int(bool(with_grad)), _threads(), outs, err, 512,
        ):  # fmt: skip
            _fail(err)
        return _adopt(outs, 2)

    def ssim_backward_cpu(self, x, y, window, c1, c2, maps, scale):
        code = self._ssim_check(x, y, window)
        if (
            not maps.is_contiguous()
            or maps.dim() != 4
            or maps.shape[0] != 3
            or maps.shape[1:] != x.shape
            or maps.dtype != x.dtype
        ):
            raise RuntimeError("ssim: gradient maps must be [3, H, W, C] of x's dtype")
        dx, err = (ctypes.c_void_p * 1)(), _err_buffer()
        if self._lib.splat_ssim_backward_cpu(
            code, x.data_ptr(), y.data_ptr(), window.data_ptr(), window.shape[0], *x.shape, c1, c2, maps.data_ptr(),
            scale, _threads(), dx, err, 512,
        ):  # fmt: skip
            _fail(err)
        return _adopt(dx, 1)[0]

    # -- depth-normal loss -----------------------------------------------------
    @staticmethod
    def _normal_loss_check(depth, normal, alpha, K, viewmat):
        if depth.dim() != 2:
            raise RuntimeError("normal loss: depth must be [H, W]")
        H, W = depth.shape
        if normal.shape != (H, W, 3):
            raise RuntimeError("normal loss: normal must be [H, W, 3]")
        if alpha.shape != (H, W):
            raise RuntimeError("normal loss: alpha must be [H, W]")
        for t in (depth, normal, alpha):
            if not t.is_contiguous() or t.dtype != depth.dtype:
                raise RuntimeError("normal loss: depth, normal and alpha must be contiguous and of one dtype")
        if K.numel() != 9 or viewmat.numel() != 16:
            raise RuntimeError("normal loss: K must be [3, 3] and viewmat [4, 4]")
        cam = [m.detach().to("cpu", torch.float64).contiguous() for m in (K, viewmat)]
        return _dtype_code(depth, "normal loss"), H, W, cam

    def normal_loss_forward_cpu(self, depth, normal, alpha, K, viewmat):
        code, H, W, cam = self._normal_loss_check(depth, normal, alpha, K, viewmat)
        loss, err = (ctypes.c_void_p * 1)(), _err_buffer()
        if self._lib.splat_normal_loss_forward_cpu(
            code, depth.data_ptr(), normal.data_ptr(), alpha.data_ptr(), cam[0].data_ptr(), cam[1].data_ptr(), H, W,
            _threads(), loss, err, 512,
        ):  # fmt: skip
            _fail(err)
        return _adopt(loss, 1)[0]

    def normal_loss_backward_cpu(self, depth, normal, alpha, K, viewmat, scale):
        code, H, W, cam = self._normal_loss_check(depth, normal, alpha, K, viewmat)
        outs, err = (ctypes.c_void_p * 2)(), _err_buffer()
        if self._lib.splat_normal_loss_backward_cpu(
            code, depth.data_ptr(), normal.data_ptr(), alpha.data_ptr(), cam[0].data_ptr(), cam[1].data_ptr(), H, W,
            scale, _threads(), outs, err, 512,
        ):  # fmt: skip
            _fail(err)
        return _adopt(outs, 2)

    # -- tests and housekeeping ------------------------------------------------
    def exp_float32(self, x):
        if x.dtype != torch.float32 or not x.is_contiguous() or x.dim() != 1 or x.shape[0] % 8:
            raise RuntimeError("x must be a contiguous float32 vector whose length is a multiple of 8")
        scalar, lanes, err = torch.empty_like(x), torch.empty_like(x), _err_buffer()
        if self._lib.splat_exp_float32(x.data_ptr(), x.shape[0], scalar.data_ptr(), lanes.data_ptr(), err, 512):
            _fail(err)
        return [scalar, lanes]

    def set_cpu_kernel_mode(self, mode):
        err = _err_buffer()
        if self._lib.splat_set_cpu_kernel_mode(int(mode), err, 512):
            _fail(err)

    def cpu_kernel_mode(self):
        return self._lib.splat_cpu_kernel_mode()

    def release_cpu_scratch(self):
        return self._lib.splat_release_cpu_scratch()


def library_path(kind: str) -> Path:
    """Where the package keeps the built "cpu" or "cuda" library."""
    from splat._native_build import library_name

    return _HERE / library_name(kind)


@cache
def kernels() -> CpuKernels:
    """The loaded CPU library; built just in time (g++) when the package has
    none and SPLAT_NO_JIT is not 1.  Raises ImportError with the reason."""
    path = library_path("cpu")
    if not path.is_file():
        if os.environ.get("SPLAT_NO_JIT") == "1":
            raise ImportError(f"splat's kernel library {path.name} is not built and SPLAT_NO_JIT=1")
        path = _build_just_in_time()
    try:
        return CpuKernels(path)
    except OSError as error:
        raise ImportError(f"splat's kernel library {path} cannot be loaded: {error}") from None


def _build_just_in_time() -> Path:
    from splat._native_build import build_cpu_library, library_name

    cache_dir = Path(os.environ.get("SPLAT_BUILD_DIR") or Path.home() / ".cache" / "splat" / "native")
    try:
        return build_cpu_library(cache_dir / library_name("cpu"), cache_dir / "objects")
    except Exception as error:  # compiler missing, ...
        raise ImportError(
            "splat's compiled kernels are unavailable: not installed (pip install -e . "
            f"--no-build-isolation) and the just-in-time build failed: {error}"
        ) from None
