"""The kernels' C ABI (splat/kernels/splat_api.h, loaded by splat/_native.py):
bad input is a one-line RuntimeError, never a crash; errors raised inside the
library cross the C boundary as codes; the library links neither torch nor
Python; a CPU-only torch never imports the CUDA extension."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from splat._native import kernels

ROOT = Path(__file__).resolve().parents[1]


def _surfel_inputs(n=5, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    Tuvw = torch.randn(n, 9, generator=g, dtype=dtype)
    rect = torch.tensor([[0, 0, 8, 8]] * n, dtype=torch.int32)
    return [Tuvw, torch.rand(n, 2, dtype=dtype), torch.rand(n, 3, dtype=dtype), torch.rand(n, 3, dtype=dtype)] + [
        torch.rand(n, dtype=dtype),
        torch.rand(n, dtype=dtype) + 1,
        rect,
    ]


@pytest.mark.parametrize(
    "index, bad, message",
    [
        (0, torch.zeros(5, 8), "Tuvw must be \\[N, 9\\]"),
        (1, torch.zeros(4, 2), "center has 4 rows, expected 5"),
        (2, torch.zeros(3, 5).t(), "normal must be contiguous"),
        (4, torch.zeros(5, dtype=torch.float64), "opacity has dtype torch.float64, expected torch.float32"),
        (6, torch.zeros(5, 4), "pixel_rect has dtype torch.float32, expected torch.int32"),
    ],
)
def test_a_bad_input_is_a_one_line_error(index, bad, message):
    args = _surfel_inputs()
    args[index] = bad
    with pytest.raises(RuntimeError, match=message) as err:
        kernels().forward_cpu(*args, 16, 16, 0.2, 100.0)
    assert "\n" not in str(err.value)


def test_bad_saved_state_is_refused_before_the_library_reads_it():
    ext = kernels()
    args = _surfel_inputs()
    f = ext.forward_cpu(*args, 16, 16, 0.2, 100.0)
    state = [f[9][:-1], f[10], f[6], f[7], f[1], f[8]]  # one tile offset short
    ups = [torch.zeros(16, 16, 3), torch.zeros(16, 16), torch.zeros(16, 16)] * 2
    with pytest.raises(RuntimeError, match="tile_offsets has 1 entries, expected 2"):
        ext.backward_cpu(*args, 16, 16, 0.2, 100.0, *state, *ups, f[11])


def test_an_error_inside_the_library_comes_back_as_a_message():
    # raised by C++ code (std::invalid_argument) and caught at the C boundary
    with pytest.raises(RuntimeError, match="CPU kernel mode must be 0"):
        kernels().set_cpu_kernel_mode(7)
    args = _surfel_inputs()
    with pytest.raises(RuntimeError, match="invalid image size -16 x 16"):
        kernels().forward_cpu(*args, -16, 16, 0.2, 100.0)


def test_outputs_are_adopted_without_a_copy_and_freed_to_the_cache():
    ext = kernels()
    ext.release_cpu_scratch()
    args = _surfel_inputs(200)
    for _ in range(2):
        out = ext.forward_cpu(*args, 1024, 512, 0.2, 100.0)
        assert out[0].shape == (512, 1024, 3) and out[0].is_contiguous()
        del out  # the DLPack deleters return the large blocks to the scratch cache
    assert ext.release_cpu_scratch() > 2**20


def test_the_library_links_neither_torch_nor_python():
    if shutil.which("objdump") is None:
        pytest.skip("objdump not found")
    dump = subprocess.run(["objdump", "-p", kernels().__file__], capture_output=True, text=True, check=True).stdout
    needed = [line.split()[-1] for line in dump.splitlines() if line.strip().startswith("NEEDED")]
    assert needed and not [n for n in needed if "torch" in n or "c10" in n or "python" in n], needed


@pytest.mark.skipif(
    shutil.which("nm") is None or platform.machine() != "x86_64" or sys.platform != "linux",
    reason="needs nm and a Linux x86-64 build",
)
def test_the_linux_x86_64_build_dispatches_over_instruction_sets():
    # kernels/cpu/dispatch.h: with GCC on x86-64 ELF each hot entry point gets
    # AVX2 and baseline clones picked at load time; losing them (a macro test
    # gone wrong) costs about half the CPU speed and changes no result, so only
    # this test would notice.
    symbols = subprocess.run(["nm", kernels().__file__], capture_output=True, text=True, check=True).stdout
    cloned = {line.split()[-1].split(".avx2")[0] for line in symbols.splitlines() if ".avx2" in line}
    for entry in ("forward_tile_simd_surfels", "backward_tile_simd_gaussians", "project_forward_block_f32"):
        assert any(entry in name for name in cloned), (entry, sorted(cloned))


def test_each_platform_builds_with_its_own_compiler_and_flags(monkeypatch, tmp_path):
    from splat._native_build import toolchain

    monkeypatch.delenv("CXX", raising=False)
    cxx, cflags, lflags = toolchain("linux")
    assert cxx == ["g++"] and "-fPIC" in cflags and "-fopenmp" in cflags and "-fopenmp" in lflags
    # Windows: the kernels' vector extensions need clang, and PE has no -fPIC
    cxx, cflags, lflags = toolchain("win32")
    assert cxx == ["clang++"] and "-fPIC" not in cflags and "-fvisibility=hidden" not in cflags
    # macOS: Apple clang takes OpenMP from libomp, found by its prefix
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "omp.h").write_text("")
    monkeypatch.setenv("SPLAT_OPENMP_PREFIX", str(tmp_path))
    cxx, cflags, lflags = toolchain("darwin")
    assert cxx == ["clang++"] and cflags.count("-fopenmp") == 1  # only after -Xpreprocessor
    assert cflags[-3:] == ["-Xpreprocessor", "-fopenmp", f"-I{tmp_path}/include"]
    assert lflags[:2] == [f"-L{tmp_path}/lib", "-lomp"] and lflags[-1].endswith("@rpath/libsplat_cpu.dylib")
    # every platform keeps the flags that make the kernels round like the GPU build
    for name in ("linux", "darwin", "win32"):
        assert "-ffp-contract=off" in toolchain(name)[1]
    monkeypatch.setenv("CXX", "ccache my-clang++")  # a launcher and a compiler
    assert toolchain("linux")[0] == ["ccache", "my-clang++"]


def test_a_missing_compiler_is_a_one_line_error(monkeypatch, tmp_path):
    from splat._native_build import build_cpu_library

    monkeypatch.setenv("CXX", "no-such-compiler++")
    with pytest.raises(RuntimeError, match="^splat: the compiler 'no-such-compiler\\+\\+' was not found") as e:
        build_cpu_library(tmp_path / "lib.so", tmp_path / "objects", jobs=1)
    assert "\n" not in str(e.value)


def test_macos_without_libomp_builds_serial_and_says_so(monkeypatch, tmp_path, capsys):
    import splat._native_build as native_build

    monkeypatch.setenv("SPLAT_OPENMP_PREFIX", str(tmp_path / "nowhere"))
    _, cflags, lflags = native_build.toolchain("darwin")
    assert not [f for f in cflags + lflags if "openmp" in f or f == "-lomp"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "brew install libomp" in err
