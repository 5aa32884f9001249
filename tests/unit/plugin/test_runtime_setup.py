"""``nri-gpu install`` / ``uninstall`` of containerd's config and CRI-O's drop-in.

Here the edits on hand-written configs, refusals and hostile files beside the config;
on the configs the real containerd binaries write, loaded back by containerd itself
(``containerd --config F config dump``): tests/integration/test_runtime_setup_containerd.py.
CRI-O has no package for this host (bookworm), so its drop-in is checked as TOML text.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import tomlkit

from nri_gpu.plugin.cli import install as setup_cli
from nri_gpu.plugin.cli.__main__ import main
from nri_gpu.plugin.cli.runtime_setup import (
    CRIO_DROPIN_NAME,
    NRI_TABLE,
    backup_path,
    containerd_changes,
    containerd_enable,
    containerd_revert,
    crio_dropin,
    crio_dropin_is_ours,
    record_path,
)

NRI = f'[plugins."{NRI_TABLE}"]'


def cli(*args: str) -> int:
    return main(list(args), environ={})


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


HAND_WRITTEN = """\
# containerd config for gpu-node-7 -- managed by hand, see the runbook
version = 2

root = "/var/lib/containerd"   # on the NVMe disk
state = "/run/containerd"

[grpc]
  # the default socket
  address = "/run/containerd/containerd.sock"

[plugins]
  # CRI: keep the sandbox image pinned
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.9"  # pinned

    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"   # not nvidia: NRI does that

  # NRI was off here
  [plugins."io.containerd.nri.v1.nri"]
    disable = true   # flipped by install
    plugin_path = "/opt/nri/plugins"

# metrics for the node exporter
[metrics]
  address = "127.0.0.1:1338"
