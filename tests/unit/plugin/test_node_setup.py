"""``nri-gpu node-setup`` (the DaemonSet's init step) on a host root made here.

The decisions are pure (nri_gpu.plugin.cli.node_plan) and tested as a table. The rest runs for
real on a tree standing for the node's ``/``: links that lead out of it, sockets with
processes listening on them, a stand-in runtime daemon (a Python process whose name is
``containerd``) that exits on SIGHUP as containerd does, and the host's ``systemctl``
as a script of a static busybox in the tree, run chrooted. A real containerd 1.7 goes
through the same steps in tests/e2e/test_node_setup.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nri_gpu.plugin.cli.__main__ import main
from nri_gpu.plugin.cli.node_plan import (
    NodeSetupError,
    Options,
    RestartMode,
    default_restart_mode,
    leave_unwritten,
    restart_needed,
)
from nri_gpu.plugin.cli.node_root import NodeRoot, NodeRootError
from nri_gpu.plugin.cli.runtime_setup import backup_path, record_path

CONFIG_NRI_OFF = """\
version = 2
root = "/var/lib/containerd"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.8"
"""


def _options(**changes: object) -> Options:
    values: dict[str, object] = {
        "runtime": "containerd",
        "host_root": "/host",
        "config": "/etc/containerd/config.toml",
        "nri_socket": "/var/run/nri/nri.sock",
        "runtime_socket": "/run/containerd/containerd.sock",
        "restart_mode": RestartMode.SIGNAL,
        "timeout": 60.0,
    }
    values.update(changes)
    return Options(**values)  # type: ignore[arg-type]


# ------------------------------------------------------------------ decisions (pure)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"runtime": "docker"}, "--runtime 'docker'"),
        ({"config": "etc/containerd/config.toml"}, "--config 'etc/containerd/config.toml'"),
        ({"nri_socket": "/var/run/../nri.sock"}, "--socket '/var/run/../nri.sock'"),
        ({"host_root": "host"}, "--host-root 'host'"),
        ({"config": "/"}, "names no file"),
        ({"timeout": 0.0}, "--timeout 0.0"),
        ({"runtime": "crio", "config": "/etc/crio/crio.conf.d"}, "CRI-O reloads"),
        ({"fail_closed": True}, "--fail-closed needs --runtime-version"),
    ],
    ids=[
        "docker",
        "relative-config",
        "dotdot-socket",
        "relative-root",
        "root-as-config",
        "no-timeout",
        "crio-signal",
        "fail-closed-unknown-version",
    ],
)
def test_options_refused(changes: dict[str, object], says: str) -> None:
    with pytest.raises(NodeSetupError) as caught:
        _options(**changes).validate()
    assert says in str(caught.value)


def test_options_accepted() -> None:
    _options().validate()
    _options(runtime="crio", config="/etc/crio/crio.conf.d", restart_mode=RestartMode.SYSTEMD).validate()
    _options(fail_closed=True, runtime_version=(2, 2, 0)).validate()


@pytest.mark.parametrize(
    ("changed", "listening", "undo", "restart"),
    [
        (True, False, False, True),  # NRI was off: the usual first run
        (True, True, False, True),  # NRI on, but another socket or the validator changed
        (False, True, False, False),  # the second run: nothing to do
        (False, False, False, True),  # set up by an earlier run that never restarted
        (True, False, True, True),  # undo that changed the file
        (False, False, True, False),  # undo with nothing to undo
    ],
    ids=["first-run", "changed-while-on", "second-run", "earlier-run-stopped", "undo", "undo-nothing"],
)
def test_restart_needed(changed: bool, listening: bool, undo: bool, restart: bool) -> None:
    assert restart_needed(changed, listening, undo) is restart


@pytest.mark.parametrize(
    ("exists", "listening", "changes", "leave"),
    [
        (False, True, {}, True),  # containerd 2.x without a config file: NRI on already
        (False, False, {}, False),  # containerd 1.7 without a config file: NRI off, create one
        (True, True, {}, False),  # a file is there: install decides, key by key
        (False, True, {"fail_closed": True, "runtime_version": (2, 2, 0)}, False),  # the validator needs keys
        (False, True, {"undo": True}, False),  # undo reads its record, whatever serves NRI
    ],
    ids=["served-no-file", "off-no-file", "file-there", "fail-closed", "undo"],
)
def test_leave_unwritten(exists: bool, listening: bool, changes: dict[str, object], leave: bool) -> None:
    assert leave_unwritten(exists, listening, _options(**changes)) is leave


def test_default_restart_modes_are_the_operators() -> None:
    assert default_restart_mode("containerd") is RestartMode.SIGNAL
    assert default_restart_mode("crio") is RestartMode.SYSTEMD


# ------------------------------------------------------------------ the host root


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A node's / with containerd's config (NRI off by default: 1.7) in /etc/containerd."""
    root = tmp_path / "host"
    (root / "etc/containerd").mkdir(parents=True)
    (root / "etc/containerd/config.toml").write_text(CONFIG_NRI_OFF)
    (root / "run/containerd").mkdir(parents=True)
    (root / "var/run/nri").mkdir(parents=True)
    return root


