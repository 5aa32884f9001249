"""``nri-gpu install`` / ``uninstall`` for Docker and podman: the CDI spec and daemon.json."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nri_gpu.plugin.cli import install as setup_cli
from nri_gpu.plugin.cli.__main__ import main
from nri_gpu.plugin.cli.config_files import FileRefused
from nri_gpu.plugin.cli.docker_setup import (
    DaemonChange,
    daemon_cdi_change,
    daemon_enable,
    daemon_revert,
    install_spec_runtime,
    needs_cdi_feature,
    parse_docker_version,
    uninstall_spec_runtime,
)
from nri_gpu.plugin.cli.runtime_setup import SetupError, backup_path, record_path

SPEC = json.dumps({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": "0"}]}, indent=2) + "\n"

DAEMONS = {
    "existing-keys": '{\n  "log-driver": "json-file",\n  "debug": true\n}\n',
    "one-line": '{"log-driver":"json-file"}',
    "empty": "{}\n",
    "features-object": '{\n\t"features": {\n\t\t"buildkit": true\n\t},\n\t"debug": false\n}\n',
    "empty-features": '{\n  "features": {}\n}\n',
    "cdi-false": '{"features": {"cdi": false, "containerd-snapshotter": true}, "x": [1, 2]}\n',
}


@pytest.mark.parametrize("text", DAEMONS.values(), ids=DAEMONS.keys())
def test_enable_keeps_every_other_key_and_revert_gives_the_bytes_back(text: str) -> None:
    change = daemon_cdi_change(text, needed=True)
    assert change is not None
    after = daemon_enable(text, change)
    before, now = json.loads(text), json.loads(after)
    assert now["features"]["cdi"] is True
    assert list(now) == list(before) + ([] if "features" in before else ["features"])  # order kept
    assert {k: v for k, v in now.items() if k != "features"} == {k: v for k, v in before.items() if k != "features"}
    assert {k: v for k, v in now["features"].items() if k != "cdi"} == {
        k: v for k, v in before.get("features", {}).items() if k != "cdi"
    }
    assert daemon_revert(after, change) == (text, [])


def test_the_layout_is_kept_not_reserialised() -> None:
    text = DAEMONS["existing-keys"]
    expected = '{\n  "log-driver": "json-file",\n  "debug": true,\n  "features": {\n    "cdi": true\n  }\n}\n'
    assert daemon_enable(text, DaemonChange(None, True)) == expected
    tabs = DAEMONS["features-object"]
    assert daemon_enable(tabs, DaemonChange(None, False)) == tabs.replace(
        '"buildkit": true', '"buildkit": true,\n\t\t"cdi": true'
    )
    assert daemon_enable('{"a":1}', DaemonChange(None, True)) == '{"a":1, "features": {"cdi": true}}'


def test_an_absent_file_is_created_with_only_features_cdi() -> None:
    change = daemon_cdi_change(None, needed=True)
    assert change == DaemonChange(None, True)
    assert json.loads(daemon_enable(None, change)) == {"features": {"cdi": True}}


def test_cdi_already_true_or_not_needed_is_no_change() -> None:
    assert daemon_cdi_change('{"features": {"cdi": true}}', needed=True) is None
    assert daemon_cdi_change('{"debug": true}', needed=False) is None
    assert daemon_cdi_change(None, needed=False) is None
    # Turned off by hand: even Docker 28.2+ needs it back on.
    assert daemon_cdi_change('{"features": {"cdi": false}}', needed=False) == DaemonChange(False, False)


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"debug": true,}', "not valid JSON"),
        ("[]", "not a JSON object"),
        ('{"features": true}', '"features" is not an object'),
        ('{"features": {"cdi": "yes"}}', "not true or false"),
        ('{"debug": true, "debug": false}', "twice"),
    ],
    ids=["trailing-comma", "array", "features-not-object", "cdi-not-bool", "duplicate-key"],
)
def test_a_daemon_json_we_cannot_edit_safely_is_refused_by_name(text: str, why: str) -> None:
    with pytest.raises(SetupError, match=why) as caught:
        daemon_cdi_change(text, needed=True, source="/etc/docker/daemon.json")
    assert "/etc/docker/daemon.json" in str(caught.value)


@pytest.mark.parametrize(
    "output, version",
    [
        ("28.5.2\n", (28, 5, 2)),
        ("Docker version 26.1.5+dfsg1, build a72d7cd\n", (26, 1, 5)),
        ("Cannot connect to the Docker daemon", None),
    ],
)
def test_docker_version_is_parsed(output: str, version: tuple[int, int, int] | None) -> None:
    assert parse_docker_version(output) == version


def test_features_cdi_is_needed_before_28_2_and_refused_before_25() -> None:
    assert needs_cdi_feature((28, 1, 1)) and needs_cdi_feature(None)
    assert not needs_cdi_feature((28, 2, 0))
    with pytest.raises(SetupError, match="no CDI support"):
        needs_cdi_feature((24, 0, 9))


def _paths(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "cdi" / "nri-gpu.json", tmp_path / "docker" / "daemon.json"


def test_install_twice_is_no_change_and_uninstall_restores_the_bytes(tmp_path: Path) -> None:
    spec, daemon = _paths(tmp_path)
    daemon.parent.mkdir()
    original = DAEMONS["features-object"].encode()
    daemon.write_bytes(original)
    os.chmod(daemon, 0o600)
    first = install_spec_runtime("docker", spec, SPEC, daemon, needed=True)
    assert first.changed and first.restart
    assert json.loads(daemon.read_text())["features"] == {"buildkit": True, "cdi": True}
    assert daemon.stat().st_mode & 0o777 == 0o600  # mode kept
    assert spec.read_text() == SPEC
    assert any("docker run --rm --device nvidia.com/gpu=0" in m for m in first.messages)
    written = daemon.read_bytes()
    second = install_spec_runtime("docker", spec, SPEC, daemon, needed=True)
    assert not second.changed and not second.restart
    assert daemon.read_bytes() == written
    assert backup_path(daemon).read_bytes() == original
    undone = uninstall_spec_runtime(spec, daemon)
    assert undone.changed and undone.restart
    assert daemon.read_bytes() == original
    assert not spec.exists()
    assert sorted(p.name for p in daemon.parent.iterdir()) == ["daemon.json"]


def test_a_daemon_json_install_created_is_removed(tmp_path: Path) -> None:
    spec, daemon = _paths(tmp_path)
    install_spec_runtime("docker", spec, SPEC, daemon, needed=True)
    assert json.loads(daemon.read_text()) == {"features": {"cdi": True}}
    uninstall_spec_runtime(spec, daemon)
    assert list(daemon.parent.iterdir()) == []


def test_uninstall_after_an_edit_reverts_only_features_cdi(tmp_path: Path) -> None:
    spec, daemon = _paths(tmp_path)
    daemon.parent.mkdir()
    daemon.write_text(DAEMONS["existing-keys"])
    install_spec_runtime("docker", spec, SPEC, daemon, needed=True)
    edited = daemon.read_text().replace('"debug": true', '"debug": false')
    daemon.write_text(edited)
    result = uninstall_spec_runtime(spec, daemon)
    assert json.loads(daemon.read_text()) == {"log-driver": "json-file", "debug": False}
    assert any("changed since install" in w for w in result.warnings)
    assert not record_path(daemon).exists() and not backup_path(daemon).exists()


def test_docker_28_2_gets_the_spec_only(tmp_path: Path) -> None:
    spec, daemon = _paths(tmp_path)
    result = install_spec_runtime("docker", spec, SPEC, daemon, needed=False)
    assert result.changed and not result.restart
    assert not daemon.parent.exists()
    assert any("on by default since Docker 28.2" in m for m in result.messages)


def test_dry_run_prints_a_diff_and_writes_nothing(tmp_path: Path) -> None:
    spec, daemon = _paths(tmp_path)
    daemon.parent.mkdir()
    daemon.write_text(DAEMONS["existing-keys"])
    result = install_spec_runtime("docker", spec, SPEC, daemon, needed=True, dry_run=True)
    assert '+  "features": {' in result.diff and f"+++ {spec}" in result.diff
    assert daemon.read_text() == DAEMONS["existing-keys"]
    assert not spec.exists() and not record_path(daemon).exists()
    install_spec_runtime("docker", spec, SPEC, daemon, needed=True)
    undo = uninstall_spec_runtime(spec, daemon, dry_run=True)
    assert '-  "features": {' in undo.diff and spec.exists() and record_path(daemon).exists()


def test_a_link_at_daemon_json_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    spec, daemon = _paths(tmp_path)
    daemon.parent.mkdir()
    real = tmp_path / "real.json"
    real.write_text("{}\n")
    daemon.symlink_to(real)
    with pytest.raises(Exception, match="symbolic link"):
        install_spec_runtime("docker", spec, SPEC, daemon, needed=True)
    assert daemon.is_symlink() and real.read_text() == "{}\n"
    assert not spec.exists()


def _hostile(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)  # opened for reading, it would block install forever
    else:
        with path.open("wb") as f:
            f.truncate(100 << 20)  # sparse: 100 MB that cost no disk


@pytest.mark.parametrize("kind", ["fifo", "huge"])
def test_a_fifo_or_huge_daemon_json_is_refused_without_reading_it(tmp_path: Path, kind: str) -> None:
    spec, daemon = _paths(tmp_path)
    daemon.parent.mkdir()
    _hostile(daemon, kind)
    with pytest.raises(FileRefused, match="not a regular file" if kind == "fifo" else "is over"):
        install_spec_runtime("docker", spec, SPEC, daemon, needed=True)
    assert not spec.exists() and not record_path(daemon).exists()


@pytest.mark.parametrize("kind", ["fifo", "huge"])
def test_uninstall_refuses_a_daemon_json_swapped_for_a_fifo_or_huge_file(tmp_path: Path, kind: str) -> None:
    spec, daemon = _paths(tmp_path)
    install_spec_runtime("docker", spec, SPEC, daemon, needed=True)
    daemon.unlink()
    _hostile(daemon, kind)
    with pytest.raises(FileRefused):
        uninstall_spec_runtime(spec, daemon)
    assert record_path(daemon).exists()  # the record is kept: uninstall can run again once fixed


def test_a_malformed_daemon_json_is_refused_before_the_spec_is_written(tmp_path: Path) -> None:
    spec, daemon = _paths(tmp_path)
    daemon.parent.mkdir()
    daemon.write_text("{ debug: true }")
    with pytest.raises(SetupError, match=str(daemon)):
        install_spec_runtime("docker", spec, SPEC, daemon, needed=True)
    assert not spec.exists()


def test_cdi_spec_dirs_without_the_spec_folder_is_warned(tmp_path: Path) -> None:
    spec, daemon = _paths(tmp_path)
    daemon.parent.mkdir()
    daemon.write_text('{"cdi-spec-dirs": ["/srv/cdi"]}\n')
    result = install_spec_runtime("docker", spec, SPEC, daemon, needed=False)
    assert any(f"dockerd will not read {spec}" in w for w in result.warnings)
    daemon.write_text(json.dumps({"cdi-spec-dirs": [f"{spec.parent}/"]}))
    assert not install_spec_runtime("docker", spec, SPEC, daemon, needed=False).warnings


def test_podman_gets_the_spec_and_uninstall_removes_it(tmp_path: Path) -> None:
    spec, _ = _paths(tmp_path)
    result = install_spec_runtime("podman", spec, SPEC, None, needed=False)
    assert result.changed and not result.restart and spec.stat().st_mode & 0o777 == 0o644
    assert any("podman run --rm --device nvidia.com/gpu=0" in m for m in result.messages)
    assert not install_spec_runtime("podman", spec, SPEC, None, needed=False).changed
    assert uninstall_spec_runtime(spec, None).changed
    assert not spec.exists()
    assert not uninstall_spec_runtime(spec, None).changed


def test_a_spec_that_is_not_ours_is_neither_overwritten_nor_removed(tmp_path: Path) -> None:
    spec, _ = _paths(tmp_path)
    spec.parent.mkdir()
    spec.write_text('{"kind": "example.com/other", "devices": []}')
    with pytest.raises(SetupError, match=r"not a CDI spec of kind nvidia\.com/gpu"):
        install_spec_runtime("podman", spec, SPEC, None, needed=False)
    with pytest.raises(SetupError, match="left in place"):
        uninstall_spec_runtime(spec, None)
    assert "example.com/other" in spec.read_text()


def _docker_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, list[str]]:
    """The spec and daemon.json paths, and ``install --runtime docker`` for them, with ``SPEC`` as the spec."""
    spec, daemon = _paths(tmp_path)
    monkeypatch.setattr(setup_cli, "_spec", lambda args, argv0: (SPEC, "/", "/usr/bin/nri-gpu-hook"))
    return (
        spec,
        daemon,
        ["install", "--runtime", "docker", "--config", str(daemon), "--cdi-spec", str(spec), "--no-unit"],
    )


def test_the_cli_installs_for_docker_with_a_given_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec, daemon, argv = _docker_cli(tmp_path, monkeypatch)
    assert main([*argv, "--runtime-version", "26.1.5"]) == 0
    out = capsys.readouterr().out
    assert "Docker version 26.1.5" in out and "systemctl restart docker" in out
    assert json.loads(daemon.read_text()) == {"features": {"cdi": True}}
    assert main([*argv, "--runtime-version", "26.1.5"]) == 0
    assert "systemctl" not in capsys.readouterr().out  # nothing changed: no restart asked for
    units = ["--unit-dir", str(tmp_path / "units")]
    assert main(["uninstall", "--runtime", "docker", "--config", str(daemon), "--cdi-spec", str(spec), *units]) == 0
    assert not daemon.exists() and not spec.exists()


def test_the_cli_refuses_docker_before_25(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec, daemon, argv = _docker_cli(tmp_path, monkeypatch)
    assert main([*argv, "--runtime-version", "24.0.7"]) == 1
    assert "no CDI support" in capsys.readouterr().err
    assert not spec.exists() and not daemon.exists()


def test_the_cli_asks_dockerd_for_its_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec, daemon = _paths(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "dockerd"
    fake.write_text("#!/bin/sh\necho 'Docker version 28.5.2, build 89c5e8f'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(setup_cli, "_spec", lambda args, argv0: (SPEC, "/", "/usr/bin/nri-gpu-hook"))
    monkeypatch.setattr(setup_cli.shutil, "which", lambda name: str(fake) if name == "dockerd" else None)
    argv = [
        "install",
        "--runtime",
        "docker",
        "--config",
        str(daemon),
        "--cdi-spec",
        str(spec),
        "--dry-run",
        "--no-unit",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Docker version 28.5.2" in out and "on by default" in out and "dry run: nothing written" in out
    assert not spec.exists()


def test_the_cli_writes_a_real_spec_for_podman(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from testbed.gpunode import FIXTURE_DRIVER, build_node

    node = build_node(tmp_path / "node", gpus=1, driver_files=FIXTURE_DRIVER)
    spec = tmp_path / "cdi" / "nri-gpu.json"
    argv = ["install", "--runtime", "podman", "--cdi-spec", str(spec), *node.flags()]
    argv += ["--hook-path", "/opt/nri-gpu/bin/nri-gpu", "--allow-untrusted-hook", "--no-unit"]
    assert main(argv) == 0, capsys.readouterr().err
    assert json.loads(spec.read_text())["kind"] == "nvidia.com/gpu"
    assert main(["uninstall", "--runtime", "podman", "--cdi-spec", str(spec), "--unit-dir", str(tmp_path / "u")]) == 0
    assert not spec.exists()


def test_nri_flags_are_refused_for_docker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, daemon = _paths(tmp_path)
    assert main(["install", "--runtime", "docker", "--config", str(daemon), "--fail-closed"]) == 2
    assert "for containerd and CRI-O" in capsys.readouterr().err
    assert not daemon.parent.exists()
