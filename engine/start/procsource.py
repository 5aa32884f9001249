"""The procfs view's source: what a GPU-restricted ``/proc/driver/nvidia`` is made of.

One code path for a real node and a simulated one; what differs is the
``ProcSource`` strategy, chosen once from the config by ``source_for``:

* ``DriverProcfs`` (a real node): the source is the container's own
  ``/proc/driver/nvidia``, taken inside, before the view hides it, and the
  view goes over it;
* ``HostDirectory`` (a simulated node, whose procfs has no driver): the source
  is a host directory, taken in the host's mount namespace before entering
  the container, because the kernel (6.18 checked) refuses to clone from a
  detached tree of another namespace; the view goes over the container's
  ``/proc/driver/nvidia`` if it has one, else over ``/proc/driver`` with an
  ``nvidia/`` level (procfs cannot mkdir).

Either way a ``Source`` is taken (``take``: the copied files and a detached
clone of each kept ``gpus/<bus>`` and capability file or folder, each opened
without following any symlink); ``procview`` carries the clones in and
attaches them with ``move_mount``.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from typing import Protocol

from nri_gpu.engine.procfs import params_with_device_modification_disabled
from nri_gpu.engine.start import syscalls
from nri_gpu.engine.start.rootdir import RootDir, describe, read_regular
from nri_gpu.engine.start.work import WorkError

__all__ = [
    "CAPS",
    "DriverProcfs",
    "HostDirectory",
    "Place",
    "ProcSource",
    "Source",
    "source_for",
    "take",
]

CAPS = "capabilities"
_COPIED = ("version", "registry")
_LIMIT = 1 << 20
_NOFOLLOW = syscalls.RESOLVE_NO_SYMLINKS  # /proc paths: procfs has no plain symlinks on them
# A clone of what an fd already names (opened with ``_NOFOLLOW``: no link on the way).
_CLONE_FD = syscalls.OPEN_TREE_CLONE | syscalls.OPEN_TREE_CLOEXEC | syscalls.AT_RECURSIVE | syscalls.AT_EMPTY_PATH


@dataclass
class Source:
    """What the view is made of, taken from the source tree before anything hides
    it: the copied files (name -> (content, mode)), a detached clone of each
    kept ``gpus/<bus>`` directory, of each capability file shown (path under
    ``capabilities/`` -> clone) and, for ``proc_caps_all``, of the whole
    ``capabilities/`` directory (``caps_all``)."""

    files: dict[str, tuple[bytes, int]]
    gpus: dict[str, int]
    caps: dict[str, int] = field(default_factory=dict)
    caps_all: int | None = None

    def close(self) -> None:
        for fd in (*self.gpus.values(), *self.caps.values()):
            os.close(fd)
        if self.caps_all is not None:
            os.close(self.caps_all)
        self.gpus.clear()
        self.caps.clear()
        self.caps_all = None


def take(tree: int, bus_ids: tuple[str, ...], *, caps: tuple[str, ...] = (), caps_all: bool = False) -> Source:
    """Read and clone what the view needs from the directory fd ``tree`` (a driver's
    ``/proc/driver/nvidia``). Called in the namespace ``tree`` belongs to: a clone
    of a mount of another namespace is refused by the kernel. ``caps``: the
    capability files to show (``StartWork.proc_caps``, names checked there);
    ``caps_all``: the whole ``capabilities/`` folder instead (each of ``caps``
    must still be there). Raises ``WorkError`` naming a bus id or a capability
    file the source does not have."""
    files = _read_sources(tree)
    source = Source(files=files, gpus=_clone_gpus(tree, bus_ids))
    try:
        source.caps, source.caps_all = _clone_caps(tree, caps, caps_all)
    except BaseException:
        source.close()
        raise
    return source


class ProcSource(Protocol):
    """Where the view's content comes from, and where the view goes: the one
    thing a real node and a simulated one do differently (see the module doc)."""

    @property
    def name(self) -> str:
        """In the marker ("container", "host"): a view from another source is replaced."""
        ...

    @property
    def takes_outside(self) -> bool:
        """Whether ``take_outside`` has anything to do (the worker times it as a step then)."""
        ...

    def take_outside(self, bus_ids: tuple[str, ...], caps: tuple[str, ...], caps_all: bool) -> None:
        """In the host's mount namespace, before entering the container: take what
        can only be taken there. Raises ``WorkError``."""
        ...

    def take_inside(
        self, own: int | None, bus_ids: tuple[str, ...], caps: tuple[str, ...], caps_all: bool
    ) -> Source | None:
        """In the container's mount namespace, before the view hides ``own`` (its
        ``/proc/driver/nvidia``, None when it has none): the view's source, now
        the caller's to close; None for no view at all. Raises ``WorkError``."""
        ...

    def place(self, root: RootDir, own: int | None) -> Place:
        """Where the view goes in ``root``. Raises ``WorkError``."""
        ...

    def close(self) -> None:
        """Release what ``take_outside`` took and nobody used."""
        ...


@dataclass(frozen=True)
class Place:
    """The directory the view is mounted over (``fd``; closed by the caller when
    ``owned``), ``where`` it is (parent, name) and whether the view has an
    ``nvidia/`` level of its own (``nested``: it covers ``/proc/driver``)."""

    fd: int
    where: tuple[str, str]
    nested: bool
    owned: bool


def _over_own(own: int) -> Place:
    return Place(own, ("/proc/driver", "nvidia"), nested=False, owned=False)


