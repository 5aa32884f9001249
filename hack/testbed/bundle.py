"""OCI bundles run by runc directly: containers in the "created" state, as at NRI StartContainer.

``runc create`` leaves a container exactly where containerd leaves it when it
sends NRI StartContainer: the init process exists (``runc:[2:INIT]``), its
namespaces are set up, it has pivoted into its root (made read-only if
``root.readonly``), and it waits for ``runc start`` to exec the user process.
The engine's start work runs in that window; the container's own process then
shows what it sees.

* Root file systems: Debian's static busybox with its applet links (and, with
  ``glibc=True``, Debian's libc6 and libc-bin: a dynamic loader and the image's
  own ldconfig), built once under ``<cache>/rootfs/``. Each container gets an
  overlay of it (lower: the shared tree, upper: its own), as containerd's
  overlayfs snapshotter does, so a test can plant anything in its container.
* Spec: mount, pid, IPC, UTS and network namespaces; ``/proc``, ``/dev``,
  ``/dev/pts``, ``/sys`` as runc's default spec mounts them; containerd's masked
  and read-only paths; extra read-only bind mounts (a plan's library mounts).
* Stdout and stderr of the container's process go to files (``runc create`` hands
  its own stdio to the container).

``RuncHost`` owns everything it makes under its work dir: ``close()`` deletes the
containers (``runc delete -f``), unmounts the overlays and removes its cgroups.
Needs root.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import debs, hostops, runtimes
from .cache import cache_dir, locked

__all__ = ["CGROUP_PARENT", "MASKED_PATHS", "READONLY_PATHS", "Container", "RuncHost", "busybox_rootfs"]

CGROUP_PARENT = "nri-gpu-start-test"
_BUSYBOX_DEB = ("busybox-static", "trixie", "1:1.37.0-*")
_LIBC_DEBS = (("libc6", "bookworm", "2.36-*"), ("libc-bin", "bookworm", "2.36-*"))
_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# containerd's defaults for a non-privileged container (kubelet's ProcMount "Default");
# tests/e2e/test_daemonset.py sends the same lists as the kubelet would.
MASKED_PATHS = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
)
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
_CAPS = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
]


def _build_rootfs(out: Path, glibc: bool) -> None:
    busybox = debs.extract(*_BUSYBOX_DEB) / "usr/bin/busybox"
    for d in ("bin", "sbin", "usr/bin", "usr/sbin", "dev", "proc", "sys", "etc", "var", "run", "root"):
        (out / d).mkdir(parents=True, exist_ok=True)
    (out / "tmp").mkdir(mode=0o1777)
    os.chmod(out / "tmp", 0o1777)
    shutil.copy2(busybox, out / "bin/busybox")
    applets = subprocess.run([str(busybox), "--list-full"], capture_output=True, text=True, check=True).stdout
    for applet in applets.split():
        link = out / applet
        if applet != "bin/busybox" and not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to("/bin/busybox")
    (out / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (out / "etc/group").write_text("root:x:0:\n")
    if glibc:
        for deb in _LIBC_DEBS:
            shutil.copytree(debs.extract(*deb), out, symlinks=True, dirs_exist_ok=True)
        (out / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")


def busybox_rootfs(*, glibc: bool = False) -> Path:
    """The shared lower layer (never written to: containers get an overlay of it)."""
    inputs = [str(debs.extract(*_BUSYBOX_DEB)), *(str(debs.extract(*d)) for d in _LIBC_DEBS if glibc), "layout 1"]
    key = hashlib.sha256("\n".join(inputs).encode()).hexdigest()[:16]
    dest = cache_dir() / "rootfs" / f"{'glibc' if glibc else 'busybox'}-{key}"
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with locked(dest.parent / ".lock"):
        if not dest.is_dir():
            tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".build-"))
            _build_rootfs(tmp, glibc)
            tmp.rename(dest)
    return dest


@dataclass
class Container:
    """A container runc created; ``rootfs`` is its overlay as the host sees it."""

    host: RuncHost
    id: str
    bundle: Path
    rootfs: Path
    upper: Path
    cgroups_path: str
    pid: int = 0

    def runc(self, *args: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        return self.host.runc(*args, check=check, timeout=timeout)

    def state(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.runc("state", self.id).stdout)
        return result

    def start(self) -> None:
        self.runc("start", self.id)

    def wait(self, timeout: float = 10.0) -> str:
        """Wait for the process to exit after ``start``; its stdout (stderr appended after a line ``--stderr--``)."""
        deadline = time.monotonic() + timeout
        while self.state()["status"] != "stopped":
            if time.monotonic() > deadline:
                raise TimeoutError(f"container {self.id} still running after {timeout}s")
            time.sleep(0.01)
        out = (self.bundle / "stdout").read_text()
        err = (self.bundle / "stderr").read_text()
        return out + (f"--stderr--\n{err}" if err else "")

    def run(self, timeout: float = 10.0) -> str:
        self.start()
        return self.wait(timeout)

    def delete(self) -> None:
        self.runc("delete", "-f", self.id, check=False)


@dataclass
class RuncHost:
    """Creates containers with runc under ``workdir``; ``close()`` removes every trace."""

    workdir: Path
    runc_path: Path = field(default_factory=runtimes.fetch_runc)
    containers: list[Container] = field(default_factory=list)
    _cgroup: str = field(default_factory=lambda: f"{CGROUP_PARENT}/{uuid.uuid4().hex[:8]}")

    @property
    def state_root(self) -> Path:
        return self.workdir / "runc-state"

    def runc(self, *args: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.runc_path), "--root", str(self.state_root), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def create(
        self,
        name: str,
        args: Sequence[str],
        *,
        readonly: bool = False,
        binds: Iterable[tuple[str, str]] = (),
        volumes: Iterable[tuple[str, str]] = (),
        env: Sequence[str] = (),
        glibc: bool = False,
        prepare: Callable[[Path], None] | None = None,
    ) -> Container:
        """``runc create`` a container running ``args``; ``binds``: (host source,
        container destination) read-only bind mounts, ``volumes`` read-write ones
        (a hostPath); ``prepare(rootfs)`` plants files in its root (through the
        mounted overlay) before runc sees it."""
        cid = f"{name}-{uuid.uuid4().hex[:6]}"
        bundle = self.workdir / cid
        rootfs, upper, work = bundle / "rootfs", bundle / "upper", bundle / "work"
        for d in (rootfs, upper, work):
            d.mkdir(parents=True)
        lower = busybox_rootfs(glibc=glibc)
        subprocess.run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={lower},upperdir={upper},workdir={work}",
                str(rootfs),
            ],
            check=True,
            capture_output=True,
        )
        container = Container(self, cid, bundle, rootfs, upper, f"/{self._cgroup}/{cid}")
        self.containers.append(container)
        if prepare is not None:
            prepare(rootfs)
        (bundle / "config.json").write_text(
            json.dumps(self._spec(container, args, readonly, binds, volumes, env), indent=1)
        )
        with open(bundle / "stdout", "wb") as out, open(bundle / "stderr", "wb") as err:
            proc = subprocess.run(
                [str(self.runc_path), "--root", str(self.state_root), "create", "--bundle", str(bundle), cid],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                timeout=20,
            )
        if proc.returncode != 0:
            raise RuntimeError(f"runc create {cid} failed: {(bundle / 'stderr').read_text().strip()}")
        container.pid = int(container.state()["pid"])
        return container

    def _spec(
        self,
        c: Container,
        args: Sequence[str],
        readonly: bool,
        binds: Iterable[tuple[str, str]],
        volumes: Iterable[tuple[str, str]],
        env: Sequence[str],
    ) -> dict[str, Any]:
        mounts: list[dict[str, Any]] = [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {
                "destination": "/dev",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
            },
            {
                "destination": "/dev/pts",
                "type": "devpts",
                "source": "devpts",
                "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
            },
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
        ]
        mounts += [
            {
                "destination": dst,
                "type": "bind",
                "source": src,
                "options": ["rbind", "rprivate", "ro", "nosuid", "nodev"],
            }
            for src, dst in binds
        ]
        mounts += [
            {"destination": dst, "type": "bind", "source": src, "options": ["rbind", "rprivate", "nosuid", "nodev"]}
            for src, dst in volumes
        ]
        return {
            "ociVersion": "1.0.2",
            "process": {
                "terminal": False,
                "user": {"uid": 0, "gid": 0},
                "args": list(args),
                "env": [_PATH, *env],
                "cwd": "/",
                "capabilities": {k: _CAPS for k in ("bounding", "effective", "permitted")},
                "noNewPrivileges": True,
            },
            "root": {"path": "rootfs", "readonly": readonly},
            "hostname": "gpu-test",
            "mounts": mounts,
            "linux": {
                "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")],
                "cgroupsPath": c.cgroups_path,
                "maskedPaths": list(MASKED_PATHS),
                "readonlyPaths": list(READONLY_PATHS),
                "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            },
        }

    def close(self) -> None:
        for c in self.containers:
            c.delete()
        self.containers.clear()
        hostops.unmount_under(self.workdir)
        hostops.remove_cgroup_tree(self._cgroup)
        for root in hostops.cgroup_roots():
            try:
                (root / CGROUP_PARENT).rmdir()
            except OSError:
                pass  # another run's containers are still in it, or it was never made here
