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

Its source (the driver's files, GPU directories and capability files) comes
from a ``procsource.ProcSource``: the container's own tree on a real node, a
host directory on a simulated one.

Order, chosen to need only what Linux 5.12 offers (``mount_setattr``): the
view is filled while detached (files, folders, empty mount points), attached,
the GPU directories and capability files bound into it (binding into a
still-detached tree needs a recent kernel), and only then is it made read-only,
binds included. Nobody sees the steps: the container's process has not
started. The marker names the GPUs and the capabilities shown: a second start
with the same work keeps the view, one with other work replaces it.
"""

from __future__ import annotations

import os

from nri_gpu.engine.start import syscalls
from nri_gpu.engine.start.procsource import CAPS, ProcSource, Source
from nri_gpu.engine.start.rootdir import RootDir, describe
from nri_gpu.engine.start.work import WorkError

__all__ = ["MARKER", "is_finished", "isolate", "marker_text"]

_SOURCE = "nri-gpu"  # the "device" name of the view's tmpfs, as mountinfo shows it
MARKER = ".nri-gpu-view"  # at the view's root; procfs itself can never hold such a file
_HEADER = b"nri-gpu procfs view 1\n"
_UNFINISHED = _HEADER + b"unfinished\n"
_NOFOLLOW = syscalls.RESOLVE_NO_SYMLINKS  # /proc paths: procfs has no plain symlinks on them
_EMPTY_BOTH = syscalls.MOVE_MOUNT_F_EMPTY_PATH | syscalls.MOVE_MOUNT_T_EMPTY_PATH
_LOCKED = (
    syscalls.MOUNT_ATTR_RDONLY | syscalls.MOUNT_ATTR_NOSUID | syscalls.MOUNT_ATTR_NODEV | syscalls.MOUNT_ATTR_NOEXEC
)


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

    ``source``: where the view comes from (``procsource.source_for``; for a host directory,
    ``take_outside`` was called with the same ``bus_ids``, ``caps`` and
    ``caps_all``). ``files``: the ``nodev`` copy of the root
    (``RootDir.detached_copy``) a marker is read through. ``caps``,
    ``caps_all``: the MIG capabilities shown (``procsource.take``). Raises ``WorkError``.
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
                    _bind(clone, nvidia, f"{CAPS}/{cap}", 0)
                if source.caps_all is not None:
                    _bind(source.caps_all, nvidia, CAPS, os.O_DIRECTORY)
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
        _mkdir(nvidia, CAPS)
    made = {CAPS}
    for cap in source.caps:
        folders = cap.split("/")[:-1]
        for depth in range(1, len(folders) + 1):
            folder = "/".join((CAPS, *folders[:depth]))
            if folder not in made:
                _mkdir(nvidia, folder)
                made.add(folder)
        _write(nvidia, f"{CAPS}/{cap}", b"", 0o444)
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
