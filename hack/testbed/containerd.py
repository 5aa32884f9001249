"""A private containerd daemon with NRI enabled, for end-to-end tests.

Everything the daemon writes lives under one workdir: root, state, sockets (gRPC,
ttrpc, NRI), runc's state root, CNI/CDI/NRI plugin dirs and the log. Containers are put
under a cgroup parent private to this instance (``/nri-gpu-e2e/<tag>``). That makes
clean-up scoped: ``stop()`` removes pods through CRI, tasks through ctr, then stops the
daemon, then kills whatever is left by exact match (shims started with our socket, runc
containers in our runc root, processes in our cgroups), unmounts everything under the
workdir and removes the cgroups. It never touches another containerd's objects.

Fixed host paths containerd still shares with other instances: ``/run/containerd/s``
(shim sockets, named by a hash of our socket path, so no clash) and
``/run/containerd/fifo`` (ctr's stdio fifos, unique names).

``restart()`` keeps containers running, as a real daemon restart does; ``kill()``
SIGKILLs only the daemon (shims live on) for fault tests; ``stop()`` cleans everything.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
import tomllib
from pathlib import Path
from types import TracebackType

from . import containerd_config, hostops, runtimes
from .grpc_process import GrpcChannel, RpcFailure

__all__ = ["CGROUP_ROOT", "Containerd", "ContainerdError", "reap_stale"]

CGROUP_ROOT = "/nri-gpu-e2e"
_MARKER = ".nri-gpu-testbed.json"
_SOCKET_MAX = 100  # sun_path holds 108 bytes; keep a margin for the ".ttrpc" suffix
_SHIM_SOCKET_DIR = Path("/run/containerd/s")


class ContainerdError(RuntimeError):
    """containerd failed to start or to answer; the message carries the log's tail."""


