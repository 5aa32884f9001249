"""Docker 28.5.2 (Debian sid) and 26.1.5 (trixie) for the end-to-end tests, private to
one workdir.

Nothing is installed: ``docker.io`` (dockerd) and ``docker-cli`` are unpacked into the
cache (hack/testbed/debs.py) and run as they are (Go, glibc >= 2.34 and libsystemd,
which a bookworm host has). dockerd runs against a private containerd of the test bed
(hack/testbed/containerd.py, 2.1.9 with runc 1.1.5, whose ``bin/`` goes first on
dockerd's PATH too), so the test bed's clean-up of that containerd (shims, runc state,
mounts, its cgroup tree) also covers Docker's containers. Everything else is under
``workdir``, from a ``daemon.json`` passed with ``--config-file``:

* ``data-root``, ``exec-root``, ``pidfile`` and the API socket (``hosts``);
* ``"iptables": false``, ``"ip6tables": false``, ``"ip-forward": false``,
  ``"bridge": "none"``: no network set-up at all (containers run ``--network none``);
* ``native.cgroupdriver=cgroupfs`` and ``cgroup-parent`` under the containerd's own
  cgroup tree (the test bed removes it);
* ``default-ulimits`` within this process's hard limits (Docker's defaults exceed them);
* ``cdi-spec-dirs``: a private spec folder, so nothing is written to ``/etc/cdi`` or
  ``/var/run/cdi``; and, below 28.2 only, ``"features": {"cdi": true}``: 25.0 to 28.1
  need the key, 28.2 and later have CDI on by default (``features`` overrides both).

What dockerd still does outside ``workdir``: it makes ``/run/docker/plugins`` (the
plugin-socket folder, whatever the exec-root), removed again when it was not there
before; the containerd's shims put their sockets in ``/run/containerd/s`` as ever.
A dockerd whose test process died is stopped by ``reap_stale`` (run at ``start``;
its containerd is the containerd module's). The CLI gets its own ``DOCKER_CONFIG`` and
``DOCKER_HOST``. Docker's classic image store
cannot ``docker load`` an OCI layout archive, so ``load`` ``docker import``s the image's
one layer with its ``Env``, ``Cmd``, ``WorkingDir`` and ``User``.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import tarfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import debs, hostops
from .containerd import Containerd
from .images import Image

__all__ = ["VERSION", "VERSIONS", "Binaries", "Docker", "DockerError", "fetch", "reap_stale"]

# Docker version -> (suite, Debian version glob) of docker.io and docker-cli; see
# runtimes.py for why globs.
_DEBS = {
    "28.5.2": ("sid", "28.5.2+dfsg*"),
    "26.1.5": ("trixie", "26.1.5+dfsg*"),
}
VERSIONS: tuple[str, ...] = tuple(_DEBS)
VERSION = VERSIONS[0]
_CDI_DEFAULT_FROM = (28, 2)  # CDI on without "features": {"cdi": true}
_CONTAINERD = "2.1.9"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SOCKET_MAX = 100  # sun_path holds 108 bytes
_MARKER = ".nri-gpu-docker.json"
# dockerd makes this plugin-socket folder whatever its exec-root; removed again if we made it.
_PLUGIN_SOCKETS = Path("/run/docker/plugins")


class DockerError(RuntimeError):
    """dockerd failed to start or a docker command failed; the message carries the output."""


@dataclass(frozen=True)
class Binaries:
    """Where the unpacked dockerd and docker CLI live."""

    dockerd: Path
    docker: Path


def fetch(version: str = VERSION) -> Binaries:
    """Unpack docker.io and docker-cli ``version`` (one of VERSIONS; downloaded on first use).

    Raises KeyError for an unknown version, debs.DebUnavailable offline with nothing
    cached, debs.DebError otherwise.
    """
    suite, deb_version = _DEBS[version]
    roots = {pkg: debs.extract(pkg, suite, deb_version) for pkg in ("docker.io", "docker-cli")}
    found = Binaries(dockerd=roots["docker.io"] / "usr/sbin/dockerd", docker=roots["docker-cli"] / "usr/bin/docker")
    for path in (found.dockerd, found.docker):
        if not path.is_file():
            raise debs.DebError(f"unpacked docker packages lack {path}")
    return found


def _ulimits() -> dict[str, dict[str, object]]:
    """``default-ulimits`` within this process's hard limits."""
    limits: dict[str, dict[str, object]] = {}
    for name, which, want in (("nofile", resource.RLIMIT_NOFILE, 4096), ("nproc", resource.RLIMIT_NPROC, 4096)):
        hard = resource.getrlimit(which)[1]
        value = want if hard == resource.RLIM_INFINITY else min(want, hard)
        limits[name] = {"Name": name, "Soft": value, "Hard": value}
    return limits


