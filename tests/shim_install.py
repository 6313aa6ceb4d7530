"""Installs a compat/ shim distribution offline into a folder and checks that
its module is splat's (used by the drop-in tests)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def assert_shim_installs(tmp_path: Path, distribution: str, module: str, names) -> None:
    """``pip install --no-build-isolation compat/<distribution>`` into a folder;
    then ``import <module>`` must resolve there and each of ``names`` be
    ``splat.compat.<module>``'s own object."""
    src = tmp_path / "src"
    shutil.copytree(
        ROOT / "compat" / distribution, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    checks = "; ".join(f"assert d.{n} is s.{n}" for n in names)
    code = f"import {module} as d, splat.compat.{module} as s; {checks}; print(d.__file__)"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(ROOT)]))
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(target))
