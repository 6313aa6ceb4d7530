"""The identity every rank compares with rank 0's at start-up
(splat.distributed.same_run): the message for each kind of difference.
The multi-process check is in tests/test_distributed_train.py."""

from __future__ import annotations

import copy

from splat.distributed.same_run import code_identity, describe_mismatch


def identity(**changes) -> dict:
    ident = {
        "code": dict(code_identity()),
        "config": {"loss.ssim_lambda": 0.2, "train.iterations": 100},
        "data": {"path": "/a/scene", "fingerprint": "f0", "train": ["v0", "v1"], "test": ["v2"]},
    }
    ident = copy.deepcopy(ident)
    for where, value in changes.items():
        section, key = where.split("__")
        ident[section][key] = value
    return ident


def test_the_same_identity_passes():
    assert describe_mismatch(1, identity(data__path="/b/scene"), identity()) is None  # data.path may differ


def test_code_version_and_source_differences_are_named():
    assert "splat/trainer.py" in code_identity()
    e = describe_mismatch(1, identity(code__version="0.0.9"), identity())
    assert str(e).startswith("rank 1's code differs from rank 0's (splat 0.0.9 against ")
    e = describe_mismatch(2, identity(**{"code__splat/trainer.py": "0" * 16}), identity())
    assert str(e).startswith("rank 2's code differs from rank 0's (splat/trainer.py differs)")


def test_config_difference_names_the_first_key():
    e = describe_mismatch(1, identity(config__train=1), identity(config__train=2))
    assert str(e).startswith("rank 1's config differs from rank 0's at train (1 against 2)")
    e = describe_mismatch(1, identity(**{"config__loss.ssim_lambda": 0.5}), identity())
    assert str(e).startswith("rank 1's config differs from rank 0's at loss.ssim_lambda (0.5 against 0.2)")


def test_data_difference_names_the_folder_and_what_differs():
    e = describe_mismatch(1, identity(data__path="/b", data__fingerprint="f1", data__train=["v0", "v9"]), identity())
    assert str(e).startswith(
        "rank 1's training data differ from rank 0's (data.path /b on rank 1, /a/scene on rank 0: "
        "train image v9 where rank 0 has v1)"
    )
    e = describe_mismatch(1, identity(data__fingerprint="f1"), identity())
    assert "the same image names, different pixels, masks, cameras or points" in str(e)