def test_links_resolve_inside_the_host_root(host: Path, tmp_path: Path) -> None:
    """An absolute link and a climb of '..' both stay under the host root: the
    outside file of the same name is never what is found."""
    (tmp_path / "etc/containerd").mkdir(parents=True)
    (tmp_path / "etc/containerd/outside").write_text("outside")
    (host / "etc/containerd/inside").write_text("inside")
    (host / "abs").symlink_to("/etc/containerd")
    (host / "up").symlink_to("../../../../../../../etc/containerd")
    with NodeRoot(str(host)) as root:
        for via in ("/abs", "/up"):
            fd = root.open_folder(via)
            try:
                assert sorted(os.listdir(f"/proc/self/fd/{fd}")) == ["config.toml", "inside"], via
            finally:
                os.close(fd)
        with pytest.raises(NodeRootError, match=r"/nowhere .*no such folder"):
            root.open_folder("/nowhere")
        with pytest.raises(NodeRootError, match=r"/etc/containerd/config.toml .*Not a directory"):
            root.open_folder("/etc/containerd/config.toml")


def _listen(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    return server


def test_connect_reaches_the_socket_in_the_root_and_refuses_a_file(host: Path) -> None:
    server = _listen(host / "run/containerd/containerd.sock")
    (host / "run/link.sock").symlink_to("/run/containerd/containerd.sock")
    (host / "run/file").write_text("")
    with server, NodeRoot(str(host)) as root:
        with root.connect("/run/link.sock", 1.0) as client:
            assert client.getpeername()  # connected: the listener in the root
        with pytest.raises(NodeRootError, match=r"/run/file .*is not a socket"):
            root.connect("/run/file", 1.0)
        with pytest.raises(FileNotFoundError):
            root.connect("/run/missing.sock", 1.0)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
@pytest.mark.parametrize(
    ("spoil", "says"),
    [
        (lambda bin_, exe: os.chown(exe, 1000, 0), "/usr/bin/systemctl (under {}) is owned by uid 1000"),
        (lambda bin_, exe: os.chmod(exe, 0o775), "/usr/bin/systemctl (under {}) is writable by group or others"),
        (lambda bin_, exe: os.chmod(bin_, 0o777), "/usr/bin (under {}) is writable by group or others"),
        (lambda bin_, exe: os.chown(bin_, 1000, 0), "/usr/bin (under {}) is owned by uid 1000"),
        (lambda bin_, exe: (exe.unlink(), exe.symlink_to("/bin/sh")), "/usr/bin/systemctl (under {}) is a symbolic"),
        (lambda bin_, exe: os.chmod(exe, 0o644), "is not an executable regular file"),
    ],
    ids=[
        "binary-not-roots",
        "binary-group-writable",
        "folder-world-writable",
        "folder-not-roots",
        "link",
        "not-executable",
    ],
)
def test_a_host_binary_anyone_but_root_can_change_is_refused(host: Path, spoil: object, says: str) -> None:
    exe = host / "usr/bin/systemctl"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    for folder in (host, host / "usr", host / "usr/bin"):
        folder.chmod(0o755)
    with NodeRoot(str(host)) as root:
        assert root.check_root_only("/usr/bin/systemctl").st_uid == 0
        spoil(exe.parent, exe)  # type: ignore[operator]
        with pytest.raises(NodeRootError) as caught:
            root.check_root_only("/usr/bin/systemctl")
    assert says.format(host) in str(caught.value)


# ------------------------------------------------------------------ the whole step


_DAEMON = """
import os, socket, sys, time
# The stand-in runtime: listens on its API socket and, once its config turns NRI on
# (what containerd reads at start), on the NRI socket. SIGHUP: the default, exit.
api, nri, config = sys.argv[1:4]
for path in (api, nri):
    if os.path.lexists(path):
        os.unlink(path)
servers = [socket.socket(socket.AF_UNIX)]
servers[0].bind(api); servers[0].listen(8)
if "disable = false" in open(config).read():
    servers.append(socket.socket(socket.AF_UNIX)); servers[-1].bind(nri); servers[-1].listen(8)
print("ready", flush=True)
while True:
    time.sleep(1)
"""


class StandIn:
    """A process named ``containerd`` serving the host root's sockets as the config says."""

    def __init__(self, host: Path, tmp: Path) -> None:
        self.host = host
        self.exe = tmp / "containerd"  # /proc/<pid>/comm is the name it was run by
        if not self.exe.exists():
            self.exe.symlink_to(sys.executable)
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> int:
        argv = [
            str(self.exe),
            "-c",
            _DAEMON,
            str(self.host / "run/containerd/containerd.sock"),
            str(self.host / "var/run/nri/nri.sock"),
            str(self.host / "etc/containerd/config.toml"),
        ]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n"
        return self.proc.pid

    def supervise(self, restarts: int = 1) -> threading.Thread:
        """Play the service manager: start the daemon again each time it exits."""

        def loop() -> None:
            for _ in range(restarts):
                assert self.proc is not None
                self.proc.wait(30)
                self.start()

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def stand_in(host: Path, tmp_path: Path) -> Iterator[StandIn]:
    daemon = StandIn(host, tmp_path)
    yield daemon
    daemon.stop()


def _node_setup(host: Path, *flags: str) -> int:
    return main(["node-setup", "--runtime", "containerd", "--host-root", str(host), "--timeout", "10", *flags])


def test_signal_mode_turns_nri_on_restarts_once_and_a_second_run_changes_nothing(
    host: Path, stand_in: StandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    config = host / "etc/containerd/config.toml"
    first = stand_in.start()
    assert not (host / "var/run/nri/nri.sock").exists()
    supervisor = stand_in.supervise()
    assert _node_setup(host, "--restart-mode", "signal") == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"SIGHUP to containerd (pid {first})" in out
    supervisor.join(10)
    assert stand_in.proc is not None and stand_in.proc.pid != first
    second = stand_in.proc.pid
    assert f"NRI is served (pid {second})" in out
    assert "disable = false" in config.read_text()
    assert backup_path(config).read_text() == CONFIG_NRI_OFF and record_path(config).is_file()

    written = config.read_bytes()
    assert _node_setup(host, "--restart-mode", "signal") == 0
    out = capsys.readouterr().out
    assert "SIGHUP" not in out and f"NRI is served (pid {second}); no restart" in out
    assert config.read_bytes() == written and stand_in.proc.poll() is None and stand_in.proc.pid == second

    # Undo, the documented way on removal: the original bytes back, and a restart.
    supervisor = stand_in.supervise()
    assert _node_setup(host, "--restart-mode", "signal", "--undo") == 0
    assert f"SIGHUP to containerd (pid {second})" in capsys.readouterr().out
    assert config.read_text() == CONFIG_NRI_OFF and not record_path(config).exists()
    supervisor.join(10)


def test_signal_mode_signals_only_roots_runtime(host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The API socket's peer is not named containerd: it is not signalled, and it lives on."""
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _DAEMON,
            str(host / "run/containerd/containerd.sock"),
            str(host / "var/run/nri/nri.sock"),
            str(host / "etc/containerd/config.toml"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout is not None and other.stdout.readline() == "ready\n"
        assert _node_setup(host, "--restart-mode", "signal") == 1
        err = capsys.readouterr().err
        assert f"its peer, pid {other.pid}, is " in err and "not root's 'containerd'; not signalling it" in err
        time.sleep(0.2)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait(10)


def test_a_peer_whose_name_is_not_text_is_refused_not_a_crash(host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A process picks its own name (prctl PR_SET_NAME), any bytes: one that is not
    UTF-8 is still a name that is not containerd's, refused with the usual message."""
    rename = "import ctypes; ctypes.CDLL(None).prctl(15, b'\\xffcontainerd', 0, 0, 0)\n"
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            rename + _DAEMON,
            str(host / "run/containerd/containerd.sock"),
            str(host / "var/run/nri/nri.sock"),
            str(host / "etc/containerd/config.toml"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout is not None and other.stdout.readline() == "ready\n"
        assert _node_setup(host, "--restart-mode", "signal") == 1
        err = capsys.readouterr().err
        assert f"its peer, pid {other.pid}, is '\\\\xffcontainerd' of uid" in err and "not signalling it" in err
        assert other.poll() is None
    finally:
        other.kill()
        other.wait(10)


def test_mode_none_waits_for_someone_to_restart_the_runtime(
    host: Path, stand_in: StandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    stand_in.start()

    def restart_when_the_config_changes() -> None:
        config = host / "etc/containerd/config.toml"
        deadline = time.monotonic() + 10
        while "disable = false" not in config.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        stand_in.stop()
        stand_in.start()

    person = threading.Thread(target=restart_when_the_config_changes, daemon=True)
    person.start()
    assert _node_setup(host, "--restart-mode", "none") == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "restart mode none: restart the runtime yourself (systemctl restart containerd)" in out
    person.join(10)


def test_a_node_serving_nri_without_a_config_file_is_left_alone(host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """containerd 2.x with no config.toml: NRI is on by default, so no file is created
    and nothing is restarted (nothing listens on the API socket: a signal would fail)."""
    (host / "etc/containerd/config.toml").unlink()
    with _listen(host / "var/run/nri/nri.sock"):
        assert _node_setup(host, "--restart-mode", "signal") == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"NRI is served (pid {os.getpid()}) and there is no /etc/containerd/config.toml: nothing to change" in out
    assert list((host / "etc/containerd").iterdir()) == []


def test_nri_that_never_comes_is_a_bounded_wait_with_the_reason(host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    assert _node_setup(host, "--restart-mode", "none", "--timeout", "0.5") == 1
    assert time.monotonic() - started < 5
    err = capsys.readouterr().err
    assert "/var/run/nri/nri.sock: no NRI after 0.5s (nothing there)" in err


def test_a_config_folder_that_leads_out_of_the_host_root_is_not_written_outside(
    host: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """/etc/containerd a link to an absolute path: resolved inside the host root,
    which has no such folder; the same path outside the root is left alone."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.toml").write_text(CONFIG_NRI_OFF)
    shutil.rmtree(host / "etc/containerd")
    (host / "etc/containerd").symlink_to(outside)
    assert _node_setup(host, "--restart-mode", "none", "--timeout", "0.2") == 1
    assert f"/etc/containerd (under {host}): no such folder" in capsys.readouterr().err
    assert (outside / "config.toml").read_text() == CONFIG_NRI_OFF
    assert sorted(p.name for p in outside.iterdir()) == ["config.toml"]


def test_an_oversized_host_config_is_refused_and_left_alone(host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = host / "etc/containerd/config.toml"
    with open(config, "wb") as planted:
        planted.truncate((16 << 20) + 1)
    assert _node_setup(host, "--restart-mode", "none", "--timeout", "0.2") == 1
    assert "config.toml is over 16777216 bytes" in capsys.readouterr().err
    assert config.stat().st_size == (16 << 20) + 1 and sorted(p.name for p in config.parent.iterdir()) == [config.name]


def _busybox() -> Path:
    from testbed import debs, images

    try:
        return images._busybox_binary()
    except debs.DebUnavailable as exc:
        pytest.skip(f"no static busybox to stand for the host's systemctl: {exc}")
        raise


@pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root")
def test_systemd_mode_runs_the_hosts_systemctl_chrooted(
    host: Path, stand_in: StandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    """No systemd here: the host's systemctl is a busybox script that records its
    arguments; that it ran inside the host root shows in where the record lands."""
    bin_dir = host / "usr/bin"
    bin_dir.mkdir(parents=True)
    shutil.copy2(_busybox(), bin_dir / "busybox")
    (bin_dir / "systemctl").write_text('#!/usr/bin/busybox sh\necho "$@" > /systemctl-ran\n')
    (bin_dir / "systemctl").chmod(0o755)
    for folder in (host, host / "usr", bin_dir):
        folder.chmod(0o755)
    stand_in.start()

    def systemd() -> None:  # what systemctl restart does, once the call is recorded
        deadline = time.monotonic() + 10
        while not (host / "systemctl-ran").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        stand_in.stop()
        stand_in.start()

    manager = threading.Thread(target=systemd, daemon=True)
    manager.start()
    assert _node_setup(host, "--restart-mode", "systemd") == 0, capsys.readouterr().err
    assert (host / "systemctl-ran").read_text() == "restart containerd\n"
    assert "running /usr/bin/systemctl restart containerd on the host" in capsys.readouterr().out
    manager.join(10)

    # Made writable by others, it is not run (and nothing is restarted).
    (host / "systemctl-ran").unlink()
    (host / "etc/containerd/config.toml").write_text(CONFIG_NRI_OFF)
    (host / "etc/containerd/config.toml.nri-gpu.json").unlink()
    (bin_dir / "systemctl").chmod(0o777)
    assert _node_setup(host, "--restart-mode", "systemd") == 1
    assert "no systemctl that only root can change" in capsys.readouterr().err
    assert not (host / "systemctl-ran").exists()
