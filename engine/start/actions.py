"""The start work, step by step, as run by the forked worker process.

Theory of operation. The worker starts in the plugin's namespaces and opens
everything it needs from the host first, because afterwards the host is out of
reach: the container's ``/proc/<pid>`` directory (pinning the process), its
mount namespace, for ldconfig its procfs mount points and the trusted
ldconfig binary, and what the procfs view's source strategy takes on the host
(``procsource.ProcSource.take_outside``: a simulated node's files read, GPU
directories and MIG capability files cloned). It checks first that the pid is the
container's: in the cgroup the runtime named, and neither sharing the mount
namespace nor the root of the plugin or of pid 1 (in a DaemonSet the plugin's
own are its container's; pid 1's, with the host's pid namespace, are the
node's). With the daemons' IPC endpoints the container got, it walks each
host path again as discovery does and records the inode (``ipc``); the first
thing inside compares the container's mount with it. Then it
``setns``es into the container's mount namespace: ``/`` is now the
container's root, opened as the ``RootDir`` every path is resolved against.
The steps:

1. root copy: a detached clone of the container's mount tree, ``nodev`` and
   ``nosuid`` throughout, writable at its top (``RootDir.detached_copy``).
   Every file is read and written through it: no device node of the image or
   of a volume can be opened, and the container's own mounts never change
   flags (a read-only root stays read-only even for a worker killed at any
   point; the clone dies with the worker);
2. procfs isolation (``procview``): mounted on the container's live tree, the
   one thing that must be; its marker is read through the copy;
3. symlinks (``links``);
4. CUDA forward compatibility (``compat``, with ``policy.cuda_compat``): is
   the image's ``/usr/local/cuda/compat`` newer than the driver? Then its
   libraries go first, in the conf files and the cache;
5. ``ld.so.conf`` files, then the ld.so cache: the driver's entries merged
   into the image's own cache (``ldconfig.merge``, no process), or with
   ``ld_cache = "rebuild"`` ldconfig in its confined child (``ldconfig``,
   ``confine``), skipped when nothing was written and the cache already lists
   the links.

Every step is idempotent; a failure names its step.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from nri_gpu.engine.config import LdCache
from nri_gpu.engine.start import (
    appprofile,
    cgroup,
    compat,
    ipc,
    ldconfig,
    links,
    mountinfo,
    procsource,
    procview,
    syscalls,
)
from nri_gpu.engine.start.rootdir import RootDir
from nri_gpu.engine.start.work import StartReport, StartWork, WorkError

__all__ = ["StepFailed", "identity_blind_spots", "perform"]


# mountinfo of a container: a few KB; one with thousands of mounts is refused
# rather than parsed at length.
_MOUNTINFO_LIMIT = 4 << 20
# Whose mount namespace and root a container's never are: the plugin's own and
# pid 1's (the node's init, when the plugin has the host's pid namespace).
_NOT_CONTAINERS = (("/proc/self", "the plugin's"), ("/proc/1", "the host's (pid 1's)"))
_Seen = tuple[os.stat_result, str]  # a stat of a root or namespace, and whose it is


class StepFailed(Exception):
    """A step failed; ``step`` names it, the message says what went wrong."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(message)
        self.step = step


class _Steps:
    """Times each step and turns whatever it raises into ``StepFailed(step, ...)``."""

    def __init__(self, on_step: Callable[[str], None] | None) -> None:
        self.timings: dict[str, float] = {}
        self._on_step = on_step

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """``with steps.step(name):`` runs one step under that name."""
        if self._on_step is not None:
            self._on_step(name)  # so a worker killed on timeout can be reported with its step
        start = time.perf_counter()
        try:
            yield
        except StepFailed:
            raise
        except WorkError as exc:
            raise StepFailed(name, str(exc)) from exc
        except OSError as exc:
            raise StepFailed(name, exc.strerror or str(exc)) from exc
        except Exception as exc:
            raise StepFailed(name, f"{type(exc).__name__}: {exc}") from exc
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + (time.perf_counter() - start) * 1000


@dataclass
class _Host:
    """Host-side handles, all opened before entering the container."""

    proc_source: procsource.ProcSource
    trusted: ldconfig.Trusted | None = None
    ipc_seen: ipc.Seen = ()  # the IPC endpoints' host inodes, compared with the mounts inside


