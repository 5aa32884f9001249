"""``nri-gpu install``/``uninstall`` of containerd's config, checked against the real
containerd binaries (1.7.24 for config version 2, 2.1.9 for version 3): the default
config each writes, and the edited file loaded back by ``containerd config dump``.
Integration, not unit: the binaries come from Debian's packages (downloaded once);
the edits' other properties are unit tests (tests/unit/plugin/test_runtime_setup.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from nri_gpu.plugin.cli.runtime_setup import NRI_TABLE, backup_path
from testbed import debs, runtimes
from tests.unit.plugin.test_runtime_setup import HAND_WRITTEN, cli, files


@pytest.fixture(scope="module")
def containerd() -> dict[int, Path]:
    """containerd binaries by config version: 2 -> 1.7.24, 3 -> 2.1.9."""
    try:
        return {2: runtimes.fetch("1.7.24").containerd, 3: runtimes.fetch("2.1.9").containerd}
    except debs.DebUnavailable as exc:
        pytest.skip(f"containerd packages unavailable: {exc}")


def default_config(binary: Path) -> str:
    return subprocess.run([binary, "config", "default"], check=True, capture_output=True, text=True).stdout


def dump(binary: Path, path: Path) -> dict[str, Any]:
    """The config as containerd loads it (fails the test if containerd rejects it)."""
    done = subprocess.run([binary, "--config", path, "config", "dump"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return tomlkit.parse(done.stdout).unwrap()


def nri_of(config: dict[str, Any]) -> dict[str, Any]:
    table = config["plugins"][NRI_TABLE]
    assert isinstance(table, dict)
    return table


def test_v2_default_install_enables_nri_and_uninstall_restores_bytes(
    tmp_path: Path, containerd: dict[int, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    original = default_config(containerd[2]).encode()
    config.write_bytes(original)
    assert nri_of(dump(containerd[2], config))["disable"] is True

    assert cli("install", "--runtime", "containerd", "--config", str(config)) == 0
    out = capsys.readouterr().out
    assert "disable = false (was true)" in out and "systemctl restart containerd" in out
    assert nri_of(dump(containerd[2], config))["disable"] is False
    # Only the one line changed.
    before, after = original.decode().splitlines(), config.read_text().splitlines()
    assert len(before) == len(after)
    assert [(a, b) for a, b in zip(before, after, strict=True) if a != b] == [
        ("    disable = true", "    disable = false")
    ]
    assert backup_path(config).read_bytes() == original

    assert cli("uninstall", "--runtime", "containerd", "--config", str(config)) == 0
    assert config.read_bytes() == original
    assert files(tmp_path) == {"config.toml": original}


def test_install_twice_changes_nothing(
    tmp_path: Path, containerd: dict[int, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(default_config(containerd[2]))
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--socket", "/run/nri/gpu.sock") == 0
    first = files(tmp_path)
    capsys.readouterr()
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--socket", "/run/nri/gpu.sock") == 0
    out = capsys.readouterr().out
    assert "already set up" in out and "systemctl" not in out
    assert files(tmp_path) == first
    assert nri_of(dump(containerd[2], config))["socket_path"] == "/run/nri/gpu.sock"


def test_comment_rich_file_keeps_every_comment(tmp_path: Path, containerd: dict[int, Path]) -> None:
    config = tmp_path / "config.toml"
    config.write_text(HAND_WRITTEN)
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--socket", "/run/nri/gpu.sock") == 0
    text = config.read_text()
    for line in HAND_WRITTEN.splitlines():
        if "#" in line and "flipped by install" not in line:
            assert line in text, line
    assert "    disable = false   # flipped by install" in text
    loaded = dump(containerd[2], config)
    assert nri_of(loaded)["disable"] is False and nri_of(loaded)["socket_path"] == "/run/nri/gpu.sock"
    assert loaded["plugins"]["io.containerd.grpc.v1.cri"]["sandbox_image"] == "registry.k8s.io/pause:3.9"
    assert loaded["metrics"]["address"] == "127.0.0.1:1338"
    assert cli("uninstall", "--runtime", "containerd", "--config", str(config)) == 0
    assert config.read_text() == HAND_WRITTEN


def test_file_without_the_nri_table_gets_it_appended(tmp_path: Path, containerd: dict[int, Path]) -> None:
    original = HAND_WRITTEN.split("  # NRI was off here")[0] + "[metrics]\n  address = ''\n"
    config = tmp_path / "config.toml"
    config.write_text(original)
    assert cli("install", "--runtime", "containerd", "--config", str(config)) == 0
    assert config.read_text().startswith(original)  # the operator's part is untouched
    assert nri_of(dump(containerd[2], config))["disable"] is False
    assert cli("uninstall", "--runtime", "containerd", "--config", str(config)) == 0
    assert config.read_text() == original


def test_operator_edit_after_install_reverts_only_our_keys(
    tmp_path: Path, containerd: dict[int, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(HAND_WRITTEN)
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--socket", "/run/nri/gpu.sock") == 0
    edited = config.read_text().replace('"127.0.0.1:1338"', '"0.0.0.0:1338"  # opened for prometheus')
    config.write_text(edited)
    capsys.readouterr()

    assert cli("uninstall", "--runtime", "containerd", "--config", str(config)) == 0
    err = capsys.readouterr().err
    assert "changed since install" in err and str(config) in err
    assert config.read_text() == HAND_WRITTEN.replace('"127.0.0.1:1338"', '"0.0.0.0:1338"  # opened for prometheus')
    assert files(tmp_path).keys() == {"config.toml"}
    loaded = dump(containerd[2], config)
    assert nri_of(loaded)["disable"] is True and nri_of(loaded)["socket_path"] == "/var/run/nri/nri.sock"


def test_dry_run_writes_nothing_and_prints_the_diff(
    tmp_path: Path, containerd: dict[int, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(default_config(containerd[2]))
    before = files(tmp_path)
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--dry-run") == 0
    out = capsys.readouterr().out
    assert f"--- {config}" in out and "-    disable = true\n+    disable = false\n" in out
    assert "nothing written" in out
    assert files(tmp_path) == before

    assert cli("install", "--runtime", "containerd", "--config", str(config)) == 0
    installed = files(tmp_path)
    assert cli("uninstall", "--runtime", "containerd", "--config", str(config), "--dry-run") == 0
    assert "+    disable = true\n" in capsys.readouterr().out
    assert files(tmp_path) == installed


def test_missing_file_is_created_minimal_and_removed(
    tmp_path: Path, containerd: dict[int, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "etc" / "config.toml"
    assert cli("install", "--runtime", "containerd", "--config", str(config)) == 0
    assert "created" in capsys.readouterr().out
    for version in (2, 3):  # containerd 2.x reads a version 2 file too
        assert nri_of(dump(containerd[version], config))["disable"] is False
    assert cli("uninstall", "--runtime", "containerd", "--config", str(config)) == 0
    assert list(config.parent.iterdir()) == []


def test_v3_default_has_nothing_to_change(
    tmp_path: Path, containerd: dict[int, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(default_config(containerd[3]))
    before = files(tmp_path)
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--restart") == 0
    out = capsys.readouterr().out
    assert "NRI is on by default in containerd 2.x; nothing to change" in out and "systemctl" not in out
    assert files(tmp_path) == before


def test_v3_socket_change_round_trips(tmp_path: Path, containerd: dict[int, Path]) -> None:
    config = tmp_path / "config.toml"
    original = default_config(containerd[3]).encode()
    config.write_bytes(original)
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--socket", "/run/nri/gpu.sock") == 0
    assert nri_of(dump(containerd[3], config))["socket_path"] == "/run/nri/gpu.sock"
    assert cli("uninstall", "--runtime", "containerd", "--config", str(config)) == 0
    assert config.read_bytes() == original
    assert files(tmp_path).keys() == {"config.toml"}


def test_v3_nri_disabled_by_operator_is_enabled(tmp_path: Path, containerd: dict[int, Path]) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f"version = 3\n\n[plugins.'{NRI_TABLE}']\n  disable = true\n")
    assert cli("install", "--runtime", "containerd", "--config", str(config)) == 0
    assert nri_of(dump(containerd[3], config))["disable"] is False


@pytest.mark.parametrize("socket", [None, "/run/nri/a.sock"])
def test_a_second_install_with_another_socket_keeps_the_first_original(
    tmp_path: Path, containerd: dict[int, Path], socket: str | None
) -> None:
    config = tmp_path / "config.toml"
    original = default_config(containerd[2]).encode()
    config.write_bytes(original)
    first = ["--socket", socket] if socket else []
    assert cli("install", "--runtime", "containerd", "--config", str(config), *first) == 0
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--socket", "/run/nri/b.sock") == 0
    assert nri_of(dump(containerd[2], config))["socket_path"] == "/run/nri/b.sock"
    assert backup_path(config).read_bytes() == original
    assert cli("uninstall", "--runtime", "containerd", "--config", str(config)) == 0
    assert files(tmp_path) == {"config.toml": original}
