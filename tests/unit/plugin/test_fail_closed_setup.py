"""``nri-gpu install`` setting up the NRI default validator (fail closed) on
containerd >= 2.2 and CRI-O >= 1.34, and saying why not on older releases.

Those releases are not packaged for this host, so what we write is decoded here
as the runtime decodes its config: by an independent TOML parser (``tomllib``,
not the tomlkit we edit with) into the documented schema, every key known and of
the type the runtime's struct declares (containerd ``internal/nri/config.go`` +
NRI ``plugins/default-validator``; CRI-O ``internal/config/nri/nri.go``). The
rest of the file is checked unchanged the same way, and, where the test bed has
the binary, containerd 2.1.9 itself still loads the edited file.
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from nri_gpu.plugin.cli import install as setup_cli
from nri_gpu.plugin.cli.__main__ import main
from nri_gpu.plugin.cli.runtime_setup import (
    CRIO_DROPIN_NAME,
    NRI_TABLE,
    TOLERATE_ANNOTATION,
    FailClosed,
    Record,
    backup_path,
    containerd_changes,
    containerd_enable,
    containerd_revert,
    crio_dropin,
    crio_dropin_is_ours,
    fail_closed_for,
    parse_record,
    parse_runtime_version,
)
from testbed import debs, runtimes

# containerd's DefaultValidatorConfig (toml tags) and CRI-O's DefaultValidatorConfig.
CONTAINERD_VALIDATOR_SCHEMA: dict[str, type] = {
    "enable": bool,
    "reject_oci_hook_adjustment": bool,
    "reject_runtime_default_seccomp_adjustment": bool,
    "reject_unconfined_seccomp_adjustment": bool,
    "reject_custom_seccomp_adjustment": bool,
    "reject_namespace_adjustment": bool,
    "reject_sysctl_adjustment": bool,
    "required_plugins": list,
    "tolerate_missing_plugins_annotation": str,
}
CRIO_NRI_SCHEMA: dict[str, type] = {
    "enable_nri": bool,
    "nri_listen": str,
    "nri_plugin_dir": str,
    "nri_plugin_config_dir": str,
    "nri_plugin_registration_timeout": str,
    "nri_plugin_request_timeout": str,
    "nri_disable_connections": bool,
    "default_validator": dict,
}
CRIO_VALIDATOR_SCHEMA: dict[str, type] = {
    "nri_enable_default_validator": bool,
    "nri_validator_reject_oci_hook_adjustment": bool,
    "nri_validator_reject_runtime_default_seccomp_adjustment": bool,
    "nri_validator_reject_unconfined_seccomp_adjustment": bool,
    "nri_validator_reject_custom_seccomp_adjustment": bool,
    "nri_validator_reject_namespace_adjustment": bool,
    "nri_validator_required_plugins": list,
    "nri_validator_tolerate_missing_plugins_annotation": str,
}


def _typed(table: dict[str, Any], schema: dict[str, type], where: str) -> dict[str, Any]:
    for key, value in table.items():
        assert key in schema, f"{where}: {key!r} is not a key the runtime knows"
        assert isinstance(value, schema[key]), f"{where}: {key} = {value!r} is not a {schema[key].__name__}"
        if schema[key] is list:
            assert all(isinstance(v, str) for v in value), f"{where}: {key} is not a list of strings"
    return table


def containerd_validator(text: str) -> dict[str, Any]:
    """``[plugins."io.containerd.nri.v1.nri".default_validator]`` as containerd decodes it."""
    doc = tomllib.loads(text)
    assert doc["version"] in (2, 3)
    table = doc["plugins"][NRI_TABLE].get("default_validator", {})
    return _typed(table, CONTAINERD_VALIDATOR_SCHEMA, "default_validator")


def without_validator(text: str) -> dict[str, Any]:
    doc = tomllib.loads(text)
    doc.get("plugins", {}).get(NRI_TABLE, {}).pop("default_validator", None)
    return doc


def crio_nri(text: str) -> dict[str, Any]:
    """``[crio.nri]`` of a drop-in as CRI-O decodes it."""
    doc = tomllib.loads(text)
    assert set(doc) == {"crio"} and set(doc["crio"]) == {"nri"}
    nri = _typed(doc["crio"]["nri"], CRIO_NRI_SCHEMA, "crio.nri")
    _typed(nri.get("default_validator", {}), CRIO_VALIDATOR_SCHEMA, "crio.nri.default_validator")
    return nri


def cli(*args: str) -> int:
    """The command as a user runs it; fail-closed is opt-in, so install here asks for it
    unless the test says otherwise (``plain_cli`` for the default)."""
    if args and args[0] == "install" and "--no-fail-closed" not in args:
        args = (*args, "--fail-closed")
    return main(list(args), environ={})


def plain_cli(*args: str) -> int:
    return main(list(args), environ={})


V3 = """\
version = 3
root = '/var/lib/containerd'   # keep

