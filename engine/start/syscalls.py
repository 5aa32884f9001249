"""The only module of ``engine.start`` that talks to the kernel through ctypes.

Python 3.11 has no ``os.setns``, ``os.unshare`` or wrappers of the new mount API
(``open_tree``, ``move_mount``, ``fsopen``/``fsconfig``/``fsmount``,
``mount_setattr``) nor of ``openat2``, so they are called here through libc's
``syscall(2)``. Every wrapper raises ``OSError`` with the errno and a short
description of the call (never a bare errno), and returns a plain int.

Everything is bound at import time (libc handle, prototypes): the wrappers run in
a child forked from a multi-threaded process, which must not load libraries or
import modules after the fork.
"""

from __future__ import annotations

import ctypes
import os

__all__ = [
    "AT_EMPTY_PATH",
    "AT_FDCWD",
    "AT_RECURSIVE",
    "CLONE_NEWIPC",
    "CLONE_NEWNET",
    "CLONE_NEWNS",
    "CLONE_NEWPID",
    "CLONE_NEWUTS",
    "FSCONFIG_CMD_CREATE",
    "FSCONFIG_SET_STRING",
    "MNT_DETACH",
    "MOUNT_ATTR_NODEV",
    "MOUNT_ATTR_NOEXEC",
    "MOUNT_ATTR_NOSUID",
    "MOUNT_ATTR_NOSYMFOLLOW",
    "MOUNT_ATTR_RDONLY",
    "MOVE_MOUNT_F_EMPTY_PATH",
    "MOVE_MOUNT_T_EMPTY_PATH",
    "MS_PRIVATE",
    "OPEN_TREE_CLOEXEC",
    "OPEN_TREE_CLONE",
    "RESOLVE_IN_ROOT",
    "RESOLVE_NO_MAGICLINKS",
    "RESOLVE_NO_XDEV",
    "UMOUNT_NOFOLLOW",
    "capbset_drop",
    "capset",
    "fsconfig",
    "fsmount",
    "fsopen",
    "mount_setattr",
    "move_mount",
    "no_new_privs",
    "open_in_root",
    "open_tree",
    "openat2",
    "parent_death_signal",
    "set_dumpable",
    "setns",
    "umount2",
    "unshare",
]

# <linux/sched.h>
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000

# <linux/fcntl.h>, <linux/mount.h>
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x04
MOVE_MOUNT_T_EMPTY_PATH = 0x40
FSOPEN_CLOEXEC = 0x1
FSMOUNT_CLOEXEC = 0x1
FSCONFIG_SET_STRING = 1
FSCONFIG_CMD_CREATE = 6
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8
MOUNT_ATTR_NOSYMFOLLOW = 0x200000
MS_PRIVATE = 1 << 18
MNT_DETACH = 0x2
UMOUNT_NOFOLLOW = 0x8

# <linux/openat2.h>
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_IN_ROOT = 0x10

# <linux/prctl.h>, <linux/capability.h>
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

# The mount-API and openat2 numbers come from the generic table and are the same
# on every architecture Linux added them to after 5.1; capset is per architecture.
_SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {"capset": 126},
    "aarch64": {"capset": 91},
}
_COMMON = {
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "openat2": 437,
    "mount_setattr": 442,
}
_NR = {**_COMMON, **_SYSCALLS.get(os.uname().machine, {})}

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.setns.restype = ctypes.c_int
_libc.unshare.argtypes = [ctypes.c_int]
_libc.unshare.restype = ctypes.c_int
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.umount2.restype = ctypes.c_int
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.prctl.restype = ctypes.c_int


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _number(name: str) -> int:
    number = _NR.get(name)
    if number is None:
        raise OSError(38, f"{name}: no syscall number known for {os.uname().machine}")  # ENOSYS
    return number


def _call(name: str, *args: object) -> int:
    return int(_syscall(ctypes.c_long(_number(name)), *args))


def _path(path: str) -> bytes:
    return os.fsencode(path)


def setns(fd: int, nstype: int) -> None:
    """Join the namespace ``fd`` refers to (a single-threaded caller for mount namespaces)."""
    _check(_libc.setns(fd, nstype), f"setns(nstype={nstype:#x})")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), f"unshare({flags:#x})")