class Containerd:
    """One private containerd. ``version`` is "1.7.24" or "2.1.9" (see runtimes.VERSIONS).

    Constructing it fetches the binaries (from the cache after the first time) and
    writes nothing; ``start()`` creates the workdir layout and the config.
    """

    def __init__(
        self,
        version: str,
        workdir: Path,
        *,
        log_level: str = "info",
        cgroup_parent: str | None = None,
        nri_request_timeout: str = "2s",
        nri_registration_timeout: str = "5s",
        nri_disable_connections: bool = False,
        nri: bool = True,
    ) -> None:
        self.version = version
        self.runtime = runtimes.fetch(version)
        self.workdir = Path(workdir).resolve()
        self.log_level = log_level
        tag = hashlib.sha256(str(self.workdir).encode()).hexdigest()[:12]
        self.cgroup_parent = cgroup_parent or f"{CGROUP_ROOT}/{tag}"
        self.nri_request_timeout = nri_request_timeout
        self.nri_registration_timeout = nri_registration_timeout
        self.nri_disable_connections = nri_disable_connections
        # False: a node as containerd 1.7 ships, NRI off (no NRI table), and config.toml
        # the node's own: written by the first prepare() only, then left to whoever edits
        # it (nri-gpu node-setup); start() waits for NRI only where that file turns it on.
        self.nri = nri
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None
        if len(str(self.address)) + len(".ttrpc") > _SOCKET_MAX:
            raise ValueError(f"workdir path too long for unix sockets: {self.workdir}")

    # ------------------------------------------------------------------ paths

    @property
    def address(self) -> Path:
        """The containerd gRPC socket (containerd API and CRI)."""
        return self.workdir / "containerd.sock"

    @property
    def nri_socket(self) -> Path:
        return self.workdir / "nri.sock"

    @property
    def log_path(self) -> Path:
        return self.workdir / "containerd.log"

    @property
    def config_path(self) -> Path:
        return self.workdir / "config.toml"

    @property
    def nri_plugin_dir(self) -> Path:
        """Pre-installed NRI plugins (``NN-name`` executables), launched at start."""
        return self.workdir / "nri" / "plugins"

    @property
    def nri_config_dir(self) -> Path:
        return self.workdir / "nri" / "conf.d"

    @property
    def cdi_dir(self) -> Path:
        return self.workdir / "cdi"

    @property
    def runc_root(self) -> Path:
        """runc's state root; the shim appends the namespace."""
        return self.workdir / "runc"

    @property
    def pid(self) -> int | None:
        """The daemon's PID while it runs (containerd is exec'd directly, so it is real)."""
        return self._pid if self.is_running else None

    @property
    def is_running(self) -> bool:
        if self._pid is None:
            return False
        if self._proc is not None:
            return self._proc.poll() is None
        return hostops.pid_alive(self._pid)

    # ------------------------------------------------------------------ config

    def config_text(self) -> str:
        """The config.toml this instance runs with (see containerd_config)."""
        return containerd_config.render(self)

    # ------------------------------------------------------------------ lifecycle

    def prepare(self) -> None:
        """Create the workdir layout and write config.toml (start() does it too). Call it
        first to put pre-installed NRI plugins or CDI specs in place before the start."""
        for sub in ("root", "state", "tmp", "opt", "runc", "cni/bin", "cni/net.d", "cdi"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        self.nri_plugin_dir.mkdir(parents=True, exist_ok=True)
        self.nri_config_dir.mkdir(parents=True, exist_ok=True)
        if self.nri or not self.config_path.exists():
            self.config_path.write_text(self.config_text())
        self._write_marker()

    def start(self, timeout: float = 30.0) -> None:
        """Start the daemon; return when CRI answers and the NRI socket exists.

        Raises ContainerdError (with the log's tail) if it exits or is not ready in time.
        """
        if self.is_running:
            raise ContainerdError(f"containerd {self.version} already running (pid {self._pid})")
        self.prepare()
        env = {
            # The shim and runc are found on PATH (containerd also looks next to itself).
            "PATH": f"{self.runtime.bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(self.workdir),
            "TMPDIR": str(self.workdir / "tmp"),
        }
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            # Exec'd directly (no shell), so Popen.pid is containerd's pid. Own session:
            # a ^C to pytest must not reach the daemon before our clean-up does.
            self._proc = subprocess.Popen(
                [str(self.runtime.containerd), "--config", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.workdir,
                start_new_session=True,
            )
        self._pid = self._proc.pid
        try:
            self._wait_ready(timeout)
        except BaseException:
            self._terminate(5.0)
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last_error = "no answer"
        # Short reconnect backoff: a channel created before the socket exists would
        # otherwise wait grpc's default 1 s before trying again.
        options = [
            ("grpc.initial_reconnect_backoff_ms", 10),
            ("grpc.min_reconnect_backoff_ms", 10),
            ("grpc.max_reconnect_backoff_ms", 50),
        ]
        channel = GrpcChannel(f"unix://{self.address}", options)
        try:
            # The CRI Version call needs no generated stubs: an empty request message
            # serialises to b"". It fails with "server is not initialized yet" until
            # CRI (and with it the NRI registration of k8s.io) is up.
            while time.monotonic() < deadline:
                if not self.is_running:
                    code = self._proc.returncode if self._proc else "?"
                    raise ContainerdError(f"containerd {self.version} exited ({code}) during start:\n{self.log_tail()}")
                try:
                    channel.call("/runtime.v1.RuntimeService/Version", b"", timeout=1.0)
                    if self.nri_socket.exists() or not self.nri_enabled():
                        return
                    last_error = f"NRI socket {self.nri_socket} missing"
                except RpcFailure as exc:
                    last_error = str(exc)
                time.sleep(0.02)
        finally:
            channel.close()
        raise ContainerdError(
            f"containerd {self.version} not ready after {timeout}s ({last_error}):\n{self.log_tail()}"
        )

    def nri_enabled(self) -> bool:
        """Whether config.toml turns NRI on (containerd 1.7: off unless ``disable = false``)."""
        table = tomllib.loads(self.config_path.read_text()).get("plugins", {}).get("io.containerd.nri.v1.nri", {})
        return table.get("disable", self.version.startswith("1.")) is False

    def stop(self, timeout: float = 10.0, clean: bool = True) -> None:
        """Stop the daemon. With ``clean`` (the default), first remove every pod and
        task, and afterwards make sure no shim, container, mount or cgroup of this
        instance is left. ``clean=False`` only stops the daemon; containers live on."""
        if clean and self.is_running:
            self._remove_workloads()
        self._terminate(timeout)
        if clean:
            self._sweep()

    def restart(self, timeout: float = 30.0) -> None:
        """Stop the daemon (keeping containers, as a real restart does) and start it."""
        self.stop(clean=False)
        self.start(timeout)

    def kill(self) -> None:
        """SIGKILL the daemon alone, for fault tests: shims and containers live on."""
        if self._pid is not None and self.is_running:
            os.kill(self._pid, signal.SIGKILL)
            self._reap(5.0)

    def __enter__(self) -> Containerd:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ helpers

    def ctr(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``ctr --address <ours> ARGS``; return stdout. Raises ContainerdError."""
        cmd = [str(self.runtime.ctr), "--address", str(self.address), *args]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise ContainerdError(f"{' '.join(cmd)} timed out after {timeout}s") from exc
        if proc.returncode != 0:
            raise ContainerdError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout

    def log_text(self, since_start: bool = False) -> str:
        """The daemon's log; with ``since_start`` only what the current run wrote."""
        try:
            with open(self.log_path, "rb") as fh:
                if since_start:
                    fh.seek(getattr(self, "_log_offset", 0))
                return fh.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def _write_marker(self) -> None:
        # Lets reap_stale() recognise this workdir after the test process died.
        owner = os.getpid()
        (self.workdir / _MARKER).write_text(
            json.dumps(
                {
                    "version": self.version,
                    "owner_pid": owner,
                    "owner_start": hostops.pid_start_time(owner),
                    "cgroup_parent": self.cgroup_parent,
                }
            )
        )

    def _terminate(self, timeout: float) -> None:
        if self._pid is None or not self.is_running:
            self._reap(0)
            return
        os.kill(self._pid, signal.SIGTERM)
        if not self._reap(timeout):
            os.kill(self._pid, signal.SIGKILL)
            self._reap(5.0)

    def _reap(self, timeout: float) -> bool:
        """Wait for the daemon to exit; True if it did."""
        if self._proc is not None:
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        return self._pid is None or hostops.wait_pid_gone(self._pid, timeout)

    def _remove_workloads(self) -> None:
        """The polite part of clean-up: CRI first (so NRI sees stop/remove events and
        CRI's own state stays consistent), then ctr for anything outside CRI."""
        try:
            from .cri import CriClient  # needs the generated stubs; fine if absent

            with CriClient(self.address, log_root=self.workdir / "pod-logs", timeout=20) as cri:
                cri.remove_all()
        except Exception:  # best effort: the ctr pass and the sweep below catch the rest
            pass
        try:
            namespaces = self.ctr("namespaces", "ls", "-q", timeout=10).split()
            for ns in namespaces:
                for task in self.ctr("-n", ns, "tasks", "ls", "-q", timeout=10).split():
                    self.ctr("-n", ns, "tasks", "rm", "-f", task, timeout=20)
                for container in self.ctr("-n", ns, "containers", "ls", "-q", timeout=10).split():
                    self.ctr("-n", ns, "containers", "rm", container, timeout=20)
        except ContainerdError:
            pass

    def _sweep(self) -> None:
        """After the daemon is gone: kill our shims and containers, unmount, rmdir cgroups."""
        address = str(self.address)
        shims = [
            pid
            for pid, argv in hostops.processes().items()
            if "containerd-shim" in argv[0]
            and "-address" in argv
            and argv[argv.index("-address") + 1 : argv.index("-address") + 2] == [address]
        ]
        hostops.kill_pids(shims)
        for pid in shims:
            hostops.wait_pid_gone(pid, 5.0)
        if self.runc_root.is_dir():
            for ns_dir in self.runc_root.iterdir():
                for cid_dir in ns_dir.iterdir() if ns_dir.is_dir() else []:
                    subprocess.run(
                        [str(self.runtime.runc), "--root", str(ns_dir), "delete", "--force", cid_dir.name],
                        capture_output=True,
                        timeout=30,
                    )
                    self._remove_shim_socket(ns_dir.name, cid_dir.name)
        hostops.remove_cgroup_tree(self.cgroup_parent)
        hostops.unmount_under(self.workdir)
        for root in hostops.cgroup_roots():  # the shared parent, if no other instance uses it
            try:
                (root / CGROUP_ROOT.strip("/")).rmdir()
            except OSError:
                pass

    def _remove_shim_socket(self, namespace: str, shim_id: str) -> None:
        # A SIGKILLed shim cannot remove its socket. The name is the sha256 of
        # "<grpc address>/<namespace>/<id>" in both 1.7 and 2.x (shim.SocketAddress).
        digest = hashlib.sha256(f"{self.address}/{namespace}/{shim_id}".encode()).hexdigest()
        (_SHIM_SOCKET_DIR / digest).unlink(missing_ok=True)

    @classmethod
    def _attach(cls, workdir: Path, pid: int | None) -> Containerd:
        """An instance for a workdir another (dead) test process left behind."""
        marker = json.loads((workdir / _MARKER).read_text())
        inst = cls(marker["version"], workdir, cgroup_parent=marker["cgroup_parent"])
        inst._pid = pid
        return inst


def reap_stale() -> list[Path]:
    """Clean up after test processes that died without stopping their containerd
    (SIGKILLed pytest, a crashed CI job): find daemons and shims whose workdir holds
    our marker and whose owner process is gone, and stop them with full clean-up.
    Returns the workdirs cleaned."""
    found: dict[Path, int | None] = {}
    for pid, argv in hostops.processes().items():
        workdir = None
        if argv and argv[0].endswith("/containerd") and "--config" in argv:
            workdir = Path(argv[argv.index("--config") + 1]).parent
        elif argv and "containerd-shim" in argv[0] and "-address" in argv:
            workdir = Path(argv[argv.index("-address") + 1]).parent
        if workdir is None or not (workdir / _MARKER).is_file():
            continue
        try:
            marker = json.loads((workdir / _MARKER).read_text())
        except (OSError, ValueError):
            continue
        if hostops.pid_alive(marker["owner_pid"], marker.get("owner_start")):
            continue
        is_daemon = argv[0].endswith("/containerd")
        found[workdir] = pid if is_daemon else found.get(workdir)
    for workdir, daemon_pid in found.items():
        inst = Containerd._attach(workdir, daemon_pid)
        inst.stop(clean=True)
    return sorted(found)