[plugins]
  [plugins.'io.containerd.cri.v1.runtime']
    enable_cdi = true

  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    socket_path = '/var/run/nri/nri.sock'
"""

WANT = {"enable": True, "required_plugins": ["nri-gpu"], "tolerate_missing_plugins_annotation": TOLERATE_ANNOTATION}


# ------------------------------------------------------------------ which releases


@pytest.mark.parametrize(
    ("runtime", "output", "version"),
    [
        pytest.param(
            "containerd", "containerd github.com/containerd/containerd/v2 v2.2.0 1c4457e0\n", (2, 2, 0), id="2.2"
        ),
        pytest.param("containerd", "containerd containerd.io 1.7.27 05044ec0\n", (1, 7, 27), id="docker-io"),
        pytest.param(
            "containerd",
            "containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+b1\n",
            (1, 7, 24),
            id="debian",
        ),
        pytest.param("containerd", "something else\n", None, id="garbage"),
        pytest.param("containerd", "", None, id="empty"),
        pytest.param("crio", "crio version 1.34.0\n", (1, 34, 0), id="crio"),
        pytest.param("crio", "INFO something\nVersion:        1.33.2\nGitCommit: abc\n", (1, 33, 2), id="crio-table"),
        pytest.param("crio", "version unknown\n", None, id="crio-garbage"),
    ],
)
def test_the_runtime_version_is_read_from_its_version_output(
    runtime: str, output: str, version: tuple[int, int, int] | None
) -> None:
    assert parse_runtime_version(runtime, output) == version


@pytest.mark.parametrize(
    ("runtime", "version", "written"),
    [
        pytest.param("containerd", (1, 7, 24), False, id="containerd-1.7"),
        pytest.param("containerd", (2, 1, 9), False, id="containerd-2.1"),
        pytest.param("containerd", (2, 2, 0), True, id="containerd-2.2"),
        pytest.param("containerd", (2, 3, 1), True, id="containerd-2.3"),
        pytest.param("crio", (1, 33, 9), False, id="crio-1.33"),
        pytest.param("crio", (1, 34, 0), True, id="crio-1.34"),
    ],
)
def test_fail_closed_is_set_up_from_the_first_release_with_the_default_validator(
    runtime: str, version: tuple[int, int, int], written: bool
) -> None:
    spec, why = fail_closed_for(runtime, version, "")
    assert (spec is not None) is written
    if not written:
        assert "has no NRI default validator" in why and "starts without its GPUs" in why


def test_an_unknown_version_is_not_guessed() -> None:
    spec, why = fail_closed_for("containerd", None, "containerd is not on PATH")
    assert spec is None and "containerd is not on PATH" in why and "--runtime-version" in why


# ------------------------------------------------------------------ containerd >= 2.2


def test_containerd_2_2_install_requires_the_plugin_and_uninstall_restores_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(V3)
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--runtime-version", "2.2.0") == 0
    out = capsys.readouterr().out
    assert "fail-closed: containerd 2.2.0 refuses to create a container while nri-gpu is not registered" in out
    written = config.read_text()
    assert containerd_validator(written) == WANT
    assert without_validator(written) == tomllib.loads(V3)  # nothing else changed
    assert written.startswith(V3)  # appended: every byte before it kept

    # Twice: no change.
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--runtime-version", "2.2.0") == 0
    assert "already set up" in capsys.readouterr().out
    assert config.read_text() == written

    assert cli("uninstall", "--runtime", "containerd", "--config", str(config)) == 0
    assert config.read_text() == V3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]


def test_containerd_older_than_2_2_gets_no_validator_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(V3.replace("disable = false", "disable = true"))
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--runtime-version", "v2.1.9") == 0
    out = capsys.readouterr().out
    assert "fail-closed: not set up: containerd 2.1.9 has no NRI default validator (new in containerd 2.2.0)" in out
    assert "default_validator" not in config.read_text()


def test_dry_run_shows_the_validator_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    config.write_text(V3)
    args = ("install", "--runtime", "containerd", "--config", str(config), "--runtime-version", "2.3.0", "--dry-run")
    assert cli(*args) == 0
    out = capsys.readouterr().out
    assert f'+[plugins."{NRI_TABLE}".default_validator]' in out and '+  required_plugins = ["nri-gpu"]' in out
    assert "dry run: nothing written" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"] and config.read_text() == V3


def test_no_fail_closed_leaves_the_validator_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    config.write_text(V3)
    assert (
        cli(
            "install",
            "--runtime",
            "containerd",
            "--config",
            str(config),
            "--runtime-version",
            "2.2.0",
            "--no-fail-closed",
        )
        == 0
    )
    assert "fail-closed: not set up (--no-fail-closed)" in capsys.readouterr().out
    assert config.read_text() == V3


ADMIN = (
    V3
    + """
    [plugins.'io.containerd.nri.v1.nri'.default_validator]
      enable = false   # the admin's
      reject_oci_hook_adjustment = false
      required_plugins = ['policy-agent']
      tolerate_missing_plugins_annotation = 'example.com/tolerate-nri'