def perform(
    pid: int,
    work: StartWork,
    *,
    ldconfig_path: str,
    deadline: float,
    on_step: Callable[[str], None] | None = None,
) -> StartReport:
    """Do ``work`` in the container whose init process is ``pid``; ``on_step`` hears
    each step's name as it starts. Raises ``StepFailed``."""
    started = time.perf_counter()
    steps = _Steps(on_step)
    with steps.step("enter"):
        mntns, host, roots = _open_host(pid, work, steps, ldconfig_path)
        # Joining a mount namespace needs a root and cwd no other thread shares
        # (EINVAL otherwise). The worker is a fork, with one thread and its own
        # copy of them; a thread some at-fork handler started would make this
        # fail, and the start with it, rather than leave a thread outside.
        syscalls.setns(mntns, syscalls.CLONE_NEWNS)
        root = RootDir.current()
        for seen, whose in roots:
            _refuse_host_root(root, seen, f"process {pid} has {whose} root: not a container")
    return _steps(root, host, work, steps, deadline, started)


def _refuse_host_root(root: RootDir, host_root: os.stat_result, message: str) -> None:
    here = os.fstat(root.fd)
    if (here.st_dev, here.st_ino) == (host_root.st_dev, host_root.st_ino):
        raise WorkError(message)


def _steps(live: RootDir, host: _Host, work: StartWork, steps: _Steps, deadline: float, started: float) -> StartReport:
    """The steps proper, in the container's root ``live`` (see the module doc)."""
    if host.ipc_seen:
        with steps.step("IPC endpoints"):
            ipc.check(live, host.ipc_seen)
    with steps.step("root copy"):
        copy = live.detached_copy()
    with steps.step("procfs isolation"):
        try:
            procfs = procview.isolate(
                live,
                work.visible_bus_ids,
                host.proc_source,
                files=copy,
                caps=work.proc_caps,
                caps_all=work.proc_caps_all,
            )
        finally:
            host.proc_source.close()  # what was taken on the host and not used (a view kept)
    written = False
    with steps.step("symlinks"):
        links.create(copy, work.symlinks)
    if work.app_profile:
        with steps.step("application profile"):
            appprofile.write(copy, work.app_profile)
    found = compat.Compat()
    if work.ldconfig_folders and work.cuda_compat:
        with steps.step("CUDA compat"):
            found = compat.check(copy, work.driver_version)
    if work.ldconfig_folders:
        # The compat folder's entries go in after the driver's: each goes before
        # its ties, so before the driver's library of the same name.
        entries = work.ld_cache_entries + found.entries
        with steps.step("ld.so.conf"):
            changed = ldconfig.write_conf(copy, work.ldconfig_folders)
            changed = ldconfig.write_compat_conf(copy, found.folder) or changed
        if host.trusted is None:  # ld_cache "merge"
            with steps.step("ld.so.cache"):
                written = ldconfig.merge(copy, entries, deadline)
        else:  # "rebuild": the trusted ldconfig was opened on the host for it
            with steps.step("ldconfig"):
                if changed or not ldconfig.cache_lists(copy, entries, deadline):
                    # Its own line: the ldconfig process alone, fork to reap.
                    steps.timings["ldconfig process"] = ldconfig.run(copy, host.trusted, deadline)
                    written = True
    steps.timings["total"] = (time.perf_counter() - started) * 1000
    return StartReport(timings_ms=steps.timings, procfs=procfs, ld_cache_written=written, cuda_compat=found.note)


