"""Progress of long jobs (training, rendering, meshing): a tqdm bar on a
terminal, plain log lines otherwise (logs, ``nohup``, CI, pipes), so that a
log file holds lines rather than carriage-return updates."""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Callable, TextIO

__all__ = ["format_duration", "use_progress_bar", "LogLines"]


def format_duration(seconds: float) -> str:
    """``41s``, ``2m41s``, ``1h05m``."""
    s = int(round(max(seconds, 0.0)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def use_progress_bar(setting: bool | str, stream: TextIO | None = None) -> bool:
    """Whether ``log.progress`` (``"auto"``, true or false) means the tqdm bar.

    ``"auto"`` draws the bar only when ``stream`` (default: stderr, where the
    bar and the log lines go) is a terminal; logs, ``nohup``, CI and pipes get
    :class:`LogLines` instead of carriage-return updates.  true and false force
    one or the other."""
    if isinstance(setting, str):  # "auto"
        stream = sys.stderr if stream is None else stream
        try:
            return bool(stream.isatty())
        except (AttributeError, ValueError):  # no isatty, or a closed file
            return False
    return bool(setting)


class LogLines:
    """Progress as plain lines, for runs without the progress bar
    (stderr not a terminal, or ``log.progress=false``: logs, nohup, CI)::

        step 500/1500  loss 0.0412  surfels 31,204  3.1 it/s  eta 5m23s

    A line after the first step, then whenever ``interval_s`` seconds have
    passed since the last one, and at the last step; the rate is over the
    steps since the previous line (wall clock, hooks included)."""

    def __init__(
        self,
        start_step: int,
        iterations: int,
        interval_s: float,
        file: TextIO | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.iterations = int(iterations)
        self.interval_s = float(interval_s)
        self.file = file
        self.clock = clock
        self.last_step = int(start_step)
        self.last_time = clock()
        self.first = True

    def step(self, step: int, loss: float, surfels: int) -> bool:
        """Print a line if one is due; True if it did."""
        now = self.clock()
        dt = now - self.last_time
        if not (self.first or step >= self.iterations or dt >= self.interval_s):
            return False
        rate = (step - self.last_step) / dt if dt > 0 else float("inf")
        eta = (self.iterations - step) / rate if rate > 0 else float("inf")
        eta_text = format_duration(eta) if math.isfinite(eta) else "?"
        print(
            f"step {step}/{self.iterations}  loss {loss:.4f}  surfels {surfels:,}  {rate:.1f} it/s  eta {eta_text}",
            file=self.file or sys.stderr,
            flush=True,
        )
        self.first = False
        self.last_step, self.last_time = step, now
        return True


def summary_line(steps: int, m: dict, out_dir: str | os.PathLike) -> str:
    """The ``done:`` line of a run that took ``steps`` steps, from its metrics ``m``."""
    parts = [f"{steps} steps in {m['train_seconds']:.1f} s", f"{m['n_gaussians']} surfels"]
    for k in ("psnr", "ssim", "psnr_masked", "ssim_masked", "depth_rel_err", "normal_deg_err"):
        if f"test.{k}" in m and m[f"test.{k}"] is not None:
            parts.append(f"test {k} {m[f'test.{k}']:.4g}")
    parts.append(f"peak mem {m['peak_memory_mb']:.0f} MB")
    return "done: " + ", ".join(parts) + f" -> {out_dir}"