"""
)


def test_an_admins_validator_keeps_its_keys_and_gets_our_name_added(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(ADMIN)
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--runtime-version", "2.2.1") == 0
    written = config.read_text()
    assert containerd_validator(written) == {
        "enable": True,
        "reject_oci_hook_adjustment": False,
        "required_plugins": ["policy-agent", "nri-gpu"],
        "tolerate_missing_plugins_annotation": "example.com/tolerate-nri",  # the admin's name is kept
    }
    assert "# the admin's" in written
    assert cli("uninstall", "--runtime", "containerd", "--config", str(config)) == 0
    assert config.read_text() == ADMIN


def test_revert_after_an_operator_edit_restores_only_our_validator_keys() -> None:
    changes = containerd_changes(ADMIN, None, "config", FailClosed())
    after = containerd_enable(ADMIN, changes, "config")
    edited = after.replace("root = '/var/lib/containerd'", "root = '/data/containerd'")
    reverted, warnings = containerd_revert(edited, changes, "config")
    assert warnings == []
    assert tomllib.loads(reverted) == tomllib.loads(ADMIN.replace("/var/lib/containerd", "/data/containerd"))


def test_revert_removes_the_validator_table_we_appended() -> None:
    changes = containerd_changes(V3, None, "config", FailClosed())
    after = containerd_enable(V3, changes, "config")
    reverted, warnings = containerd_revert(after + "\n# a comment\n", changes, "config")
    assert warnings == [] and "default_validator" not in reverted
    assert tomllib.loads(reverted) == tomllib.loads(V3)


@pytest.mark.parametrize("name", ["nri-gpu", "10-nri-gpu"])
def test_a_plugin_already_required_is_not_added_again(name: str) -> None:
    text = ADMIN.replace("['policy-agent']", f"['{name}']")
    keys = [c.key for c in containerd_changes(text, None, "config", FailClosed())]
    assert keys == ["default_validator.enable"]


def test_a_required_plugins_that_is_not_a_list_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    config.write_text(ADMIN.replace("['policy-agent']", "'policy-agent'"))
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--runtime-version", "2.2.0") == 1
    assert "required_plugins is not a list of names" in capsys.readouterr().err


def test_a_missing_config_is_created_with_the_validator(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--runtime-version", "2.2.0") == 0
    assert containerd_validator(config.read_text()) == WANT
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--runtime-version", "2.2.0") == 0
    assert cli("uninstall", "--runtime", "containerd", "--config", str(config)) == 0
    assert list(tmp_path.iterdir()) == []


def test_the_record_keeps_list_values() -> None:
    changes = containerd_changes(ADMIN, None, "config", FailClosed())
    record = Record(False, changes, "0" * 64)
    assert parse_record(record.to_bytes(), "record") == record


def test_the_plugin_name_is_configurable(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(V3)
    args = ("--runtime-version", "2.2.0", "--plugin-name", "gpus")
    assert cli("install", "--runtime", "containerd", "--config", str(config), *args) == 0
    assert containerd_validator(config.read_text())["required_plugins"] == ["gpus"]


def test_the_edited_file_still_loads_in_a_packaged_containerd(tmp_path: Path) -> None:
    """containerd 2.1.9 has no validator, so it only proves the rest of the file is
    intact; the validator table is checked against the schema above."""
    try:
        binary = runtimes.fetch("2.1.9").containerd
    except debs.DebUnavailable as exc:
        pytest.skip(f"containerd packages unavailable: {exc}")
    config = tmp_path / "config.toml"
    config.write_text(V3)
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--runtime-version", "2.2.0") == 0
    done = subprocess.run([binary, "--config", config, "config", "dump"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------ detecting the version


def test_the_version_is_asked_from_the_binary_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "bin" / "containerd"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'containerd github.com/containerd/containerd/v2 v2.2.0 1c4457e0'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(setup_cli.shutil, "which", lambda name: str(fake) if name == "containerd" else None)
    config = tmp_path / "config.toml"
    config.write_text(V3)
    assert cli("install", "--runtime", "containerd", "--config", str(config)) == 0
    assert containerd_validator(config.read_text()) == WANT
    assert "fail-closed: containerd 2.2.0 refuses" in capsys.readouterr().out


def test_no_binary_on_path_writes_no_validator_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(setup_cli.shutil, "which", lambda name: None)
    config = tmp_path / "config.toml"
    config.write_text(V3)
    assert cli("install", "--runtime", "containerd", "--config", str(config)) == 0
    out = capsys.readouterr().out
    assert "could not tell the containerd version (containerd is not on PATH)" in out
    assert config.read_text() == V3


def test_a_runtime_version_that_is_not_one_is_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    config.write_text(V3)
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--runtime-version", "latest") == 0
    assert "--runtime-version 'latest' is not a version" in capsys.readouterr().out
    assert config.read_text() == V3


# ------------------------------------------------------------------ CRI-O >= 1.34


def test_crio_1_34_dropin_requires_the_plugin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("install", "--runtime", "crio", "--config", str(tmp_path), "--runtime-version", "1.34.0") == 0
    assert "fail-closed: CRI-O 1.34.0 refuses" in capsys.readouterr().out
    text = (tmp_path / CRIO_DROPIN_NAME).read_text()
    assert crio_nri(text) == {
        "enable_nri": True,
        "default_validator": {
            "nri_enable_default_validator": True,
            "nri_validator_required_plugins": ["nri-gpu"],
            "nri_validator_tolerate_missing_plugins_annotation": TOLERATE_ANNOTATION,
        },
    }
    assert crio_dropin_is_ours(text)
    assert cli("install", "--runtime", "crio", "--config", str(tmp_path), "--runtime-version", "1.34.0") == 0
    assert "already set up" in capsys.readouterr().out
    assert cli("uninstall", "--runtime", "crio", "--config", str(tmp_path)) == 0
    assert list(tmp_path.iterdir()) == []


def test_crio_1_33_dropin_has_no_validator_and_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("install", "--runtime", "crio", "--config", str(tmp_path), "--runtime-version", "1.33.2") == 0
    assert "CRI-O 1.33.2 has no NRI default validator (new in CRI-O 1.34.0)" in capsys.readouterr().out
    assert crio_nri((tmp_path / CRIO_DROPIN_NAME).read_text()) == {"enable_nri": True}


def test_crio_upgraded_to_1_34_gets_our_dropin_rewritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("install", "--runtime", "crio", "--config", str(tmp_path), "--runtime-version", "1.33.2") == 0
    assert cli("install", "--runtime", "crio", "--config", str(tmp_path), "--runtime-version", "1.34.0") == 0
    assert "rewritten" in capsys.readouterr().out
    assert crio_nri((tmp_path / CRIO_DROPIN_NAME).read_text())["default_validator"]["nri_enable_default_validator"]


def test_a_changed_crio_dropin_with_a_validator_is_not_ours() -> None:
    text = crio_dropin(None, FailClosed())
    assert crio_dropin_is_ours(text)
    assert not crio_dropin_is_ours(text.replace('["nri-gpu"]', '["nri-gpu", "other"]'))
    assert not crio_dropin_is_ours(text + "nri_validator_reject_oci_hook_adjustment = true\n")


def test_backup_path_is_unchanged_by_fail_closed(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(V3)
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--runtime-version", "2.2.0") == 0
    assert backup_path(config).read_text() == V3


def test_fail_closed_is_opt_in(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A required plugin holds back every container of the node while it is away (CNI and
    kube-proxy pods too): install sets it up only when asked, and says how."""
    config = tmp_path / "config.toml"
    config.write_text(V3)
    assert plain_cli("install", "--runtime", "containerd", "--config", str(config), "--runtime-version", "2.2.0") == 0
    out = capsys.readouterr().out
    assert "fail-closed: not set up; --fail-closed makes the runtime refuse every container" in out, out
    assert "default_validator" not in config.read_text()