def openat2(dirfd: int, path: str, flags: int, mode: int = 0, resolve: int = 0) -> int:
    """``openat2(2)``: like ``os.open(path, flags, mode, dir_fd=dirfd)`` with ``RESOLVE_*`` rules."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    return _check(
        _call("openat2", ctypes.c_int(dirfd), ctypes.c_char_p(_path(path)), ctypes.byref(how), ctypes.c_size_t(24)),
        f"openat2({path!r})",
    )


def open_in_root(dirfd: int, path: str, flags: int) -> int:
    """``path`` opened as if ``dirfd`` were ``/``: an absolute link starts again at
    ``dirfd``, ``..`` never climbs above it, no magic link (``/proc/self/fd/N``) is
    followed. For a tree whose links are not ours (a container's, the host's)."""
    return openat2(dirfd, path, flags, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)


def open_tree(dirfd: int, path: str, flags: int) -> int:
    """``open_tree(2)``: with ``OPEN_TREE_CLONE`` a detached copy of the mount tree at ``path``."""
    return _check(
        _call("open_tree", ctypes.c_int(dirfd), ctypes.c_char_p(_path(path)), ctypes.c_uint(flags)),
        f"open_tree({path!r})",
    )


def move_mount(from_fd: int, from_path: str, to_fd: int, to_path: str, flags: int) -> None:
    _check(
        _call(
            "move_mount",
            ctypes.c_int(from_fd),
            ctypes.c_char_p(_path(from_path)),
            ctypes.c_int(to_fd),
            ctypes.c_char_p(_path(to_path)),
            ctypes.c_uint(flags),
        ),
        f"move_mount({from_path!r} -> {to_path!r})",
    )


def fsopen(fstype: str) -> int:
    return _check(_call("fsopen", ctypes.c_char_p(_path(fstype)), ctypes.c_uint(FSOPEN_CLOEXEC)), f"fsopen({fstype!r})")


def fsconfig(fd: int, cmd: int, key: str | None = None, value: str | None = None) -> None:
    """``fsconfig(2)``: ``FSCONFIG_SET_STRING`` key=value, or ``FSCONFIG_CMD_CREATE``."""
    _check(
        _call(
            "fsconfig",
            ctypes.c_int(fd),
            ctypes.c_uint(cmd),
            ctypes.c_char_p(None if key is None else _path(key)),
            ctypes.c_char_p(None if value is None else _path(value)),
            ctypes.c_int(0),
        ),
        f"fsconfig({key}={value})" if key else f"fsconfig(cmd={cmd})",
    )


def fsmount(fsfd: int, attr_flags: int) -> int:
    """A detached mount of the superblock created on ``fsfd``, with ``MOUNT_ATTR_*`` flags."""
    return _check(
        _call("fsmount", ctypes.c_int(fsfd), ctypes.c_uint(FSMOUNT_CLOEXEC), ctypes.c_uint(attr_flags)), "fsmount"
    )


def new_tmpfs(options: tuple[tuple[str, str], ...], *, read_only: bool = False) -> int:
    """A detached ``nosuid,nodev,noexec`` tmpfs mount with ``options`` (key, value), as an fd."""
    fs = fsopen("tmpfs")
    try:
        for key, value in options:
            fsconfig(fs, FSCONFIG_SET_STRING, key, value)
        fsconfig(fs, FSCONFIG_CMD_CREATE)
        flags = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC | (MOUNT_ATTR_RDONLY if read_only else 0)
        return fsmount(fs, flags)
    finally:
        os.close(fs)


def mount_setattr(
    dirfd: int, path: str, flags: int, attr_set: int = 0, attr_clr: int = 0, propagation: int = 0
) -> None:
    attr = _MountAttr(attr_set, attr_clr, propagation, 0)
    _check(
        _call(
            "mount_setattr",
            ctypes.c_int(dirfd),
            ctypes.c_char_p(_path(path)),
            ctypes.c_uint(flags),
            ctypes.byref(attr),
            ctypes.c_size_t(ctypes.sizeof(attr)),
        ),
        "mount_setattr",
    )


def umount2(name: str, flags: int) -> None:
    """``umount2`` of ``name`` relative to the cwd: callers ``fchdir`` to a checked directory first."""
    _check(_libc.umount2(_path(name), flags), f"umount2({name!r})")


def parent_death_signal(sig: int) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies (survives execve)."""
    _check(_libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def set_dumpable(dumpable: bool) -> None:
    """``prctl(PR_SET_DUMPABLE)``: a non-dumpable process cannot be ptraced (nor its
    ``/proc/<pid>`` files read) by others of its uid. ``execve`` sets it again,
    to dumpable for a binary its uid may read."""
    _check(_libc.prctl(_PR_SET_DUMPABLE, int(dumpable), 0, 0, 0), "prctl(PR_SET_DUMPABLE)")


def no_new_privs() -> None:
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def capbset_drop(cap: int) -> bool:
    """Drop ``cap`` from the bounding set; False when the kernel does not know ``cap`` (past the last one)."""
    if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) < 0:
        err = ctypes.get_errno()
        if err == 22:  # EINVAL: no such capability
            return False
        raise OSError(err, f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(err)}")
    return True


def capset(keep: frozenset[int]) -> None:
    """Set this thread's effective, permitted and inheritable sets to exactly ``keep``."""
    mask = 0
    for cap in keep:
        mask |= 1 << cap
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    for i in range(2):
        word = (mask >> (32 * i)) & 0xFFFFFFFF
        data[i].effective, data[i].permitted, data[i].inheritable = word, word, 0
    _check(_call("capset", ctypes.byref(header), ctypes.byref(data)), "capset")