class Docker:
    """A private dockerd over a private containerd, both under ``workdir``.

    Constructing it fetches the binaries and writes nothing; ``start()`` starts both.
    ``features`` is daemon.json's key; None: ``{"cdi": true}`` below 28.2, else none.
    """

    def __init__(self, workdir: Path, version: str = VERSION, *, features: dict[str, bool] | None = None) -> None:
        self.workdir = Path(workdir).resolve()
        self.bin = fetch(version)
        self.version = version
        if features is None:
            cdi_default = tuple(int(n) for n in version.split(".")[:2]) >= _CDI_DEFAULT_FROM
            features = {} if cdi_default else {"cdi": True}
        self.features = features
        self.containerd = Containerd(_CONTAINERD, self.workdir / "containerd")
        self.cdi_dir = self.workdir / "cdi"
        self.socket = self.workdir / "docker.sock"
        self.config = self.workdir / "daemon.json"
        self.log_path = self.workdir / "dockerd.log"
        if len(str(self.socket)) > _SOCKET_MAX:
            raise ValueError(f"workdir path too long for unix sockets: {self.workdir}")
        self._proc: subprocess.Popen[bytes] | None = None
        self._made_run_docker = False

    def daemon_config(self) -> dict[str, object]:
        w = self.workdir
        return {
            "data-root": str(w / "root"),
            "exec-root": str(w / "exec"),
            "pidfile": str(w / "docker.pid"),
            "hosts": [f"unix://{self.socket}"],
            "containerd": str(self.containerd.address),
            "containerd-namespace": "moby",
            "containerd-plugins-namespace": "plugins.moby",
            "storage-driver": "overlay2",
            "iptables": False,
            "ip6tables": False,
            "ip-forward": False,
            "ip-masq": False,
            "bridge": "none",
            "userland-proxy": False,
            "exec-opts": ["native.cgroupdriver=cgroupfs"],
            "cgroup-parent": f"{self.containerd.cgroup_parent}/docker",
            "default-ulimits": _ulimits(),
            **({"features": self.features} if self.features else {}),
            "cdi-spec-dirs": [str(self.cdi_dir)],
        }

    def env(self) -> dict[str, str]:
        return {
            "PATH": f"{self.containerd.runtime.bin_dir}:{_PATH}",
            "HOME": str(self.workdir),
            "TMPDIR": str(self.workdir / "tmp"),
            "DOCKER_HOST": f"unix://{self.socket}",
            "DOCKER_CONFIG": str(self.workdir / "cli"),
        }

    def start(self, timeout: float = 30.0) -> None:
        """Start containerd, then dockerd; return when ``docker version`` answers.

        Raises DockerError (with dockerd's log) when it exits or does not answer in time.
        """
        for sub in ("root", "exec", "tmp", "cli", "cdi"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        self.config.write_text(json.dumps(self.daemon_config(), indent=2))
        owner = os.getpid()
        (self.workdir / _MARKER).write_text(
            json.dumps({"owner_pid": owner, "owner_start": hostops.pid_start_time(owner)})
        )
        reap_stale()
        self._made_run_docker = not _PLUGIN_SOCKETS.parent.exists()
        self.containerd.start()
        self._start_dockerd(timeout)

    def restart_daemon(self, timeout: float = 30.0) -> None:
        """Stop dockerd (its containers removed) and start it again over the same containerd,
        reading ``daemon.json`` as it is now: what ``systemctl restart docker`` does after
        ``nri-gpu install`` edited it (the test plays the service manager)."""
        self._stop_dockerd()
        self._start_dockerd(timeout)

    def _start_dockerd(self, timeout: float) -> None:
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [str(self.bin.dockerd), "--config-file", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env(),
                cwd=self.workdir,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self.stop()
                raise DockerError(f"dockerd exited {self._proc.returncode}:\n{self.log_tail()}")
            if self.socket.exists() and self("version", check=False, timeout=5).returncode == 0:
                return
            time.sleep(0.1)
        self.stop()
        raise DockerError(f"dockerd did not answer in {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 60, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``docker ARGS``; raise DockerError with its output if it fails and ``check``."""
        done = subprocess.run(
            [str(self.bin.docker), *args],
            env=self.env(),
            capture_output=True,
            timeout=timeout,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
        )
        result = subprocess.CompletedProcess(
            done.args, done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
        )
        if check and result.returncode != 0:
            raise DockerError(f"docker {' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}")
        return result

    def load(self, image: Image) -> None:
        """Store ``image`` (a one-layer OCI layout tar) under its name: ``docker import``
        of its layer, with the config's ``Env``, ``Cmd``, ``WorkingDir`` and ``User``."""
        with tarfile.open(image.tar) as outer:

            def blob(digest: str) -> bytes:
                member = outer.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
                assert member is not None
                return member.read()

            index = json.loads(outer.extractfile("index.json").read())  # type: ignore[union-attr]
            manifest = json.loads(blob(index["manifests"][0]["digest"]))
            config = json.loads(blob(manifest["config"]["digest"])).get("config", {})
            (layer,) = manifest["layers"]
            data = blob(layer["digest"])
        changes = [f"ENV {e}" for e in config.get("Env", [])]
        if config.get("Cmd"):
            changes.append(f"CMD {json.dumps(config['Cmd'])}")
        if config.get("WorkingDir"):
            changes.append(f"WORKDIR {config['WorkingDir']}")
        if config.get("User"):  # the hostile soname and confvolume images run as nobody
            changes.append(f"USER {config['User']}")
        self("import", *(f"--change={c}" for c in changes), "-", image.name, stdin=data)

    def run(
        self, image: str, *command: str, options: Sequence[str] = (), check: bool = False, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """``docker run --rm --network none`` of ``image`` with ``options``."""
        return self("run", "--rm", "--network", "none", *options, image, *command, check=check, timeout=timeout)

    def stop(self, timeout: float = 20.0) -> None:
        """Remove every container, stop dockerd, then containerd (with its full clean-up)."""
        self._stop_dockerd(timeout)
        self.containerd.stop()
        hostops.unmount_under(self.workdir)  # overlay2 mounts of a container dockerd lost
        if self._made_run_docker:
            for folder in (_PLUGIN_SOCKETS, _PLUGIN_SOCKETS.parent):
                try:
                    folder.rmdir()
                except OSError:
                    break  # another dockerd's, or in use

    def _stop_dockerd(self, timeout: float = 20.0) -> None:
        if self._proc is not None and self._proc.poll() is None:
            ids = self("ps", "--all", "--quiet", check=False, timeout=10).stdout.split()
            if ids:
                self("rm", "--force", *ids, check=False, timeout=30)
            self._proc.terminate()
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)


def reap_stale() -> list[Path]:
    """Stop the dockerds of test processes that died without stopping them (their
    containerd is the containerd module's ``reap_stale``'s); returns their workdirs."""
    found = []
    for pid, argv in hostops.processes().items():
        if not (argv and argv[0].endswith("/dockerd") and "--config-file" in argv):
            continue
        workdir = Path(argv[argv.index("--config-file") + 1]).parent
        try:
            marker = json.loads((workdir / _MARKER).read_text())
        except (OSError, ValueError):
            continue
        if hostops.pid_alive(marker["owner_pid"], marker.get("owner_start")):
            continue
        hostops.kill_pids([pid], signal.SIGTERM)
        if not hostops.wait_pid_gone(pid, 10.0):
            hostops.kill_pids([pid])
            hostops.wait_pid_gone(pid, 5.0)
        hostops.unmount_under(workdir)
        found.append(workdir)
    return sorted(found)
