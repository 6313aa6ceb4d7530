"""What every bench script prints: the machine it ran on, and the report as
JSON on stdout (and in --out).  Imported as ``from report import ...`` by the
scripts in this folder (run as ``python bench/NAME.py``)."""
from __future__ import annotations

import json
import os
import platform
import subprocess


def machine(**extra) -> dict:
    import torch

    return dict(platform=platform.platform(), processor=platform.processor(), cpus=os.cpu_count(),
                load_average=os.getloadavg(), torch=torch.__version__, cuda=torch.version.cuda,
                gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None, **extra)


def commit(root: str):
    """Short commit hash of the code tree at `root` (None outside git)."""
    try:
        return subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip() or None
    except OSError:
        return None


def emit(report: dict, out=None) -> None:
    text = json.dumps(report, indent=2)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
