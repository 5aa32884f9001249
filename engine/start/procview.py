"""procfs isolation: the container's ``/proc/driver/nvidia`` shows only its GPUs.

The driver's procfs is global: every container sees every GPU under
``/proc/driver/nvidia/gpus`` and the ``params`` that let NVML create device
nodes. As legacy ``nvidia-container-cli`` did (and CDI does not), a fresh tmpfs
*view* is mounted over it holding

* copies of ``version`` and ``registry`` (each skipped when the source lacks it),
* ``params`` with ``ModifyDeviceFiles: 0``,
* ``gpus/<bus>`` for each GPU the container got: the driver's own directory,
  bind-mounted,

then made read-only, ``nosuid,nodev,noexec``. runc refuses spec mounts under
``/proc``, so this is done from inside the container's mount namespace.

One code path for a real node and a simulated one; only the *source* tree
differs: the container's own ``/proc/driver/nvidia`` (real node), or a host
directory (simulated node). Either way a ``Source`` is taken from it first (the
copied files and a detached clone of each kept ``gpus/<bus>``): for a host
directory in the host's mount namespace, before entering the container,
because the kernel (6.18 checked) refuses to clone from a detached tree of
another namespace; for the container's own, inside it, before the view hides
it. The clones are then carried in and attached with ``move_mount``. Where the
container has no ``/proc/driver/nvidia`` (simulated node: procfs cannot
mkdir), the view goes over ``/proc/driver`` with an ``nvidia/`` level.

Order, chosen to need only what Linux 5.12 offers (``mount_setattr``): the
view is filled while detached, attached, the GPU directories bound into it
(binding into a still-detached tree needs a recent kernel), and only then is
it made read-only. Nobody sees the steps: the container's process has not
started.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from engine.procfs import params_with_device_modification_disabled
from engine.start import syscalls
from engine.start.rootdir import RootDir, describe, read_regular
from engine.start.work import WorkError

__all__ = ["MARKER", "Source", "is_finished", "isolate", "marker_text", "take"]

_SOURCE = "nri-gpu"  # the "device" name of the view's tmpfs, as mountinfo shows it
MARKER = ".nri-gpu-view"  # at the view's root; procfs itself can never hold such a file
_HEADER = b"nri-gpu procfs view 1\n"
_UNFINISHED = _HEADER + b"unfinished\n"
_COPIED = ("version", "registry")
_LIMIT = 1 << 20
_NOFOLLOW = syscalls.RESOLVE_NO_SYMLINKS  # /proc paths: procfs has no plain symlinks on them
_CLONE = syscalls.OPEN_TREE_CLONE | syscalls.OPEN_TREE_CLOEXEC | syscalls.AT_RECURSIVE | syscalls.AT_SYMLINK_NOFOLLOW
_EMPTY_BOTH = syscalls.MOVE_MOUNT_F_EMPTY_PATH | syscalls.MOVE_MOUNT_T_EMPTY_PATH
_LOCKED = (
    syscalls.MOUNT_ATTR_RDONLY | syscalls.MOUNT_ATTR_NOSUID | syscalls.MOUNT_ATTR_NODEV | syscalls.MOUNT_ATTR_NOEXEC
)


@dataclass
class Source:
    """What the view is made of, taken from the source tree before anything hides
    it: the copied files (name -> (content, mode)) and a detached clone of each
    kept ``gpus/<bus>`` directory."""

    files: dict[str, tuple[bytes, int]]
    gpus: dict[str, int]
    from_host: bool

    def close(self) -> None:
        for fd in self.gpus.values():
            os.close(fd)
        self.gpus.clear()


def take(tree: int, bus_ids: tuple[str, ...], *, from_host: bool) -> Source:
    """Read and clone what the view needs from the directory fd ``tree`` (a driver's
    ``/proc/driver/nvidia``). Called in the namespace ``tree`` belongs to: a clone
    of a mount of another namespace is refused by the kernel. Raises ``WorkError``
    naming a bus id the source does not have."""
    files = _read_sources(tree)
    return Source(files=files, gpus=_clone_gpus(tree, bus_ids), from_host=from_host)


def marker_text(bus_ids: tuple[str, ...], from_host: bool) -> bytes:
    """What the marker holds: a second run with the same work keeps the view."""
    return _HEADER + f"source: {'host' if from_host else 'container'}\nbus ids: {' '.join(bus_ids)}\n".encode()


def is_finished(marker: bytes) -> bool:
    """Whether ``marker`` (a marker file's first bytes) is a finished view's: a
    worker killed mid-build leaves the unfinished one."""
    return marker.startswith(_HEADER + b"source: ")


def isolate(root: RootDir, bus_ids: tuple[str, ...], host: Source | None, *, files: RootDir) -> str:
    """Build the view on the container's live tree ``root``; returns "created",
    "kept" (ours, identical, already there) or "skipped" (no driver tree anywhere
    and no GPU to show).

    ``host``: the source taken from a host directory (simulated node), or None to
    take it from the container's own ``/proc/driver/nvidia``. ``files``: the
    ``nodev`` copy of the root (``RootDir.detached_copy``) a marker is read
    through. Raises ``WorkError``.
    """
    marker = marker_text(bus_ids, host is not None)
    old = _existing_view(files)
    if old is not None:
        parent, name, text = old
        if text == marker:
            return "kept"
        _unmount(root, parent, name)  # different work: the source is behind it
    own = root.find_dir("/proc/driver/nvidia", resolve=_NOFOLLOW)
    try:
        if host is not None:
            source = host
        elif own is not None:
            source = take(own, bus_ids, from_host=False)  # before the view hides it
        elif bus_ids:
            raise WorkError("/proc/driver/nvidia: not in the container (is the NVIDIA driver loaded?)")
        else:
            return "skipped"
        try:
            if own is not None:
                _build(root, own, ("/proc/driver", "nvidia"), False, source, marker)
            else:
                target = root.opendir("/proc/driver", resolve=_NOFOLLOW)
                try:
                    _build(root, target, ("/proc", "driver"), True, source, marker)
                finally:
                    os.close(target)
        finally:
            if source is not host:
                source.close()
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
        nvidia = _fill(view, nested, source.files, tuple(source.gpus))
        try:
            syscalls.move_mount(view, "", target, "", _EMPTY_BOTH)
            try:
                for bus, clone in source.gpus.items():
                    mountpoint = os.open(f"gpus/{bus}", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=nvidia)
                    try:
                        syscalls.move_mount(clone, "", mountpoint, "", _EMPTY_BOTH)
                    finally:
                        os.close(mountpoint)
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


def _fill(view: int, nested: bool, files: dict[str, tuple[bytes, int]], bus_ids: tuple[str, ...]) -> int:
    """Write the copied files and the empty GPU directories; the fd of the ``nvidia`` level."""
    # Marked from the start: a worker killed before the end leaves a view whose
    # marker matches no work, so the next run replaces it rather than reading it
    # as the driver's own tree.
    _write(view, MARKER, _UNFINISHED, 0o444)
    nvidia = view
    if nested:
        _mkdir(view, "nvidia")
        nvidia = os.open("nvidia", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=view)
    for name, (data, mode) in files.items():
        _write(nvidia, name, data, mode)
    _mkdir(nvidia, "gpus")
    for bus in bus_ids:
        _mkdir(nvidia, f"gpus/{bus}")
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
