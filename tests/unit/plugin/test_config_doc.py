"""``nri-gpu config default``: the annotated default file cannot drift from the code."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import tomlkit

from nri_gpu.engine.config import EngineConfig, Policy
from nri_gpu.plugin.cli.__main__ import main
from nri_gpu.plugin.cli.config_doc import OPTIONS, TABLES, default_config
from nri_gpu.plugin.config import CdiConfig, PluginConfig, Settings, from_toml

ROOT = Path(__file__).resolve().parents[3]


def test_default_config_parses_into_exactly_the_defaults() -> None:
    assert from_toml(default_config(), source="default") == Settings()


def test_every_setting_is_documented_once_and_nothing_else() -> None:
    fields = {
        "plugin": {f.name for f in dataclasses.fields(PluginConfig)},
        "engine": {f.name for f in dataclasses.fields(EngineConfig)} - {"policy"},
        "policy": {f.name for f in dataclasses.fields(Policy)},
        "cdi": {f.name for f in dataclasses.fields(CdiConfig)},
    }
    listed = [(o.table, o.key) for o in OPTIONS]
    assert len(listed) == len(set(listed)), "an option is listed twice"
    for table in TABLES:
        assert {key for t, key in listed if t == table} == fields[table], table
    assert set(TABLES) == set(fields)


def test_every_key_is_in_the_text_with_a_comment_above() -> None:
    doc = tomlkit.parse(default_config()).unwrap()
    lines = default_config().splitlines()
    for option in OPTIONS:
        assert option.key in doc[option.table]
        assert option.doc.strip(), option.key
        at = lines.index(f"{option.key} = {option.default}")
        assert lines[at - 1].startswith("# "), option.key


@pytest.mark.parametrize(
    "key",
    [
        "accept_env_unprivileged",
        "annotation_namespaces",
        "namespaces",
        "legacy_image_all_gpus",
        "ldconfig",
        "metrics_address",
        "mps",
        "allow_untrusted_hook",
    ],
)
def test_security_relevant_options_say_so(key: str) -> None:
    (option,) = [o for o in OPTIONS if o.key == key]
    assert "Security:" in option.doc


def test_cli_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "default"], environ={}) == 0
    assert capsys.readouterr().out == default_config()


def test_readme_has_the_generated_text_verbatim() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "```toml\n" + default_config() + "```\n" in readme, "README is stale: paste `nri-gpu config default`"
