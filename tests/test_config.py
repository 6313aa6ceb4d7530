"""The typed config (splat/config.py): declarations, YAML loading, overrides, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from splat.config import DEFAULT_CONFIG, check_config, load_config
from splat.errors import ConfigError, SplatInputError

ROOT = Path(__file__).resolve().parents[1]


def test_config_files_list_every_field():
    """configs/*.yaml are complete recipes: every declared field is set in each file."""

    def keys(d, prefix=""):
        return {prefix + k if not isinstance(v, dict) else None for k, v in d.items()} - {None} | {
            x for k, v in d.items() if isinstance(v, dict) for x in keys(v, prefix + k + ".")
        }

    for path in sorted((ROOT / "configs").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        assert keys(data) == keys(DEFAULT_CONFIG), path.name
        assert load_config(str(path)) == check_config(load_config(str(path)))


@pytest.mark.parametrize(
    "override, words",
    [
        ("model.sh_degree=4", ["model.sh_degree", "<= 3", "4"]),
        ("model.sh_degree=1.5", ["model.sh_degree", "integer", "1.5"]),
        ("data.downscale=0", ["data.downscale", ">= 1", "0"]),
        ("data.downscale=0.5", ["data.downscale", "0.5"]),
        ("render.near=0", ["render.near", "> 0", "0"]),
        ("render.far=0.1", ["render.near", "render.far", "0.1"]),
        ("train.iterations=-1", ["train.iterations", ">= 0", "-1"]),
        ("train.iterations=lots", ["train.iterations", "integer", "lots"]),
        ("model.init_opacity=1.0", ["model.init_opacity", "< 1.0", "1.0"]),
        ("model.init_opacity=0", ["model.init_opacity", "> 0.0"]),
        ("data.background=[1,1]", ["data.background", "3 values"]),
        ("data.background=[1,1,2]", ["data.background", "<= 1.0", "2"]),
        ("data.background=white", ["data.background", "list", "white"]),
        ("data.layout=blender", ["data.layout", "'colmap'", "blender"]),
        ("device=gpu", ["device", "gpu"]),
        ("strategy.verbose=maybe", ["strategy.verbose", "true or false", "maybe"]),
        ("loss.dist_lambda=nan", ["loss.dist_lambda", "finite", "nan"]),
        ("loss.dist_lamda=5", ["unknown config key", "loss.dist_lamda"]),
        ("loss=5", ["loss", "section"]),
        ("train.iterations", ["train.iterations", "key=value"]),
    ],
)
def test_bad_override_names_key_and_value(override, words):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert isinstance(e.value, (SplatInputError, ValueError))
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


def test_values_are_converted_to_the_declared_types():
    cfg = load_config(
        None, ["train.lr.means=1e-4", "loss.dist_lambda=5", "data.background=[0, 0, 1]", "train.iterations=3.0"]
    )
    assert cfg["train"]["lr"]["means"] == 1e-4 and isinstance(cfg["train"]["lr"]["means"], float)
    assert isinstance(cfg["loss"]["dist_lambda"], float)
    assert cfg["data"]["background"] == [0.0, 0.0, 1.0]
    assert cfg["train"]["iterations"] == 3 and isinstance(cfg["train"]["iterations"], int)
    # cross-field rules are checked after all overrides, so their order does not matter
    cfg = load_config(None, ["render.near=200", "render.far=300"])
    assert (cfg["render"]["near"], cfg["render"]["far"]) == (200.0, 300.0)


@pytest.mark.parametrize(
    "text, words",
    [
        ("model: {sh_degree: 9}\n", ["bad.yaml", "model.sh_degree", "9"]),
        ("model:\n  sh_degree: [1\n", ["bad.yaml", "invalid YAML", "line"]),
        ("- 1\n- 2\n", ["bad.yaml", "mapping"]),
        ("modle: {sh_degree: 1}\n", ["bad.yaml", "unknown config key", "modle"]),
        ("model: 3\n", ["bad.yaml", "model", "section"]),
    ],
)
def test_bad_yaml_file_names_file_and_key(tmp_path, text, words):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(str(p))
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml: config file not found"):
        load_config(str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match="is a folder"):
        load_config(str(tmp_path))


def test_empty_yaml_gives_defaults(tmp_path):
    p = tmp_path / "empty.yaml"
    p.write_text("# nothing\n")
    assert load_config(str(p)) == check_config(DEFAULT_CONFIG)


def test_default_yaml_is_the_declared_defaults():
    """One set of defaults: configs/default.yaml sets every field to its
    declared default, so load_config() and `python train.py` train the same."""
    from_file = load_config(str(ROOT / "configs" / "default.yaml"))
    declared = check_config(DEFAULT_CONFIG)

    def differ(a, b, prefix=""):
        for k in a:
            if isinstance(a[k], dict):
                yield from differ(a[k], b[k], prefix + k + ".")
            elif a[k] != b[k] or type(a[k]) is not type(b[k]):
                yield f"{prefix}{k}: default.yaml {a[k]!r}, splat/config.py {b[k]!r}"

    assert not list(differ(from_file, declared))


def test_every_field_is_documented():
    """The generated config reference has a meaning for every field."""
    import dataclasses
    import typing

    from splat.config import SplatConfig

    def undocumented(cls, prefix=""):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                yield from undocumented(hints[f.name], prefix + f.name + ".")
            elif not f.metadata.get("doc"):
                yield prefix + f.name

    assert not list(undocumented(SplatConfig))
