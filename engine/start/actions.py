"""The start work, step by step, as run by the forked worker process.

Theory of operation. The worker starts in the plugin's namespaces and opens
everything it needs from the host first, because afterwards the host is out of
reach: the container's ``/proc/<pid>`` directory (pinning the process), its
mount namespace, for ldconfig also its pid, net, IPC and UTS namespaces, its
procfs mount points and the trusted ldconfig binary, and with a simulated
node the procfs view's source (files read, GPU directories cloned). Then it
``setns``es into the container's mount namespace: ``/`` is now the
container's root, opened as the ``RootDir`` every path is resolved against.
The steps:

1. procfs isolation (``procview``);
2. read-only root: a root runc made read-only is made writable for the next
   steps and read-only again afterwards, also on failure (the container's
   process has not started, so nobody sees the window);
3. symlinks (``links``);
4. ``ld.so.conf`` files, then the ld.so cache: the driver's entries merged
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

from engine.start import ldconfig, links, mountinfo, procview, syscalls
from engine.start.rootdir import RootDir, describe
from engine.start.work import StartReport, StartWork, WorkError

__all__ = ["StepFailed", "perform", "perform_in_bundle"]


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
    def __call__(self, name: str) -> Iterator[None]:
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

    trusted: ldconfig.Trusted | None = None
    proc_source: procview.Source | None = None


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
    step = _Steps(on_step)
    with step("enter"):
        mntns, host = _open_host(pid, work, step, ldconfig_path)
        host_root = os.stat("/")
        # Joining a mount namespace needs a root and cwd no other thread shares.
        # A fork has one thread, unless a library's at-fork handler starts more
        # (gRPC's does): this thread's own copy makes setns work either way.
        syscalls.unshare(syscalls.CLONE_FS)
        syscalls.setns(mntns, syscalls.CLONE_NEWNS)
        root = RootDir.current()
        _refuse_host_root(root, host_root, f"process {pid} has the plugin's own root: not a container")
    return _steps(root, host, work, step, deadline, started)


def perform_in_bundle(
    rootfs: str,
    work: StartWork,
    *,
    ldconfig_path: str,
    deadline: float,
    on_step: Callable[[str], None] | None = None,
) -> StartReport:
    """Do ``work`` from an OCI ``createContainer`` hook.

    Such a hook runs in the container's namespaces, but before ``pivot_root``:
    the host's files are still visible at their paths and the container's root
    is the directory ``rootfs`` (the bundle's ``root.path``, with the spec's
    mounts already under it). Nothing is entered; the root is opened as the
    ``RootDir`` every path is resolved against, and ldconfig is confined to it
    with ``chroot`` as well. Raises ``StepFailed``.
    """
    started = time.perf_counter()
    step = _Steps(on_step)
    with step("enter"):
        try:
            fd = os.open(rootfs, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise WorkError(f"container root {rootfs}: {exc.strerror}") from exc
        root = RootDir(fd)
        _refuse_host_root(root, os.stat("/"), f"container root {rootfs} is the host's own root")
        host = _Host()
        if work.ldconfig_folders and work.ld_cache == "rebuild":
            with step("ldconfig"):
                host.trusted = _trusted_here(root, rootfs, ldconfig_path)
        if work.proc_source is not None:
            with step("procfs isolation"):
                host.proc_source = _host_source(work)
    return _steps(root, host, work, step, deadline, started)


def _refuse_host_root(root: RootDir, host_root: os.stat_result, message: str) -> None:
    here = os.fstat(root.fd)
    if (here.st_dev, here.st_ino) == (host_root.st_dev, host_root.st_ino):
        raise WorkError(message)


def _steps(root: RootDir, host: _Host, work: StartWork, step: _Steps, deadline: float, started: float) -> StartReport:
    """The steps proper, in the container's root (see the module doc)."""
    with step("procfs isolation"):
        procfs = procview.isolate(root, work.visible_bus_ids, host.proc_source)
    written = False
    if work.symlinks or work.ldconfig_folders:
        with _writable_root(root, step):
            with step("symlinks"):
                links.create(root, work.symlinks)
            if work.ldconfig_folders:
                with step("ld.so.conf"):
                    changed = ldconfig.write_conf(root, work.ldconfig_folders)
                if host.trusted is None:  # ld_cache "merge"
                    with step("ld.so.cache"):
                        written = ldconfig.merge(root, work.ld_cache_entries)
                else:  # "rebuild": the trusted ldconfig was opened on the host for it
                    with step("ldconfig"):
                        if changed or not ldconfig.cache_lists(root, work.ld_cache_entries):
                            # Its own line: the ldconfig process alone, fork to reap.
                            step.timings["ldconfig process"] = ldconfig.run(root, host.trusted, deadline)
                            written = True
    step.timings["total"] = (time.perf_counter() - started) * 1000
    return StartReport(timings_ms=step.timings, procfs=procfs, ld_cache_written=written)


