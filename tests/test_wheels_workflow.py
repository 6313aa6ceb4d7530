"""The wheel workflow (.github/workflows/wheels.yml) cannot run here; its
syntax is checked against the GitHub-workflow JSON schema that
check-jsonschema vendors (pinned in the test extra)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WORKFLOW = Path(__file__).resolve().parents[1] / ".github" / "workflows" / "wheels.yml"


def _validate(path: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("check_jsonschema")
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(path)],
        capture_output=True,
        text=True,
    )


def test_wheels_workflow_is_a_valid_github_workflow():
    done = _validate(WORKFLOW)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_validator_rejects_a_broken_workflow(tmp_path):
    # the check can fail: a job without runs-on is no valid workflow
    broken = tmp_path / "broken.yml"
    text = WORKFLOW.read_text().replace("    runs-on: ${{ matrix.os }}\n", "", 1)
    assert text != WORKFLOW.read_text()
    broken.write_text(text)
    assert _validate(broken).returncode != 0


def test_build_script_exists_and_is_bash():
    script = WORKFLOW.parents[2] / "scripts" / "build_wheels.sh"
    assert script.read_text().startswith("#!/usr/bin/env bash")
    assert shutil.which("bash")