def _open_host(pid: int, work: StartWork, steps: _Steps, ldconfig_path: str) -> tuple[int, _Host, list[_Seen]]:
    """The container's mount namespace, what the steps need from the host, and the
    roots the container's must not be (checked once inside)."""
    if pid <= 0:
        raise WorkError(f"no container process (pid {pid})")
    try:
        proc = os.open(f"/proc/{pid}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise WorkError(f"process {pid} does not exist (the container exited?)") from exc
    try:
        # Relative to /proc/<pid>: a pid reused meanwhile fails (ESRCH) instead of misleading.
        mntns = os.open("ns/mnt", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
        here = os.fstat(mntns)
        for seen, whose in _identities("ns/mnt"):
            if (here.st_dev, here.st_ino) == (seen.st_dev, seen.st_ino):
                raise WorkError(f"process {pid} shares {whose} mount namespace: not a container")
        if work.cgroups_path:
            _check_cgroup(proc, pid, work.cgroups_path)
        roots = _identities("root")
        host = _Host(procsource.source_for(work.proc_source))
        if work.ipc:
            with steps.step("IPC endpoints"):
                host.ipc_seen = ipc.on_host(work)
        if work.ldconfig_folders and work.ld_cache is LdCache.REBUILD:
            with steps.step("ldconfig"):
                host.trusted = _trusted(proc, ldconfig_path)
        _take_proc_source(host, work, steps)
        return mntns, host, roots
    finally:
        os.close(proc)


def _identities(name: str) -> list[_Seen]:
    """(stat, whose) of ``name`` (``root``, ``ns/mnt``) of the plugin and of pid 1,
    where they can be looked at (pid 1 is out of sight without the host's pid
    namespace: then the plugin's own are the ones to refuse)."""
    found = []
    for proc, whose in _NOT_CONTAINERS:
        try:
            found.append((os.stat(f"{proc}/{name}"), whose))
        except OSError:
            continue
    return found


def identity_blind_spots() -> list[str]:
    """What the identity checks cannot look at from here, in words: each is a
    namespace or root that ``perform`` could not tell from a container's (pid 1's,
    where ``/proc/1`` is out of sight or refused). For a warning at start-up; the
    worker itself never logs."""
    blind = []
    for proc, whose in _NOT_CONTAINERS:
        for name in ("root", "ns/mnt"):
            try:
                os.stat(f"{proc}/{name}")
            except OSError as exc:
                blind.append(f"{proc}/{name}, {whose}: {exc.strerror}")
    return blind


def _check_cgroup(proc: int, pid: int, cgroups_path: str) -> None:
    """Refuse a pid outside the container's cgroup: a runtime's pid or one found
    by ``find_init_pid`` that is not (or no longer) the container's."""
    try:
        fd = os.open("cgroup", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=proc)
        try:
            raw = os.read(fd, cgroup.MAX_PROC_CGROUP + 1)
        finally:
            os.close(fd)
    except OSError as exc:
        raise WorkError(f"/proc/{pid}/cgroup: {exc.strerror}") from exc
    if len(raw) > cgroup.MAX_PROC_CGROUP:
        raise WorkError(f"/proc/{pid}/cgroup: over {cgroup.MAX_PROC_CGROUP} bytes")
    text = raw.decode("utf-8", "replace")
    try:
        inside = cgroup.is_in(text, cgroups_path)
    except ValueError as exc:
        raise WorkError(str(exc)) from exc
    if not inside:
        shown = ", ".join(line.split(":", 2)[-1] for line in text.splitlines()[:4])[:300]
        raise WorkError(f"process {pid} is not in the container's cgroup {cgroups_path[:300]!r} (it is in {shown})")


def _take_proc_source(host: _Host, work: StartWork, steps: _Steps) -> None:
    """What the procfs view's source takes on the host, if anything (a simulated
    node's tree: see ``procsource``), timed as that step."""
    if host.proc_source.takes_outside:
        with steps.step("procfs isolation"):
            host.proc_source.take_outside(work.visible_bus_ids, work.proc_caps, work.proc_caps_all)


def _proc_mounts(fd: int, name: str) -> tuple[str, ...]:
    """The procfs mount points the mountinfo open at ``fd`` (``name`` in messages)
    lists; closes ``fd``. Refused over ``_MOUNTINFO_LIMIT``: cut short, one could
    be left uncovered for ldconfig."""
    with open(fd, encoding="utf-8", errors="replace") as f:
        text = f.read(_MOUNTINFO_LIMIT + 1)
    if len(text) > _MOUNTINFO_LIMIT:
        raise WorkError(f"{name}: over {_MOUNTINFO_LIMIT} bytes")
    return mountinfo.proc_mount_points(text)


def _trusted(proc: int, path: str) -> ldconfig.Trusted:
    binary = ldconfig.open_trusted(path)
    points = _proc_mounts(
        os.open("mountinfo", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=proc), "the container's mountinfo"
    )
    own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)  # unreachable once inside
    devnull = os.open("/dev/null", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    return ldconfig.Trusted(path=path, binary=binary, own_pid_namespace=own, proc_mounts=points, devnull=devnull)