def _open_host(pid: int, work: StartWork, step: _Steps, ldconfig_path: str) -> tuple[int, _Host]:
    """The container's mount namespace and what the steps need from the host."""
    if pid <= 0:
        raise WorkError(f"no container process (pid {pid})")
    try:
        proc = os.open(f"/proc/{pid}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise WorkError(f"process {pid} does not exist (the container exited?)") from exc
    try:
        # Relative to /proc/<pid>: a pid reused meanwhile fails (ESRCH) instead of misleading.
        mntns = os.open("ns/mnt", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
        if os.fstat(mntns).st_ino == os.stat("/proc/self/ns/mnt").st_ino:
            raise WorkError(f"process {pid} shares the plugin's mount namespace: not a container")
        host = _Host()
        if work.ldconfig_folders and work.ld_cache == "rebuild":
            with step("ldconfig"):
                host.trusted = _trusted(proc, ldconfig_path)
        if work.proc_source is not None:
            with step("procfs isolation"):
                host.proc_source = _host_source(work)
        return mntns, host
    finally:
        os.close(proc)


def _host_source(work: StartWork) -> procview.Source:
    assert work.proc_source is not None
    try:
        tree = os.open(work.proc_source, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise WorkError(f"{work.proc_source}: {exc.strerror}") from exc
    try:
        return procview.take(tree, work.visible_bus_ids, from_host=True)
    finally:
        os.close(tree)


def _trusted(proc: int, path: str) -> ldconfig.Trusted:
    binary = ldconfig.open_trusted(path)
    with open(os.open("mountinfo", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc), encoding="utf-8", errors="replace") as f:
        points = mountinfo.proc_mount_points(f.read())
    spaces = []
    for name, nstype in (
        ("net", syscalls.CLONE_NEWNET),
        ("ipc", syscalls.CLONE_NEWIPC),
        ("uts", syscalls.CLONE_NEWUTS),
    ):
        spaces.append((os.open(f"ns/{name}", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc), nstype))
    pidns = os.open("ns/pid", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)  # unreachable once inside
    devnull = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    return ldconfig.Trusted(
        path=path,
        binary=binary,
        namespaces=tuple(spaces),
        pid_namespace=pidns,
        own_pid_namespace=own,
        proc_mounts=points,
        devnull=devnull,
    )


def _trusted_here(root: RootDir, rootfs: str, path: str) -> ldconfig.Trusted:
    """``Trusted`` for a hook: already in the container's namespaces, so none to
    join; the root is ``chroot``ed into; the procfs mounts to cover are those
    under ``rootfs`` in this mount namespace."""
    binary = ldconfig.open_trusted(path)
    prefix = os.path.realpath(rootfs).rstrip("/")
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        points = mountinfo.proc_mount_points(f.read())
    inside = tuple(point[len(prefix) :] for point in points if point.startswith(prefix + "/"))
    devnull = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    return ldconfig.Trusted(
        path=path,
        binary=binary,
        namespaces=(),
        pid_namespace=None,
        own_pid_namespace=None,
        proc_mounts=inside,
        devnull=devnull,
        chroot=root.fd,
    )


@contextlib.contextmanager
def _writable_root(root: RootDir, step: _Steps) -> Iterator[None]:
    """Clear a read-only root's flag for the block; set it again however the block ends."""
    with step("read-only root"):
        was_readonly = bool(os.fstatvfs(root.fd).f_flag & os.ST_RDONLY)
        if was_readonly:
            try:
                syscalls.mount_setattr(root.fd, "", syscalls.AT_EMPTY_PATH, attr_clr=syscalls.MOUNT_ATTR_RDONLY)
            except OSError as exc:
                raise WorkError(describe(exc, "/")) from exc
            if os.fstatvfs(root.fd).f_flag & os.ST_RDONLY:
                raise WorkError("/: the file system itself is read-only, not only the mount")
    try:
        yield
    except BaseException:
        if was_readonly:  # best effort: the failure being reported matters more
            with contextlib.suppress(OSError):
                syscalls.mount_setattr(root.fd, "", syscalls.AT_EMPTY_PATH, attr_set=syscalls.MOUNT_ATTR_RDONLY)
        raise
    if was_readonly:
        with step("read-only root"):
            syscalls.mount_setattr(root.fd, "", syscalls.AT_EMPTY_PATH, attr_set=syscalls.MOUNT_ATTR_RDONLY)
