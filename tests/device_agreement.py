"""One render on the CPU and on CUDA from the same inputs, outputs and
gradients compared: the drop-in shims' GPU tests (skipped without a GPU)."""

from __future__ import annotations

from typing import Callable, Iterable

import torch

# float32 on both devices: the raster kernels round alike (tests/test_cuda.py), but a projection run as
# PyTorch ops rounds its products differently on each device (~1e-7 relative, amplified by the exp of the
# alphas), and CUDA sums each primitive's gradient over pixels with atomics in no fixed order.
RTOL, ATOL = 1e-4, 1e-4


def assert_devices_agree(
    inputs: dict,  # {name: CPU tensor}
    grad_keys: Iterable[str],  # the inputs that get gradients
    render: Callable[[dict], Iterable],  # leaves on one device -> outputs (tensors; None and others skipped)
    devices=("cpu", "cuda"),
):
    grad_keys = tuple(grad_keys)
    results = []
    for device in devices:
        # detach first: on the CPU, .to() returns the input itself, which requires_grad_ would mark
        leaves = {k: v.detach().to(device).requires_grad_(k in grad_keys) for k, v in inputs.items()}
        outs = [t for t in render(leaves) if torch.is_tensor(t)]
        assert all(t.device.type == device for t in outs), [t.device for t in outs]
        sum(t.sum() for t in outs if t.requires_grad).backward()
        results.append(([t.detach().cpu() for t in outs], {k: leaves[k].grad.cpu() for k in grad_keys}))
    (outs_a, grads_a), (outs_b, grads_b) = results
    assert len(outs_a) == len(outs_b)
    for i, (a, b) in enumerate(zip(outs_a, outs_b)):
        torch.testing.assert_close(b, a, rtol=RTOL, atol=ATOL, msg=lambda m, i=i: f"output {i}: {m}")
    for k in grad_keys:
        torch.testing.assert_close(grads_b[k], grads_a[k], rtol=RTOL, atol=ATOL, msg=lambda m, k=k: f"d/d{k}: {m}")


def agreement_tests(case: Callable[[], tuple]):
    """The two tests of a shim module's `case()` (inputs, grad_keys, render): CUDA against the CPU where a
    GPU is, and the case's own code CPU against CPU everywhere.  Bind both names at module level."""
    import pytest

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
    def test_cuda_tensors_run_on_cuda_and_agree_with_the_cpu():
        assert_devices_agree(*case())

    def test_the_device_agreement_case_runs_on_the_cpu():
        assert_devices_agree(*case(), devices=("cpu", "cpu"))

    return test_cuda_tensors_run_on_cuda_and_agree_with_the_cpu, test_the_device_agreement_case_runs_on_the_cpu
