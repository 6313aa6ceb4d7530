"""A sharded checkpoint's manifest is a text file a person can edit: it is
checked against its world size, shard names, per-shard primitive counts and
the ids its shards hold, and a checkpoint that fails is skipped with one
warning line naming the file, so the run resumes from the one before (not
silently with half the model, or with every primitive twice)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from splat.checkpoints import load_latest_checkpoint, manifest_path, shard_dir, shard_name, write_manifest

RUN = "0123456789abcdef"
N = 10  # primitives of the whole model; rank 0 holds 6, rank 1 4


def shard(step: int, rank: int, world: int, ids: torch.Tensor) -> dict:
    """What a rank writes (splat.checkpoints.checkpoint_state), rows only."""
    n = len(ids)
    params = {
        "means": ids[:, None].double().repeat(1, 3),
        "quats": torch.ones(n, 4),
        "scales": torch.zeros(n, 2),
        "opacities": torch.zeros(n),
        "sh0": torch.zeros(n, 1, 3),
        "shN": torch.zeros(n, 3, 3),
    }
    return {
        "step": step,
        "sh_degree": 1,
        "params": params,
        "ids": ids.clone(),
        "next_id": N,
        "run_id": RUN,
        "rank": rank,
        "world_size": world,
    }


def write_checkpoint(out: Path, step: int, parts=((0, 6), (6, 10))) -> Path:
    """Two shards and their manifest, as two processes write them."""
    folder = shard_dir(out, step, RUN)
    folder.mkdir(parents=True, exist_ok=True)
    sizes = []
    for r, (a, b) in enumerate(parts):
        path = folder / shard_name(r, len(parts))
        torch.save(shard(step, r, len(parts), torch.arange(a, b)), path)
        sizes.append((path.stat().st_size, b - a))
    return write_manifest(out, step, RUN, sizes)


@pytest.fixture
def out(tmp_path) -> Path:
    write_checkpoint(tmp_path, 10)
    write_checkpoint(tmp_path, 20)
    whole = load_latest_checkpoint(tmp_path, RUN)
    assert whole["step"] == 20 and torch.equal(whole["ids"], torch.arange(N))
    return tmp_path


def edit_manifest(out: Path, step: int, edit) -> Path:
    path = manifest_path(out, step, RUN)
    body = json.loads(path.read_text())
    edit(body)
    path.write_text(json.dumps(body))
    return path


def assert_fell_back(out: Path, capsys, path: Path, *words) -> None:
    ckpt = load_latest_checkpoint(out, RUN)
    assert ckpt["step"] == 10 and torch.equal(ckpt["ids"], torch.arange(N))  # the whole model, once
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: skipping"), err
    for w in (str(path), *words):
        assert w in lines[0], (w, lines[0])


def test_a_manifest_listing_one_of_its_two_shards_is_skipped(out, capsys):
    path = edit_manifest(out, 20, lambda b: b["shards"].pop())  # world_size still 2
    assert_fell_back(out, capsys, path, "world_size 2")


def test_a_manifest_listing_one_shard_twice_is_skipped(out, capsys):
    path = edit_manifest(out, 20, lambda b: b["shards"].__setitem__(1, b["shards"][0]))
    assert_fell_back(out, capsys, path, "rank0-of-2.pt', 'rank0-of-2.pt")


def test_a_manifest_whose_world_size_disagrees_is_skipped(out, capsys):
    path = edit_manifest(out, 20, lambda b: b.__setitem__("world_size", 3))
    assert_fell_back(out, capsys, path, "world_size 3")


def test_a_shard_holding_other_counts_than_its_manifest_is_skipped(out, capsys):
    def edit(body):
        body["shards"][0]["primitives"] = 5

    edit_manifest(out, 20, edit)
    assert_fell_back(out, capsys, manifest_path(out, 20, RUN), "rank0-of-2.pt", "6 primitives", "says 5")


def test_shards_holding_the_same_ids_are_skipped(tmp_path, capsys):
    write_checkpoint(tmp_path, 10)
    path = write_checkpoint(tmp_path, 20, parts=((0, 6), (2, 6)))  # rank 1 holds ids 2..5 again
    assert_fell_back(tmp_path, capsys, path, "ids more than once")


def test_a_garbled_shard_is_one_warning_line_naming_it(out, capsys):
    """torch's own message for a garbled file runs to six lines of advice."""
    bad = shard_dir(out, 20, RUN) / shard_name(1, 2)
    bad.write_bytes(b"x" * bad.stat().st_size)  # same size: the manifest still counts it complete
    assert_fell_back(out, capsys, bad, "not a torch file")
