"""Host-side clean-up primitives: processes, mounts and cgroups (Linux only).

containerd and its shims leave state on the host that survives the daemon: shim
processes, container processes, overlay and shm mounts, cgroup directories. The test
bed owns all of it through three scopes, and these helpers act only inside a scope:
a path prefix (mounts under the workdir), a cgroup parent private to one containerd,
and exact command-line matches (the shim's ``-address <our socket>``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import time
from pathlib import Path

__all__ = [
    "cgroup_roots",
    "kill_pids",
    "mounts_under",
    "pid_alive",
    "pid_start_time",
    "processes",
    "remove_cgroup_tree",
    "unmount_under",
    "wait_pid_gone",
]

_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    return field.encode().decode("unicode_escape").encode("latin-1").decode("utf-8", "replace")


def _mountinfo() -> list[tuple[str, str]]:
    """(mount point, fs type) of every mount in our mount namespace."""
    result = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        result.append((_unescape(fields[4]), right.split()[0]))
    return result


def mounts_under(prefix: Path) -> list[str]:
    """Mount points at or below ``prefix``, deepest first."""
    base = str(prefix).rstrip("/")
    found = {mp for mp, _ in _mountinfo() if mp == base or mp.startswith(base + "/")}
    return sorted(found, key=lambda p: (p.count("/"), p), reverse=True)


def unmount_under(prefix: Path) -> list[str]:
    """Lazily unmount everything under ``prefix``; return what was unmounted.

    MNT_DETACH, because a mount can still be busy (a dying shim's cwd) and we only
    need it gone from the tree; stacked mounts need several passes.
    """
    done: list[str] = []
    for _ in range(8):
        targets = mounts_under(prefix)
        if not targets:
            break
        for target in targets:
            if _libc.umount2(target.encode(), _MNT_DETACH) == 0:
                done.append(target)
            elif ctypes.get_errno() not in (errno.EINVAL, errno.ENOENT):
                raise OSError(ctypes.get_errno(), f"umount2({target}) failed")
    return done


def cgroup_roots() -> list[Path]:
    """Mount points of every cgroup hierarchy (v1 controllers and the unified one)."""
    return sorted({Path(mp) for mp, fstype in _mountinfo() if fstype in ("cgroup", "cgroup2")})


def remove_cgroup_tree(rel: str, timeout: float = 5.0) -> list[int]:
    """SIGKILL every process in the cgroup ``rel`` (e.g. ``/nri-gpu-e2e/x``) and below, in
    every hierarchy, then remove the directories bottom-up. Return the pids killed.

    Only ever called with a cgroup parent the test bed created for one containerd.
    """
    rel = rel.strip("/")
    if not rel:
        raise ValueError("refusing to clean the root cgroup")
    killed: list[int] = []
    dirs = [root / rel for root in cgroup_roots() if (root / rel).is_dir()]
    deadline = time.monotonic() + timeout
    while dirs and time.monotonic() < deadline:
        for top in dirs:
            for procs in top.rglob("cgroup.procs"):
                for pid in _read_pids(procs):
                    _kill(pid, signal.SIGKILL)
                    killed.append(pid)
            for sub in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                _rmdir(sub)
            _rmdir(top)
        dirs = [d for d in dirs if d.exists()]
        if dirs:
            time.sleep(0.05)  # killed tasks take a moment to leave their cgroup
    if dirs:
        raise OSError(f"cgroups still busy after {timeout}s: {', '.join(map(str, dirs))}")
    return sorted(set(killed))


def _read_pids(procs: Path) -> list[int]:
    try:
        return [int(x) for x in procs.read_text().split()]
    except OSError:
        return []


def _rmdir(path: Path) -> None:
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
            raise


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def processes() -> dict[int, list[str]]:
    """pid -> argv of every process we can see (kernel threads have empty argv)."""
    result = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                raw = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if raw:
                result[int(entry.name)] = raw.rstrip(b"\0").decode("utf-8", "replace").split("\0")
    return result


def pid_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (field 22 of /proc/pid/stat): with the
    pid it identifies a process across pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])


def pid_alive(pid: int, start_time: int | None = None) -> bool:
    now = pid_start_time(pid)
    if now is None:
        return False
    if _is_zombie(pid):
        return False
    return start_time is None or now == start_time


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return False


def wait_pid_gone(pid: int, timeout: float) -> bool:
    """Wait until ``pid`` is gone (or a zombie); True if it went within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.02)
    return not pid_alive(pid)


def kill_pids(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        _kill(pid, sig)
