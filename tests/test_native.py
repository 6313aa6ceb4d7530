"""The kernels' C ABI (splat/kernels/splat_api.h, loaded by splat/_native.py):
bad input is a one-line RuntimeError, never a crash; errors raised inside the
library cross the C boundary as codes; the library links neither torch nor
Python; a CPU-only torch never imports the CUDA extension."""

from __future__ import annotations

import shutil
import subprocess
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