"""


# ------------------------------------------------------------------ containerd's config
# (the edits checked against a real containerd binary: tests/integration/test_runtime_setup_containerd.py)


def test_operator_changed_one_of_our_keys_is_left_alone() -> None:
    changes = containerd_changes(HAND_WRITTEN, "/run/nri/gpu.sock")
    enabled = containerd_enable(HAND_WRITTEN, changes)
    edited = enabled.replace('socket_path = "/run/nri/gpu.sock"', 'socket_path = "/run/nri/other.sock"')
    reverted, warnings = containerd_revert(edited, changes)
    assert 'socket_path = "/run/nri/other.sock"' in reverted
    assert "    disable = true   # flipped by install" in reverted
    assert len(warnings) == 1 and "socket_path" in warnings[0] and NRI in warnings[0]


def test_legacy_config_without_version_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[plugins.cri]\n  sandbox_image = "pause"\n')
    before = files(tmp_path)
    assert cli("install", "--runtime", "containerd", "--config", str(config)) == 1
    err = capsys.readouterr().err
    assert str(config) in err and "'version'" in err and "legacy" in err
    assert files(tmp_path) == before


def test_invalid_toml_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    config.write_text("version = 2\n[plugins\n")
    assert cli("install", "--runtime", "containerd", "--config", str(config)) == 1
    assert "not valid TOML" in capsys.readouterr().err


def test_uninstall_without_install_does_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    config.write_text(HAND_WRITTEN)
    assert cli("uninstall", "--runtime", "containerd", "--config", str(config)) == 0
    assert "nothing to undo" in capsys.readouterr().out
    assert config.read_text() == HAND_WRITTEN


# ------------------------------------------------------------------ restart and usage


def test_restart_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[list[str]] = []

    def fake_run(cmd: list[str], check: bool) -> subprocess.CompletedProcess[str]:
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(setup_cli.subprocess, "run", fake_run)
    config = tmp_path / "config.toml"
    assert cli("install", "--runtime", "containerd", "--config", str(config)) == 0
    assert ran == []
    assert cli("uninstall", "--runtime", "containerd", "--config", str(config), "--restart") == 0
    assert ran == [["systemctl", "restart", "containerd"]]
    assert cli("install", "--runtime", "crio", "--config", str(tmp_path), "--restart", "--dry-run") == 0
    assert cli("install", "--runtime", "crio", "--config", str(tmp_path), "--restart") == 0
    assert ran[1:] == [["systemctl", "restart", "crio"]]


@pytest.mark.parametrize(
    "args",
    [
        ["install"],
        ["install", "--runtime", "nerdctl"],
        ["uninstall", "--runtime", "crio", "--socket", "/x"],
        ["config"],
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli(*args)
    assert exc.value.code == 2


# ------------------------------------------------------------------ CRI-O drop-in (as text)


def test_crio_dropin_create_and_remove(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("install", "--runtime", "crio", "--config", str(tmp_path), "--socket", "/run/nri/crio.sock") == 0
    dropin = tmp_path / CRIO_DROPIN_NAME
    parsed = tomlkit.parse(dropin.read_text()).unwrap()
    assert parsed == {"crio": {"nri": {"enable_nri": True, "nri_listen": "/run/nri/crio.sock"}}}
    assert "systemctl restart crio" in capsys.readouterr().out
    assert cli("install", "--runtime", "crio", "--config", str(tmp_path), "--socket", "/run/nri/crio.sock") == 0
    assert "already set up" in capsys.readouterr().out
    assert cli("uninstall", "--runtime", "crio", "--config", str(tmp_path)) == 0
    assert list(tmp_path.iterdir()) == []


def test_crio_dropin_without_socket() -> None:
    assert tomlkit.parse(crio_dropin(None)).unwrap() == {"crio": {"nri": {"enable_nri": True}}}
    assert crio_dropin_is_ours(crio_dropin(None)) and crio_dropin_is_ours(crio_dropin("/a b/'x\".sock"))


def test_crio_changed_dropin_is_left_in_place(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("install", "--runtime", "crio", "--config", str(tmp_path)) == 0
    dropin = tmp_path / CRIO_DROPIN_NAME
    dropin.write_text(dropin.read_text() + "nri_plugin_dir = '/srv/nri'\n")
    capsys.readouterr()
    assert cli("uninstall", "--runtime", "crio", "--config", str(tmp_path)) == 1
    assert str(dropin) in capsys.readouterr().err
    assert dropin.exists()
    # and install does not overwrite someone else's file of that name either
    assert cli("install", "--runtime", "crio", "--config", str(tmp_path)) == 1
    assert "nri_plugin_dir" in dropin.read_text()


def test_crio_dry_run_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("install", "--runtime", "crio", "--config", str(tmp_path), "--dry-run") == 0
    assert "+enable_nri = true" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_record_is_removed_with_the_backup(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(HAND_WRITTEN)
    assert cli("install", "--runtime", "containerd", "--config", str(config)) == 0
    assert record_path(config).exists() and backup_path(config).exists()
    assert cli("uninstall", "--runtime", "containerd", "--config", str(config)) == 0
    assert not record_path(config).exists() and not backup_path(config).exists()


def test_table_we_appended_is_removed_on_revert_after_an_operator_edit() -> None:
    original = 'version = 2\n[plugins]\n  [plugins."io.containerd.grpc.v1.cri"]\n    sandbox_image = "x" # pinned\n'
    changes = containerd_changes(original, "/run/nri/gpu.sock")
    enabled = containerd_enable(original, changes) + "[metrics]\n  address = 'y'\n"
    reverted, warnings = containerd_revert(enabled, changes)
    assert warnings == []
    assert NRI_TABLE not in reverted
    assert reverted.startswith(original) and reverted.endswith("[metrics]\n  address = 'y'\n")


@pytest.mark.parametrize("name", ["cri", "io.containerd.grpc.v1.cri"])
def test_a_config_with_cri_disabled_is_refused_and_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    # What Docker's containerd.io package ships: NRI would see no container at all.
    config = tmp_path / "config.toml"
    original = f'version = 2\ndisabled_plugins = ["{name}"]\n'
    config.write_text(original)
    assert main(["install", "--runtime", "containerd", "--config", str(config)], {}) == 1
    err = capsys.readouterr().err
    assert f"disabled_plugins contains '{name}'" in err and str(config) in err
    assert config.read_text() == original
    assert not list(tmp_path.glob("config.toml.nri-gpu*"))


# ------------------------------------------------------------------ hostile files beside the config


def test_a_symlinked_config_is_refused_and_stays_a_link(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # install used to replace the link with a regular file: the real file, which
    # the operator edits, no longer was the runtime's config.
    real = tmp_path / "real.toml"
    real.write_text(HAND_WRITTEN)
    config = tmp_path / "config.toml"
    config.symlink_to(real)
    assert cli("install", "--runtime", "containerd", "--config", str(config)) == 1
    err = capsys.readouterr().err
    assert f"{config} is a symbolic link (to {real})" in err and "point --config at the real file" in err
    assert config.is_symlink() and real.read_text() == HAND_WRITTEN
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml", "real.toml"]


@pytest.mark.parametrize("which", ["backup", "record"])
def test_a_backup_or_record_swapped_for_a_link_is_not_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str
) -> None:
    # Whoever can write the folder points the backup at a file only root may read;
    # uninstall would have copied it into the (world-readable) config.
    config = tmp_path / "config.toml"
    config.write_text(HAND_WRITTEN)
    assert cli("install", "--runtime", "containerd", "--config", str(config)) == 0
    installed = config.read_bytes()
    secret = tmp_path / "secret"
    secret.write_text('version = 2\n# root only\n{"created": true, "changes": [], "written_sha256": ""}\n')
    secret.chmod(0o600)
    planted = backup_path(config) if which == "backup" else record_path(config)
    planted.unlink()
    planted.symlink_to(secret)
    capsys.readouterr()
    assert cli("uninstall", "--runtime", "containerd", "--config", str(config)) == 1
    err = capsys.readouterr().err
    assert f"{planted} is a symbolic link" in err and "Traceback" not in err
    assert config.read_bytes() == installed and planted.is_symlink()


def test_a_backup_swapped_for_a_fifo_does_not_hang_uninstall(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(HAND_WRITTEN)
    assert cli("install", "--runtime", "containerd", "--config", str(config)) == 0
    backup_path(config).unlink()
    os.mkfifo(backup_path(config))
    argv = [sys.executable, "-m", "nri_gpu.plugin.cli", "uninstall", "--runtime", "containerd", "--config", str(config)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    assert done.returncode == 1
    assert f"{backup_path(config)} is not a regular file" in done.stderr


def test_a_temporary_file_swapped_for_a_link_never_changes_the_links_target(tmp_path: Path) -> None:
    # uid 1000 may write the config's folder (a mistake, but one that must not give
    # them more): it swaps every temporary file of ours for a link to a file only
    # root may read. Root's chmod and chown by name used to follow that link.
    folder = Path(tempfile.mkdtemp(prefix="nri-gpu-etc-"))  # pytest's tmp_path is root's alone
    config = folder / "config.toml"
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    os.chown(folder, 1000, 1000)
    attacker = os.fork()
    if attacker == 0:  # the user, swapping as fast as it can, for 30 s at most
        try:
            os.setgid(1000)
            os.setuid(1000)
            end = time.monotonic() + 30
            while time.monotonic() < end:
                for name in os.listdir(folder):
                    if name.startswith(".config.toml."):
                        try:
                            os.unlink(folder / name)
                            os.symlink(secret, folder / name)
                        except OSError:
                            pass
        finally:
            os._exit(0)
    codes: list[int] = []
    try:
        # At least 40 installs, and on until the attacker has won a race at least once
        # (on a loaded machine it may lose many in a row), for 25 s at most.
        give_up = time.monotonic() + 25
        while len(codes) < 40 or (1 not in codes and time.monotonic() < give_up):
            for leftover in folder.iterdir():
                leftover.unlink(missing_ok=True)  # the attacker may be quicker
            config.write_text(HAND_WRITTEN)
            config.chmod(0o644)
            # 1 when the swap is seen, 0 when the attacker was too slow
            codes.append(cli("install", "--runtime", "containerd", "--config", str(config)))
            assert secret.stat().st_mode & 0o777 == 0o600 and secret.read_text() == "root only\n"
    finally:
        os.kill(attacker, signal.SIGKILL)
        os.waitpid(attacker, 0)
        shutil.rmtree(folder)
    assert set(codes) <= {0, 1} and 1 in codes, codes  # the attacker did get in, and was seen


def test_a_second_install_into_a_file_we_created_still_removes_it(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--socket", "/run/nri/a.sock") == 0
    assert cli("install", "--runtime", "containerd", "--config", str(config), "--socket", "/run/nri/b.sock") == 0
    assert 'socket_path = "/run/nri/b.sock"' in config.read_text()
    assert cli("uninstall", "--runtime", "containerd", "--config", str(config)) == 0
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "record",
    [
        b"[]",
        b'{"changes": [1]}',
        b'{"changes": [{"key": "disable"}]}',
        b'{"changes": [{"key": "disable", "old": null, "new": false, "extra": 1}]}',
        b'{"changes": [{"key": "plugin_path", "old": null, "new": "/x"}]}',
        b'{"created": "yes", "changes": []}',
        b"[" * 100_000,
        b"\xff\xfe",
    ],
    ids=["list", "change-not-object", "change-short", "change-extra", "foreign-key", "created-str", "deep", "binary"],
)
@pytest.mark.parametrize("command", ["install", "uninstall"])
def test_a_malformed_record_is_a_clean_refusal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], record: bytes, command: str
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(HAND_WRITTEN)
    assert cli("install", "--runtime", "containerd", "--config", str(config)) == 0
    installed = files(tmp_path)
    record_path(config).write_bytes(record)
    capsys.readouterr()
    assert cli(command, "--runtime", "containerd", "--config", str(config)) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"nri-gpu: refused: {record_path(config)}: ") and "remove it by hand" in err
    assert len(err) < 1000
    assert {k: v for k, v in files(tmp_path).items() if k != record_path(config).name} == {
        k: v for k, v in installed.items() if k != record_path(config).name
    }


@pytest.mark.skipif(os.geteuid() != 0, reason="gives the config to another user: needs root")
def test_install_and_uninstall_keep_the_configs_mode_and_owner(tmp_path: Path) -> None:
    # The new file is written as a temporary of ours: it gets the old one's mode
    # and owner through its descriptor, the backup too, and uninstall's restore as well.
    config = tmp_path / "config.toml"
    config.write_text(HAND_WRITTEN)
    config.chmod(0o640)
    os.chown(config, 1000, 1001)

    def mode_and_owner(path: Path) -> tuple[int, int, int]:
        info = path.stat()
        return info.st_mode & 0o7777, info.st_uid, info.st_gid

    assert cli("install", "--runtime", "containerd", "--config", str(config)) == 0
    assert mode_and_owner(config) == mode_and_owner(backup_path(config)) == (0o640, 1000, 1001)
    assert mode_and_owner(record_path(config))[0] == 0o644
    assert cli("uninstall", "--runtime", "containerd", "--config", str(config)) == 0
    assert mode_and_owner(config) == (0o640, 1000, 1001) and config.read_text() == HAND_WRITTEN
