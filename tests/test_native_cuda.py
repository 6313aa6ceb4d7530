"""The CUDA library's loader and checks (splat/_native_cuda.py), on any machine.

* which GPUs the library's images serve (``unsupported_gpu``), from the
  architecture list the build records, with fake compute capabilities;
* the driver check (``old_driver``), the one-line errors both give before the
  first call, and that they are made once per device;
* that a CPU-only torch never opens libsplat_cuda.so, even when one lies
  beside the package;
* the C boundary itself (descriptors, allocator callback, error codes), on
  the CUDA emulation library, which is the same C ABI built against the
  cudaemu shim (the parity tests of test_cuda_emulation*.py run through it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cuda_emulation.build import build_library

import splat._native_cuda as native_cuda
from splat._native_build import CUDA_ARCHS, cuda_arch_flags, parse_cuda_archs

ROOT = Path(__file__).resolve().parents[1]
WHEEL_ARCHS = cuda_arch_flags(*parse_cuda_archs("all"))[1]


def test_the_wheel_builds_seven_sass_images_and_ptx_of_the_newest():
    flags, listed = cuda_arch_flags(*parse_cuda_archs("all"))
    assert listed == "sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_120 compute_120"
    assert flags[0] == "-gencode=arch=compute_75,code=sm_75"
    assert flags[-1] == "-gencode=arch=compute_120,code=compute_120"  # the PTX
    assert len(flags) == len(CUDA_ARCHS) + 1


@pytest.mark.parametrize(
    "spec, sass, ptx",
    [("86", [86], []), ("8.6;12.0+PTX", [86, 120], [120]), ("sm_80, 90", [80, 90], [])],
)
def test_arch_specs(spec, sass, ptx):
    assert parse_cuda_archs(spec) == (sass, ptx)


def test_a_bad_arch_spec_names_the_word():
    with pytest.raises(ValueError, match="'ampere' is not an architecture"):
        parse_cuda_archs("80 ampere")


@pytest.mark.parametrize(
    "capability, runs",
    [
        ((7, 5), True),  # Turing: its own SASS
        ((8, 0), True),
        ((8, 6), True),
        ((8, 7), True),  # Orin: sm_86's SASS (same major, newer minor)
        ((8, 9), True),
        ((9, 0), True),
        ((10, 0), True),
        ((10, 3), True),  # B300: sm_100's SASS
        ((12, 0), True),
        ((12, 1), True),  # sm_120's SASS
        ((13, 0), True),  # a future GPU: the driver compiles compute_120's PTX
        ((7, 0), False),  # Volta: older than every image
        ((6, 1), False),
        ((11, 0), False),  # Thor: no SASS of major 11, and the PTX is for 12.0 and later
    ],
)
def test_which_gpus_the_wheel_serves(capability, runs):
    reason = native_cuda.unsupported_gpu(capability, WHEEL_ARCHS)
    assert (reason is None) == runs, reason


def test_the_unsupported_gpu_message_is_one_line_naming_the_capability():
    reason = native_cuda.unsupported_gpu((11, 0), WHEEL_ARCHS)
    assert reason == (
        "splat's CUDA kernels were built for sm_75, sm_80, sm_86, sm_89, sm_90, sm_100, sm_120 "
        "(+PTX compute_120); this GPU is sm_110 (compute capability 11.0)"
    )


def test_without_ptx_a_newer_gpu_is_refused():
    assert native_cuda.unsupported_gpu((12, 0), "sm_80 sm_90") is not None
    assert native_cuda.unsupported_gpu((9, 0), "sm_80 compute_80") is None  # PTX of 8.0 serves 9.0
    assert native_cuda.unsupported_gpu((9, 0), "sm_90a") is None  # an arch-specific image: its own GPU only
    assert native_cuda.unsupported_gpu((9, 2), "sm_90a") is not None
    assert native_cuda.unsupported_gpu((7, 0), "") is None  # nothing recorded: nothing to check


@pytest.mark.parametrize(
    "runtime, driver, message",
    [
        (13000, 13010, None),
        (13000, 13000, None),
        (13020, 13000, None),  # minor version compatibility within CUDA 13
        (
            13000,
            12040,
            "splat's CUDA kernels need an NVIDIA driver for CUDA 13.x or newer (they were built with "
            "CUDA 13.0); this driver supports CUDA 12.4",
        ),
        (
            13000,
            0,
            "splat's CUDA kernels need an NVIDIA driver for CUDA 13.x or newer (they were built "
            "with CUDA 13.0); no NVIDIA driver was found",
        ),
    ],
)
def test_driver_check(runtime, driver, message):
    assert native_cuda.old_driver(runtime, driver) == message


def _kernels_without_library(archs, versions):
    k = native_cuda.CudaKernels.__new__(native_cuda.CudaKernels)
    k._emulated, k._checked, k.archs = False, set(), archs
    k.versions = lambda: versions
    return k


def test_check_device_raises_once_per_device_and_remembers_good_ones(monkeypatch):
    asked = []

    def capability(index):
        asked.append(index)
        return {0: (8, 6), 1: (7, 0)}[index]

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    k = _kernels_without_library(WHEEL_ARCHS, (13000, 13000))
    k.check_device(torch.device("cuda", 0))
    k.check_device(torch.device("cuda", 0))
    assert asked == [0]  # checked once
    with pytest.raises(RuntimeError, match=r"^splat's CUDA kernels were built for .*; this GPU is sm_70 ") as info:
        k.check_device(torch.device("cuda", 1))
    assert "\n" not in str(info.value)
    old = _kernels_without_library(WHEEL_ARCHS, (13000, 12040))
    with pytest.raises(RuntimeError, match="this driver supports CUDA 12.4"):
        old.check_device(torch.device("cuda", 0))


@pytest.mark.skipif(native_cuda.gpu_present(), reason="checks the CPU-only path")
def test_a_cpu_only_torch_never_opens_the_cuda_library(tmp_path):
    """A libsplat_cuda.so beside the package (here a file that no loader could
    open) is neither opened nor even looked at: the CPU kernels run, the CUDA
    operations are absent, and the process maps no such library."""
    fake = tmp_path / "libsplat_cuda.so"
    fake.write_bytes(b"not a shared library")
    code = (
        "import ctypes, sys\n"
        "from pathlib import Path\n"
        "opened = []\n"
        "real_cdll = ctypes.CDLL\n"
        "ctypes.CDLL = lambda name, *a, **k: (opened.append(str(name)), real_cdll(name, *a, **k))[1]\n"
        "import splat, splat._native_cuda as native_cuda\n"
        f"native_cuda.library_path = lambda: Path({str(fake)!r})\n"
        "from splat.testing import random_scene\n"
        "splat.rasterize(**random_scene(50, 16, 16), backend='cpu')\n"
        "from splat._backend import has_cuda_kernels, load_extension\n"
        "assert not has_cuda_kernels()\n"
        "assert not hasattr(load_extension(), 'forward_cuda')\n"
        "assert not [p for p in opened if 'splat_cuda' in Path(p).name], opened\n"
        "assert 'libsplat_cuda' not in Path('/proc/self/maps').read_text()\n"
        "assert 'splat._C' not in sys.modules\n"
        "print('ok', opened)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "libsplat_cpu" in done.stdout  # the probe did see the CPU library open


@pytest.fixture
def fresh_loader(monkeypatch):
    native_cuda.cuda_kernels.cache_clear()
    yield monkeypatch
    native_cuda.cuda_kernels.cache_clear()


def test_with_a_gpu_the_library_beside_the_package_is_loaded(fresh_loader, tmp_path):
    fresh_loader.setattr(native_cuda, "gpu_present", lambda: True)
    fresh_loader.setattr(native_cuda, "library_path", build_library)
    k = native_cuda.cuda_kernels()
    assert isinstance(k, native_cuda.CudaKernels) and k.__file__ == str(build_library())

    native_cuda.cuda_kernels.cache_clear()
    broken = tmp_path / "libsplat_cuda.so"
    broken.write_bytes(b"not a shared library")
    fresh_loader.setattr(native_cuda, "library_path", lambda: broken)
    with pytest.raises(ImportError, match=r"^splat's CUDA library .*libsplat_cuda\.so cannot be loaded: "):
        native_cuda.cuda_kernels()


# ---- the C boundary, on the emulation build of the same C ABI ---------------------------
@pytest.fixture(scope="module")
def emulated():
    return native_cuda.CudaKernels(build_library(), emulated=True)


def surfel_inputs(n=5, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    cols = (9, 2, 3, 3)
    ins = [torch.rand(n, c, generator=g, dtype=dtype) for c in cols]
    ins += [torch.rand(n, generator=g, dtype=dtype), torch.rand(n, generator=g, dtype=dtype) + 1]
    ins.append(torch.tensor([[0, 0, 16, 16]] * n, dtype=torch.int32))
    return ins


def test_emulated_library_reports_the_argument_by_name(emulated):
    ins = surfel_inputs()
    ins[1] = ins[1].float()
    with pytest.raises(RuntimeError, match=r"^center has dtype Float, expected Double$"):
        emulated.forward_cuda(*ins, 16, 16, 0.2, 100.0)
    ins = surfel_inputs()
    ins[3] = ins[3][:, :2].contiguous()
    with pytest.raises(RuntimeError, match=r"^color has shape \[5, 2\], expected \[5, 3\]$"):
        emulated.forward_cuda(*ins, 16, 16, 0.2, 100.0)
    ins = surfel_inputs()
    ins[4] = None
    with pytest.raises(RuntimeError, match=r"^opacity is undefined \(None\)$"):
        emulated.forward_cuda(*ins, 16, 16, 0.2, 100.0)
    ins = surfel_inputs()
    ins[2] = ins[2].t().contiguous().t()
    with pytest.raises(RuntimeError, match=r"^normal must be contiguous$"):
        emulated.forward_cuda(*ins, 16, 16, 0.2, 100.0)


def test_emulated_library_outputs_are_torch_tensors_by_slot(emulated):
    outs = emulated.forward_cuda(*surfel_inputs(), 20, 17, 0.2, 100.0)
    shapes = [tuple(t.shape) for t in outs]
    assert shapes[:9] == [(17, 20, 3), (17, 20), (17, 20), (17, 20, 3), (17, 20), (17, 20), (17, 20), (17, 20)] + [
        shapes[8]
    ]
    assert shapes[9] == (4 + 1,) and outs[9].dtype == torch.int64  # 2 x 2 tiles
    assert outs[10].dtype == torch.int32 and outs[10].numel() == int(outs[9][-1])


def test_an_allocation_failure_comes_back_as_torchs_own_error(emulated, monkeypatch):
    real_empty, calls = torch.empty, []

    def failing_empty(*args, **kwargs):
        calls.append(args)
        if len(calls) == 3:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", failing_empty)
    with pytest.raises(torch.OutOfMemoryError, match="simulated"):
        emulated.forward_cuda(*surfel_inputs(), 16, 16, 0.2, 100.0)
    assert len(calls) == 3  # the library stopped at the failed allocation


# ---- the real library, where nvcc is found (no GPU needed) ------------------------------
@pytest.fixture(scope="module")
def real_library(tmp_path_factory):
    import shutil

    from splat._native_build import build_cuda_library

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found")
    folder = tmp_path_factory.mktemp("cuda_library")
    return build_cuda_library(folder / "libsplat_cuda.so", folder / "objects", "8.0+PTX")  # one arch: ~30 s


def test_the_real_library_links_no_torch_python_or_cuda_runtime(real_library):
    """Only the driver is needed at run time: the CUDA runtime is linked
    statically (it opens libcuda.so.1 itself), and the library exports the C
    ABI alone."""
    import shutil

    if shutil.which("objdump") is None or shutil.which("nm") is None:
        pytest.skip("objdump or nm not found")
    dump = subprocess.run(["objdump", "-p", str(real_library)], capture_output=True, text=True, check=True).stdout
    needed = [line.split()[-1] for line in dump.splitlines() if line.strip().startswith("NEEDED")]
    assert needed and not [n for n in needed if any(k in n for k in ("torch", "c10", "python", "cudart", "libcuda"))]
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(real_library)], capture_output=True, text=True)
    exported = {line.split()[-1] for line in symbols.stdout.splitlines() if line.split()[1:2] == ["T"]}
    assert exported == {
        "splat_cuda_api_version",
        "splat_cuda_archs",
        "splat_cuda_versions",
        "splat_forward_cuda",
        "splat_backward_cuda",
        "splat_forward_gaussians_cuda",
        "splat_backward_gaussians_cuda",
        "splat_project_forward_cuda",
        "splat_project_backward_cuda",
        "splat_project_gaussians_forward_cuda",
        "splat_project_gaussians_backward_cuda",
    }


def test_the_real_library_records_its_archs_and_validates_without_a_gpu(real_library):
    k = native_cuda.CudaKernels(real_library)
    assert k.archs == "sm_80 compute_80"
    assert native_cuda.unsupported_gpu((7, 5), k.archs) is not None
    runtime, _driver = k.versions()
    assert runtime >= 12000
    # the host sequence's checks come before any CUDA call
    with pytest.raises(RuntimeError, match=r"^Tuvw must be a CUDA tensor for the CUDA backend, got one on cpu$"):
        k.forward_cuda(*surfel_inputs(), 16, 16, 0.2, 100.0)
    means = torch.zeros(4, 3)
    with pytest.raises(RuntimeError, match=r"^means must be a CUDA tensor for the CUDA backend, got one on cpu$"):
        k.project_forward_cuda(means, means, means, means, means, 0, means, means, 16, 16, 0.2, 100.0, 1.0, 1.0)
    with pytest.raises(RuntimeError, match=r"^means must be a CUDA tensor for the CUDA backend, got one on cpu$"):
        k.project_gaussians_forward_cuda(means, means, means, means[:, 0], means, means, means, 16, 16, 0.2, 100.0, 0)
