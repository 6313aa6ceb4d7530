"""The CUDA kernels' C library (splat/kernels/splat_cuda_api.h), loaded with
ctypes: libsplat_cuda.so links no torch and no Python, and the CUDA runtime
statically, so one build serves every torch >= 2.10 and CPython >= 3.10 and
needs only the driver that torch's CUDA needs anyway.

``cuda_kernels()`` returns the CUDA operations (forward_cuda, backward_cuda,
forward_gaussians_cuda, backward_gaussians_cuda, project_forward_cuda,
project_backward_cuda, project_gaussians_forward_cuda,
project_gaussians_backward_cuda, with the arguments and results of the torch
extension's) or None.  It looks for them only when
torch is a CUDA build and a GPU is present: a CPU-only torch never opens the
library.  Before the first call on a device, the GPU's compute capability is
checked against the images the library holds (``unsupported_gpu``), so a GPU
the wheel was not built for gets a one-line RuntimeError naming its
capability rather than a failed launch.

Every buffer the kernels need (outputs and scratch) is allocated here, with
torch on the inputs' device, through the allocator callback: torch's caching
allocator serves it and its stream-ordered reuse keeps the scratch safe after
the call returns.  Validation (with messages naming the argument) is the
library's host call sequence, the one the CUDA emulation tests run.
"""

from __future__ import annotations

import ctypes
import importlib
import threading
from functools import cache
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
_API_VERSION = 3
_ERR_LEN = 512


