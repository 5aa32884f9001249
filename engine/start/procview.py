"""procfs isolation: the container's ``/proc/driver/nvidia`` shows only its GPUs.

The driver's procfs is global: every container sees every GPU under
``/proc/driver/nvidia/gpus`` and the ``params`` that let NVML create device
nodes. As legacy ``nvidia-container-cli`` did (and CDI does not), a fresh tmpfs
*view* is mounted over it holding

* copies of ``version`` and ``registry`` (each skipped when the source lacks it),
* ``params`` with ``ModifyDeviceFiles: 0``,
* ``gpus/<bus>`` for each GPU the container got: the driver's own directory,
  bind-mounted,
* with MIG, each capability file the container got (``StartWork.proc_caps``:
  ``capabilities/gpu<M>/mig/gi<G>/access``, ``.../ci<C>/access``,
  ``capabilities/mig/monitor``, ``.../config``): the driver's own file,
  bind-mounted over an empty file in folders made like the driver's (0555), so
  libcuda and NVML find the instances the container may use and no other;
  or, for a MIG config grant (``proc_caps_all``), the whole ``capabilities/``
  directory bound, live: instances created later appear in it as on the host.
  Without either, ``capabilities/`` is not in the view at all,

then made read-only, ``nosuid,nodev,noexec``. runc refuses spec mounts under
``/proc``, so this is done from inside the container's mount namespace.

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

Either way a ``Source`` is taken (the copied files and a detached clone of each
kept ``gpus/<bus>`` and capability file or folder, each opened without
following any symlink); the clones are then carried in and attached with
``move_mount``.

Order, chosen to need only what Linux 5.12 offers (``mount_setattr``): the
view is filled while detached (files, folders, empty mount points), attached,
the GPU directories and capability files bound into it (binding into a
still-detached tree needs a recent kernel), and only then is it made read-only,
binds included. Nobody sees the steps: the container's process has not
started. The marker names the GPUs and the capabilities shown: a second start
with the same work keeps the view, one with other work replaces it.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from typing import Protocol

from engine.procfs import params_with_device_modification_disabled
from engine.start import syscalls
from engine.start.rootdir import RootDir, describe, read_regular
from engine.start.work import WorkError

__all__ = [
    "MARKER",
    "DriverProcfs",
    "HostDirectory",
    "ProcSource",
    "Source",
    "is_finished",
    "isolate",
    "marker_text",
    "source_for",
    "take",
]

_SOURCE = "nri-gpu"  # the "device" name of the view's tmpfs, as mountinfo shows it
MARKER = ".nri-gpu-view"  # at the view's root; procfs itself can never hold such a file
_HEADER = b"nri-gpu procfs view 1\n"
_UNFINISHED = _HEADER + b"unfinished\n"
_COPIED = ("version", "registry")
_LIMIT = 1 << 20
_NOFOLLOW = syscalls.RESOLVE_NO_SYMLINKS  # /proc paths: procfs has no plain symlinks on them
_CLONE = syscalls.OPEN_TREE_CLONE | syscalls.OPEN_TREE_CLOEXEC | syscalls.AT_RECURSIVE | syscalls.AT_SYMLINK_NOFOLLOW
# A clone of what an fd already names (opened with ``_NOFOLLOW``: no link on the way).
_CLONE_FD = syscalls.OPEN_TREE_CLONE | syscalls.OPEN_TREE_CLOEXEC | syscalls.AT_RECURSIVE | syscalls.AT_EMPTY_PATH
_CAPS = "capabilities"
_EMPTY_BOTH = syscalls.MOVE_MOUNT_F_EMPTY_PATH | syscalls.MOVE_MOUNT_T_EMPTY_PATH
_LOCKED = (
    syscalls.MOUNT_ATTR_RDONLY | syscalls.MOUNT_ATTR_NOSUID | syscalls.MOUNT_ATTR_NODEV | syscalls.MOUNT_ATTR_NOEXEC
)


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


def marker_text(bus_ids: tuple[str, ...], source: str, caps: tuple[str, ...] = (), caps_all: bool = False) -> bytes:
    """What the marker holds: a second run with the same work keeps the view.
    ``source``: the ``ProcSource``'s name.

    The capabilities' line is there only when some are shown: a view without
    MIG reads as it did before MIG was supported.
    """
    text = f"source: {source}\nbus ids: {' '.join(bus_ids)}\n"
    if caps_all:
        text += "capabilities: all\n"
    elif caps:
        text += f"capabilities: {' '.join(sorted(caps))}\n"
    return _HEADER + text.encode()


def is_finished(marker: bytes) -> bool:
    """Whether ``marker`` (a marker file's first bytes) is a finished view's: a
    worker killed mid-build leaves the unfinished one."""
    return marker.startswith(_HEADER + b"source: ")


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

    def place(self, root: RootDir, own: int | None) -> _Place:
        """Where the view goes in ``root``. Raises ``WorkError``."""
        ...

    def close(self) -> None:
        """Release what ``take_outside`` took and nobody used."""
        ...


@dataclass(frozen=True)
class _Place:
    """The directory the view is mounted over (``fd``; closed by the caller when
    ``owned``), ``where`` it is (parent, name) and whether the view has an
    ``nvidia/`` level of its own (``nested``: it covers ``/proc/driver``)."""

    fd: int
    where: tuple[str, str]
    nested: bool
    owned: bool


def _over_own(own: int) -> _Place:
    return _Place(own, ("/proc/driver", "nvidia"), nested=False, owned=False)


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

    def place(self, root: RootDir, own: int | None) -> _Place:
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

    def place(self, root: RootDir, own: int | None) -> _Place:
        if own is not None:
            return _over_own(own)
        fd = root.opendir("/proc/driver", resolve=_NOFOLLOW)
        return _Place(fd, ("/proc", "driver"), nested=True, owned=True)

    def close(self) -> None:
        if self._taken is not None:
            self._taken.close()
            self._taken = None


def source_for(proc_source: str | None) -> ProcSource:
    """The strategy for ``StartWork.proc_source``: None on a real node, a host
    directory on a simulated one."""
    return DriverProcfs() if proc_source is None else HostDirectory(proc_source)


def isolate(
    root: RootDir,
    bus_ids: tuple[str, ...],
    source: ProcSource,
    *,
    files: RootDir,
    caps: tuple[str, ...] = (),
    caps_all: bool = False,
) -> str:
    """Build the view on the container's live tree ``root``; returns "created",
    "kept" (ours, identical, already there) or "skipped" (no driver tree anywhere
    and nothing to show).

    ``source``: where the view comes from (``source_for``; for a host directory,
    ``take_outside`` was called with the same ``bus_ids``, ``caps`` and
    ``caps_all``). ``files``: the ``nodev`` copy of the root
    (``RootDir.detached_copy``) a marker is read through. ``caps``,
    ``caps_all``: the MIG capabilities shown (``take``). Raises ``WorkError``.
    """
    marker = marker_text(bus_ids, source.name, caps, caps_all)
    old = _existing_view(files)
    if old is not None:
        parent, name, text = old
        if text == marker:
            return "kept"
        _unmount(root, parent, name)  # different work: the source is behind it
    own = root.find_dir("/proc/driver/nvidia", resolve=_NOFOLLOW)
    try:
        taken = source.take_inside(own, bus_ids, caps, caps_all)  # before the view hides it
        if taken is None:
            return "skipped"
        try:
            place = source.place(root, own)
            try:
                _build(root, place.fd, place.where, place.nested, taken, marker)
            finally:
                if place.owned:
                    os.close(place.fd)
        finally:
            taken.close()
    finally:
        if own is not None:
            os.close(own)
    return "created"


def _existing_view(root: RootDir) -> tuple[str, str, bytes] | None:
    """(parent, name, marker) of a view of ours: over /proc/driver, or /proc/driver/nvidia."""
    for parent, name in (("/proc", "driver"), ("/proc/driver", "nvidia")):
        text = root.read_small(f"{parent}/{name}/{MARKER}", 4096, resolve=_NOFOLLOW)
        if text is not None:
            return parent, name, text
    return None


def _unmount(root: RootDir, parent: str, name: str) -> None:
    # umount2 takes a path; it is one name relative to a directory resolved in
    # the root, and UMOUNT_NOFOLLOW keeps even that name from being a link.
    fd = root.opendir(parent, resolve=_NOFOLLOW)
    try:
        os.fchdir(fd)
        syscalls.umount2(name, syscalls.MNT_DETACH | syscalls.UMOUNT_NOFOLLOW)
    except OSError as exc:
        raise WorkError(describe(exc, f"{parent}/{name}")) from exc
    finally:
        os.fchdir(root.fd)
        os.close(fd)


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
    """A detached copy of ``gpus/<bus>`` per bus id."""
    clones: dict[str, int] = {}
    try:
        for bus in bus_ids:
            try:
                clones[bus] = syscalls.open_tree(source, f"gpus/{bus}", _CLONE)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    raise WorkError(f"bus id {bus} is not on this node") from exc
                raise WorkError(describe(exc, f"driver/nvidia/gpus/{bus}")) from exc
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
                clones[cap] = _clone(fd, f"{_CAPS}/{cap}")
        whole = _clone(_open_source(source, _CAPS, os.O_DIRECTORY), _CAPS) if caps_all else None
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
    path = f"{_CAPS}/{cap}"
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


def _new_tmpfs() -> int:
    return syscalls.new_tmpfs((("source", _SOURCE), ("mode", "0555"), ("size", "4m"), ("nr_inodes", "4096")))


def _build(
    root: RootDir,
    target: int,
    where: tuple[str, str],
    nested: bool,
    source: Source,
    marker: bytes,
) -> None:
    view = _new_tmpfs()
    try:
        nvidia = _fill(view, nested, source)
        try:
            syscalls.move_mount(view, "", target, "", _EMPTY_BOTH)
            try:
                for bus, clone in source.gpus.items():
                    _bind(clone, nvidia, f"gpus/{bus}", os.O_DIRECTORY)
                for cap, clone in source.caps.items():
                    _bind(clone, nvidia, f"{_CAPS}/{cap}", 0)
                if source.caps_all is not None:
                    _bind(source.caps_all, nvidia, _CAPS, os.O_DIRECTORY)
                _write(view, MARKER, marker, 0o444, replace=True)  # now it is finished
                syscalls.mount_setattr(
                    view,
                    "",
                    syscalls.AT_EMPTY_PATH | syscalls.AT_RECURSIVE,
                    attr_set=_LOCKED,
                    propagation=syscalls.MS_PRIVATE,
                )
            except BaseException:
                _unmount(root, *where)  # leave no half-built view behind
                raise
        finally:
            if nvidia != view:
                os.close(nvidia)
    except OSError as exc:
        raise WorkError(describe(exc, f"{where[0]}/{where[1]}")) from exc
    finally:
        os.close(view)


def _bind(clone: int, nvidia: int, path: str, kind: int) -> None:
    """Attach ``clone`` over the mount point at ``path`` (a directory with
    ``kind`` ``O_DIRECTORY``, else a file) in the view's ``nvidia`` level."""
    mountpoint = os.open(path, os.O_PATH | kind | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=nvidia)
    try:
        syscalls.move_mount(clone, "", mountpoint, "", _EMPTY_BOTH)
    finally:
        os.close(mountpoint)


def _fill(view: int, nested: bool, source: Source) -> int:
    """Write the copied files, the empty GPU directories and the capability mount
    points (folders 0555 and empty files 0444, as the driver makes them); the fd
    of the ``nvidia`` level."""
    # Marked from the start: a worker killed before the end leaves a view whose
    # marker matches no work, so the next run replaces it rather than reading it
    # as the driver's own tree.
    _write(view, MARKER, _UNFINISHED, 0o444)
    nvidia = view
    if nested:
        _mkdir(view, "nvidia")
        nvidia = os.open("nvidia", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=view)
    for name, (data, mode) in source.files.items():
        _write(nvidia, name, data, mode)
    _mkdir(nvidia, "gpus")
    for bus in source.gpus:
        _mkdir(nvidia, f"gpus/{bus}")
    if source.caps_all is not None or source.caps:
        _mkdir(nvidia, _CAPS)
    made = {_CAPS}
    for cap in source.caps:
        folders = cap.split("/")[:-1]
        for depth in range(1, len(folders) + 1):
            folder = "/".join((_CAPS, *folders[:depth]))
            if folder not in made:
                _mkdir(nvidia, folder)
                made.add(folder)
        _write(nvidia, f"{_CAPS}/{cap}", b"", 0o444)
    return nvidia


def _mkdir(dirfd: int, name: str) -> None:
    os.mkdir(name, 0o555, dir_fd=dirfd)
    os.chmod(name, 0o555, dir_fd=dirfd)  # whatever the plugin's umask (our own tmpfs: no link to follow)


def _write(dirfd: int, name: str, data: bytes, mode: int, *, replace: bool = False) -> None:
    # A tmpfs of our own, holding nothing the container made: a plain create.
    flags = (
        os.O_WRONLY | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC | (os.O_TRUNC if replace else os.O_CREAT | os.O_EXCL)
    )
    fd = os.open(name, flags, mode, dir_fd=dirfd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