class DriverProcfs:
    """A real node: the driver's procfs, as the container sees it."""

    name = "container"
    takes_outside = False

    def take_outside(self, bus_ids: tuple[str, ...], caps: tuple[str, ...], caps_all: bool) -> None:
        pass  # nothing of the host's: the container's own tree is the source

    def take_inside(
        self, own: int | None, bus_ids: tuple[str, ...], caps: tuple[str, ...], caps_all: bool
    ) -> Source | None:
        if own is not None:
            return take(own, bus_ids, caps=caps, caps_all=caps_all)
        if bus_ids or caps or caps_all:
            raise WorkError("/proc/driver/nvidia: not in the container (is the NVIDIA driver loaded?)")
        return None  # no driver, and nothing to show

    def place(self, root: RootDir, own: int | None) -> Place:
        if own is None:  # take_inside refused or skipped already
            raise WorkError("/proc/driver/nvidia: not in the container")
        return _over_own(own)

    def close(self) -> None:
        pass


class HostDirectory:
    """A simulated node: its driver tree is a host directory (``path``), carried in."""

    name = "host"
    takes_outside = True

    def __init__(self, path: str) -> None:
        self.path = path
        self._taken: Source | None = None

    def take_outside(self, bus_ids: tuple[str, ...], caps: tuple[str, ...], caps_all: bool) -> None:
        try:
            tree = os.open(self.path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise WorkError(f"{self.path}: {exc.strerror}") from exc
        try:
            self._taken = take(tree, bus_ids, caps=caps, caps_all=caps_all)
        finally:
            os.close(tree)

    def take_inside(
        self, own: int | None, bus_ids: tuple[str, ...], caps: tuple[str, ...], caps_all: bool
    ) -> Source | None:
        taken, self._taken = self._taken, None
        if taken is None:
            raise WorkError(f"{self.path}: not taken before entering the container")
        return taken

    def place(self, root: RootDir, own: int | None) -> Place:
        if own is not None:
            return _over_own(own)
        fd = root.opendir("/proc/driver", resolve=_NOFOLLOW)
        return Place(fd, ("/proc", "driver"), nested=True, owned=True)

    def close(self) -> None:
        if self._taken is not None:
            self._taken.close()
            self._taken = None


def source_for(proc_source: str | None) -> ProcSource:
    """The strategy for ``StartWork.proc_source``: None on a real node, a host
    directory on a simulated one."""
    return DriverProcfs() if proc_source is None else HostDirectory(proc_source)


def _read_sources(source: int) -> dict[str, tuple[bytes, int]]:
    """name -> (content, mode) of the files the view copies; missing ones left out."""
    files: dict[str, tuple[bytes, int]] = {}
    for name in (*_COPIED, "params"):
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=source)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise WorkError(describe(exc, f"driver/nvidia/{name}")) from exc
        try:
            data, mode = read_regular(fd, f"driver/nvidia/{name}", _LIMIT), os.fstat(fd).st_mode & 0o777
        finally:
            os.close(fd)
        if name == "params":
            text = data.decode("utf-8", "surrogateescape")
            data = params_with_device_modification_disabled(text).encode("utf-8", "surrogateescape")
        files[name] = (data, mode)
    return files


def _clone_gpus(source: int, bus_ids: tuple[str, ...]) -> dict[str, int]:
    """A detached copy of ``gpus/<bus>`` per bus id, each opened first as the
    capability files are (no link on the way, ``gpus`` included)."""
    clones: dict[str, int] = {}
    try:
        for bus in bus_ids:
            path = f"gpus/{bus}"
            try:
                fd = syscalls.openat2(source, path, os.O_PATH | os.O_DIRECTORY, resolve=_NOFOLLOW)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    raise WorkError(f"bus id {bus} is not on this node") from exc
                raise WorkError(describe(exc, f"driver/nvidia/{path}")) from exc
            clones[bus] = _clone(fd, path)
    except BaseException:
        for fd in clones.values():
            os.close(fd)
        raise
    return clones


def _clone_caps(source: int, caps: tuple[str, ...], caps_all: bool) -> tuple[dict[str, int], int | None]:
    """A detached copy of each capability file (none with ``caps_all``: each is
    checked, the whole ``capabilities/`` folder is cloned instead)."""
    clones: dict[str, int] = {}
    try:
        for cap in caps:
            fd = _open_cap(source, cap)
            if caps_all:
                os.close(fd)
            else:
                clones[cap] = _clone(fd, f"{CAPS}/{cap}")
        whole = _clone(_open_source(source, CAPS, os.O_DIRECTORY), CAPS) if caps_all else None
    except BaseException:
        for fd in clones.values():
            os.close(fd)
        raise
    return clones, whole


def _clone(fd: int, path: str) -> int:
    """A detached copy of what ``fd`` (closed here) names; ``path`` for messages."""
    try:
        return syscalls.open_tree(fd, "", _CLONE_FD)
    except OSError as exc:
        raise WorkError(describe(exc, f"driver/nvidia/{path}")) from exc
    finally:
        os.close(fd)


def _open_cap(source: int, cap: str) -> int:
    """An ``O_PATH`` fd of ``capabilities/<cap>``, a regular file; ``WorkError`` if it
    is gone (the instance was destroyed since the container was planned)."""
    path = f"{CAPS}/{cap}"
    fd = _open_source(source, path, 0)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise WorkError(f"driver/nvidia/{path}: not a regular file")
    return fd


def _open_source(source: int, path: str, flags: int) -> int:
    try:
        return syscalls.openat2(source, path, os.O_PATH | flags, resolve=_NOFOLLOW)
    except FileNotFoundError as exc:
        raise WorkError(
            f"driver/nvidia/{path} is not on this node (a MIG instance destroyed since the container was planned?)"
        ) from exc
    except OSError as exc:
        raise WorkError(describe(exc, f"driver/nvidia/{path}")) from exc