class TensorArg(ctypes.Structure):
    """splat_cuda_api.h's SplatTensorArg."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("shape", ctypes.c_int64 * 4),
        ("ndim", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("contiguous", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
    ]


_DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.int32: 2, torch.int64: 3, torch.uint8: 4}
_CODE_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}
_OTHER_DTYPE = 255
_ALLOC = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
    ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_void_p),
)  # fmt: skip
_ARGS = ctypes.POINTER(TensorArg)
_FORWARD = [_ARGS, ctypes.c_int64, ctypes.c_int64, ctypes.c_double, ctypes.c_double, ctypes.c_void_p]
_BACKWARD = [*_FORWARD[:5], _ARGS, _ARGS, ctypes.c_void_p]
_TAIL = [_ALLOC, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
_SIGNATURES = {
    "splat_forward_cuda": _FORWARD,
    "splat_backward_cuda": _BACKWARD,
    "splat_forward_gaussians_cuda": _FORWARD,
    "splat_backward_gaussians_cuda": _BACKWARD,
    # inputs, sh_degree, width, height, near, far, then limit_finite, limit_drawn (forward) or grads
    "splat_project_forward_cuda": [_ARGS, ctypes.c_int64, *_FORWARD[1:5], *[ctypes.c_double] * 2, ctypes.c_void_p],
    "splat_project_backward_cuda": [_ARGS, ctypes.c_int64, *_FORWARD[1:5], _ARGS, ctypes.c_void_p],
    # inputs, width, height, near, far, antialiased (forward) / inputs, width, height, antialiased, grads,
    # with_camera
    "splat_project_gaussians_forward_cuda": [*_FORWARD[:5], ctypes.c_int64, ctypes.c_void_p],
    "splat_project_gaussians_backward_cuda": [*_FORWARD[:3], ctypes.c_int64, _ARGS, ctypes.c_int64, ctypes.c_void_p],
}
_local = threading.local()


def _describe(tensors, names) -> ctypes.Array:
    """SplatTensorArg descriptors of `tensors` (None: undefined)."""
    args = (TensorArg * len(tensors))()
    for arg, t, name in zip(args, tensors, names):
        if t is None:
            arg.ndim = -1
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() > 4:
            raise RuntimeError(f"{name} has shape {list(t.shape)}: at most 4 dimensions")
        arg.data = t.data_ptr()
        arg.ndim = t.dim()
        for i, size in enumerate(t.shape):
            arg.shape[i] = size
        arg.dtype = _DTYPE_CODES.get(t.dtype, _OTHER_DTYPE)
        arg.device_type = 2 if t.is_cuda else 1 if t.is_cpu else 0
        arg.device_id = t.device.index or 0
        arg.contiguous = t.is_contiguous()
    return args


class _Call:
    """The buffers one library call allocated: outputs by slot, scratch kept
    until the call returns."""

    def __init__(self, device: torch.device):
        self.device = device
        self.outputs: dict[int, torch.Tensor] = {}
        self.scratch: list[torch.Tensor] = []
        self.error: BaseException | None = None


@_ALLOC
def _allocate(_ctx, slot, dtype, ndim, shape, data):
    # ctypes would only print an exception raised here: keep it for the caller.
    call = _local.call
    try:
        t = torch.empty([shape[i] for i in range(ndim)], dtype=_CODE_DTYPES[dtype], device=call.device)
    except BaseException as error:  # torch.OutOfMemoryError above all
        call.error = error
        return 1
    if slot >= 0:
        call.outputs[slot] = t
    else:
        call.scratch.append(t)
    data[0] = t.data_ptr()
    return 0


def _version_text(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


def parse_archs(text: str) -> tuple[list[int], list[int], list[int]]:
    """(SASS, PTX, arch-specific SASS) compute capabilities as 10 * major +
    minor, from splat_cuda_archs()'s "sm_75 ... compute_120" ("sm_90a" is
    arch-specific; a family suffix "f" counts as plain SASS)."""
    sass, ptx, exact = [], [], []
    for word in text.split():
        kind, _, number = word.partition("_")
        digits = number.rstrip("af")
        if not digits.isdigit() or kind not in ("sm", "compute"):
            continue
        if kind == "compute":
            ptx.append(int(digits))
        else:
            (exact if number.endswith("a") else sass).append(int(digits))
    return sass, ptx, exact


def unsupported_gpu(capability: tuple[int, int], archs: str) -> str | None:
    """None when a GPU of compute capability (major, minor) can run the
    library's kernels, else the one-line reason.

    The rule (CUDA's compatibility rules): SASS built for sm_XY runs on a GPU
    of the same major version X and minor version >= Y (sm_86 on sm_87, sm_100
    on sm_103, sm_120 on sm_121), never across majors; arch-specific SASS
    (sm_90a) only on its own capability; PTX for compute_XY is compiled by the
    driver for any GPU of capability >= XY.  No archs recorded (a build that
    did not say): nothing to check."""
    sass, ptx, exact = parse_archs(archs)
    if not sass and not ptx and not exact:
        return None
    major, minor = capability
    cc = 10 * major + minor
    if any(s // 10 == major and s % 10 <= minor for s in sass) or cc in exact or any(p <= cc for p in ptx):
        return None
    built = ", ".join(w for w in archs.split() if w.startswith("sm_"))
    built += "".join(f" (+PTX compute_{p})" for p in ptx)
    return f"splat's CUDA kernels were built for {built}; this GPU is sm_{cc} (compute capability {major}.{minor})"


def old_driver(runtime: int, driver: int) -> str | None:
    """None when the driver can run the library's (static) CUDA runtime, else
    the one-line reason: a driver serves runtimes of its own major version and
    older (minor version compatibility within a major)."""
    if runtime == 0 or driver // 1000 >= runtime // 1000:
        return None
    found = f"this driver supports CUDA {_version_text(driver)}" if driver else "no NVIDIA driver was found"
    return (
        f"splat's CUDA kernels need an NVIDIA driver for CUDA {runtime // 1000}.x or newer "
        f"(they were built with CUDA {_version_text(runtime)}); {found}"
    )


class CudaKernels:
    """The library's operations, with the former torch extension's signatures.

    emulated: the CUDA emulation harness's build of the same sources
    (tests/cuda_emulation/), whose "device" tensors are CPU tensors: no stream,
    no GPU check."""

    with_cuda = True

    def __init__(self, path: Path | str, emulated: bool = False):
        lib = ctypes.CDLL(str(path))
        if lib.splat_cuda_api_version() != _API_VERSION:
            raise ImportError(f"{path} has CUDA C ABI version {lib.splat_cuda_api_version()}, expected {_API_VERSION}")
        for name, args in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = args + _TAIL
            fn.restype = ctypes.c_int
        lib.splat_cuda_archs.restype = ctypes.c_char_p
        lib.splat_cuda_versions.argtypes = [ctypes.POINTER(ctypes.c_int)] * 2 + [ctypes.c_char_p, ctypes.c_size_t]
        self._lib = lib
        self._emulated = emulated
        self._checked: set[int] = set()
        self.archs = lib.splat_cuda_archs().decode()
        self.__file__ = str(path)

    def versions(self) -> tuple[int, int]:
        """(runtime, driver) versions, as cudaRuntimeGetVersion and cudaDriverGetVersion."""
        runtime, driver, err = ctypes.c_int(), ctypes.c_int(), ctypes.create_string_buffer(_ERR_LEN)
        if self._lib.splat_cuda_versions(ctypes.byref(runtime), ctypes.byref(driver), err, _ERR_LEN):
            raise RuntimeError(err.value.decode(errors="replace"))
        return runtime.value, driver.value

    def check_device(self, device: torch.device) -> None:
        """Raises RuntimeError (one line) when this GPU or its driver cannot
        run the kernels; checked once per device."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        if self._emulated or index in self._checked:
            return
        reason = old_driver(*self.versions()) or unsupported_gpu(torch.cuda.get_device_capability(index), self.archs)
        if reason:
            raise RuntimeError(reason)
        self._checked.add(index)

    def _call(self, name, first, inputs, input_names, *rest, state=None, up=None, grads=None, grad_names=None, tail=()):
        device = first.device if isinstance(first, torch.Tensor) else torch.device("cpu")
        if device.type == "cuda":
            self.check_device(device)
            stream = torch.cuda.current_stream(device).cuda_stream
        else:  # the emulation (or a wrong device, which the library reports)
            stream = 0
        args = [_describe(inputs, input_names), *rest]
        if state is not None:
            args += [_describe(state, _STATE_NAMES), _describe(up, _UP_NAMES)]
        if grads is not None:
            args.append(_describe(grads, grad_names or _PROJECT_GRAD_NAMES))
        args += tail
        call, err = _Call(device), ctypes.create_string_buffer(_ERR_LEN)
        previous, _local.call = getattr(_local, "call", None), call
        try:
            failed = getattr(self._lib, name)(*args, stream, _allocate, None, err, _ERR_LEN)
        finally:
            _local.call = previous
        if call.error is not None:
            raise call.error
        if failed:
            raise RuntimeError(err.value.decode(errors="replace") or "splat CUDA kernel failed")
        return [call.outputs[i] for i in range(len(call.outputs))]

    # -- surfels -----------------------------------------------------------------
    def forward_cuda(self, Tuvw, center, normal, color, opacity, depth, pixel_rect, width, height, near, far):
        inputs = (Tuvw, center, normal, color, opacity, depth, pixel_rect)
        return self._call("splat_forward_cuda", Tuvw, inputs, _SURFEL_NAMES, width, height, near, far)

    def backward_cuda(self, Tuvw, center, normal, color, opacity, depth, pixel_rect, width, height, near, far, *rest):
        inputs = (Tuvw, center, normal, color, opacity, depth, pixel_rect)
        state, up = rest[:6], _contiguous(rest[6:12])
        outs = self._call(
            "splat_backward_cuda", Tuvw, inputs, _SURFEL_NAMES, width, height, near, far, state=state, up=up
        )
        return outs[0]

    # -- 3D Gaussians --------------------------------------------------------------
    def forward_gaussians_cuda(self, params, color, depth, pixel_rect, width, height, near, far):
        inputs = (params, color, depth, pixel_rect)
        return self._call("splat_forward_gaussians_cuda", params, inputs, _GAUSSIAN_NAMES, width, height, near, far)

    def backward_gaussians_cuda(self, params, color, depth, pixel_rect, width, height, near, far, *rest):
        inputs = (params, color, depth, pixel_rect)
        state, up = rest[:6], _contiguous(rest[6:12])
        outs = self._call(
            "splat_backward_gaussians_cuda", params, inputs, _GAUSSIAN_NAMES, width, height, near, far,
            state=state, up=up,
        )  # fmt: skip
        return outs[0]

    # -- the fused surfel projection -------------------------------------------------
    def project_forward_cuda(self, means, quats, scales, opacities, coeffs, sh_degree, viewmat, K, *rest):
        """Returns [Tuvw, center, normal, color, depth, pixel_rect, radii,
        over-limit count (int64 [], on the device)], as project_forward_cpu."""
        width, height, near, far, limit_finite, limit_drawn = rest
        inputs = (means, quats, scales, opacities, coeffs, viewmat, K)
        return self._call(
            "splat_project_forward_cuda", means, inputs, _PROJECT_NAMES, sh_degree, width, height, near, far,
            limit_finite, limit_drawn,
        )  # fmt: skip

    def project_backward_cuda(self, means, quats, scales, opacities, coeffs, sh_degree, viewmat, K, *rest):
        """Returns [v_means, v_quats, v_scales, v_coeffs, v_means2d], as project_backward_cpu."""
        width, height, near, far = rest[:4]
        inputs = (means, quats, scales, opacities, coeffs, viewmat, K)
        grads = _contiguous(rest[4:8])  # the rasterizer's gradients arrive as column slices
        return self._call(
            "splat_project_backward_cuda", means, inputs, _PROJECT_NAMES, sh_degree, width, height, near, far,
            grads=grads,
        )  # fmt: skip

    # -- the fused projection of 3D Gaussians ------------------------------------------
    def project_gaussians_forward_cuda(self, means, quats, scales, opacities, viewmat, K, K_inv, *rest):
        """Culls and projects: returns [ids, params, centre, depth, pixel_rect,
        radii, non-finite row count (int64 [], on the device)], as
        project_gaussians_forward_cpu."""
        width, height, near, far, antialiased = rest
        inputs = (means, quats, scales, opacities, *_camera(viewmat, K, K_inv))
        return self._call(
            "splat_project_gaussians_forward_cuda", means, inputs, _GAUSS_PROJECT_NAMES[:4] + _GAUSS_CAMERA_NAMES,
            width, height, near, far, int(bool(antialiased)),
        )  # fmt: skip

    def project_gaussians_backward_cuda(self, means, quats, scales, opacities, ids, viewmat, K, K_inv, *rest):
        """Returns [v_means, v_quats, v_scales, v_opacities, v_means2d] and,
        with_camera, [v_viewmat, v_K, v_K_inv], as project_gaussians_backward_cpu;
        v_centre may be None."""
        width, height, antialiased, v_params, v_centre, with_camera = rest
        inputs = (means, quats, scales, opacities, ids, *_camera(viewmat, K, K_inv))
        return self._call(
            "splat_project_gaussians_backward_cuda", means, inputs, _GAUSS_PROJECT_NAMES + _GAUSS_CAMERA_NAMES,
            width, height, int(bool(antialiased)), grads=_contiguous((v_params, v_centre)),
            grad_names=("v_params", "v_centre"), tail=(int(bool(with_camera)),),
        )  # fmt: skip


_GAUSS_PROJECT_NAMES = ("means", "quats", "scales", "opacities", "ids")
_GAUSS_CAMERA_NAMES = ("viewmat", "K", "K_inv")
_PROJECT_NAMES = ("means", "quats", "scales", "opacities", "coeffs", "viewmat", "K")
_PROJECT_GRAD_NAMES = ("v_Tuvw", "v_center", "v_normal", "v_color")
_SURFEL_NAMES = ("Tuvw", "center", "normal", "color", "opacity", "depth", "pixel_rect")
_GAUSSIAN_NAMES = ("params", "color", "depth", "pixel_rect")
_STATE_NAMES = ("tile_offsets", "point_list", "end", "median_index", "transmittance", "totals")
_UP_NAMES = ("v_color_sum", "v_transmittance", "v_depth_sum", "v_normal_sum", "v_distortion", "v_median_depth")


def _camera(*tensors):
    # contiguous as the CPU op takes them (torch.linalg.inv returns K^-1 column-major)
    return [t.detach().contiguous() if isinstance(t, torch.Tensor) else t for t in tensors]


def _contiguous(tensors):
    # autograd may hand over expanded (stride-0) gradients; free when contiguous
    return [t.contiguous() if isinstance(t, torch.Tensor) else t for t in tensors]


def library_path() -> Path:
    """Where the package keeps libsplat_cuda.so."""
    from splat._native_build import library_name

    return _HERE / library_name("cuda")


def gpu_present() -> bool:
    """torch is a CUDA build and sees a GPU: the only case the CUDA library is
    looked for (a CPU-only torch never opens it)."""
    return torch.version.cuda is not None and torch.cuda.is_available()


@cache
def cuda_kernels():
    """The CUDA operations, or None without a CUDA torch and a GPU.

    libsplat_cuda.so beside the package (the wheel, or a source build with
    SPLAT_CUDA_ARCHS) first; else the torch extension splat._C of a source
    build on a CUDA torch.  Raises ImportError when the library is there but
    cannot be loaded."""
    if not gpu_present():
        return None
    path = library_path()
    if path.is_file():
        try:
            return CudaKernels(path)
        except OSError as error:
            raise ImportError(f"splat's CUDA library {path} cannot be loaded: {error}") from None
    try:
        module = importlib.import_module("splat._C")  # by name: the package imports this module
    except ImportError:
        return None
    return module if getattr(module, "with_cuda", False) else None
