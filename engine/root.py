"""Read-only access to a directory tree that stands for a node's ``/``: the one place
in the engine that reads files.

A ``Root`` maps *node paths* (``/usr/lib/x86_64-linux-gnu/libcuda.so.1``) to the
files under its directory, and resolves symbolic links the way the kernel would
if that directory were ``/`` (a chroot): absolute targets restart at the root,
``..`` never climbs above it. That keeps every answer inside the tree, which
matters when the tree is a driver container's filesystem (``/run/nvidia/driver``)
rather than the host's own ``/``.

Tests point roots at fixture trees; nothing in the engine opens a path any other
way.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat

from nri_gpu.engine.config import is_clean_absolute
from nri_gpu.engine.errors import DiscoveryError
from nri_gpu.engine.model import EntryType

_MAX_LINKS = 40  # the kernel's own limit on links followed in one lookup
_MAX_READ = 16 * 1024 * 1024  # no file the engine reads is near this; a guard against /dev/zero-like surprises
_O_WALK = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC  # O_PATH opens no device or FIFO; a link gives the link
_FORMAT = {EntryType.SOCKET: stat.S_IFSOCK, EntryType.DIRECTORY: stat.S_IFDIR}
_TYPE_NAMES = {
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFREG: "a regular file",
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


class Root:
    """A directory tree read as if it were ``/``."""

    def __init__(self, path: str) -> None:
        if not path.startswith("/"):
            raise DiscoveryError(f"root {path!r} must be an absolute path")
        self.path = posixpath.normpath(path) if path != "/" else "/"

    def __repr__(self) -> str:
        return f"Root({self.path!r})"

    def host_path(self, node_path: str) -> str:
        """Where ``node_path`` lies on the host, without resolving links."""
        clean = posixpath.normpath("/" + node_path.lstrip("/"))
        return clean if self.path == "/" else self.path + (clean if clean != "/" else "")

    def resolve(self, node_path: str) -> str:
        """The node path ``node_path`` leads to after following every link inside the root.

        The answer is always a clean absolute path inside the root (no ``.``, ``..``
        or empty component). Raises DiscoveryError on a link loop. A missing
        component ends link resolution there; the remaining components are taken as
        written, ``..`` still never above the root.
        """
        parts = [p for p in node_path.split("/") if p and p != "."]
        done: list[str] = []
        hops = 0
        missing = False
        while parts:
            part = parts.pop(0)
            if part == "..":
                if done:
                    done.pop()
                continue
            if missing:
                done.append(part)
                continue
            candidate = "/" + "/".join([*done, part])
            try:
                target = os.readlink(self.host_path(candidate))
            except OSError as exc:
                done.append(part)
                # Missing or unreadable: no link left to follow, but the rest still goes
                # through the same rules. Appended raw, a ".." would survive into a mount
                # source, and runc would walk it up out of the driver root.
                missing = exc.errno != errno.EINVAL  # EINVAL: there, and not a link
                continue
            hops += 1
            if hops > _MAX_LINKS:
                raise DiscoveryError(f"too many levels of symbolic links resolving {node_path!r} in {self.path}")
            if target.startswith("/"):
                done = []
            parts = [p for p in target.split("/") if p and p != "."] + parts
        return "/" + "/".join(done)

    def lstat(self, node_path: str) -> os.stat_result | None:
        try:
            return os.lstat(self.host_path(node_path))
        except OSError:
            return None

    def stat(self, node_path: str) -> os.stat_result | None:
        """stat() of what ``node_path`` resolves to inside the root; None if missing."""
        return self.lstat(self.resolve(node_path))

    def exists(self, node_path: str) -> bool:
        return self.stat(node_path) is not None

    def is_file(self, node_path: str) -> bool:
        st = self.stat(node_path)
        return st is not None and stat.S_ISREG(st.st_mode)

    def is_dir(self, node_path: str) -> bool:
        st = self.stat(node_path)
        return st is not None and stat.S_ISDIR(st.st_mode)

    def read_bytes(self, node_path: str, limit: int = _MAX_READ) -> bytes:
        """Contents of a file (links resolved inside the root). Raises DiscoveryError."""
        real = self.resolve(node_path)
        try:
            with open(self.host_path(real), "rb") as f:
                data = f.read(limit + 1)
        except OSError as exc:
            raise DiscoveryError(f"cannot read {node_path} under {self.path}: {exc.strerror}") from exc
        if len(data) > limit:
            raise DiscoveryError(f"{node_path} under {self.path} is larger than {limit} bytes")
        return data

    def read_text(self, node_path: str, limit: int = _MAX_READ) -> str:
        return self.read_bytes(node_path, limit).decode("utf-8", errors="replace")

    def listdir(self, node_path: str) -> list[str]:
        """Sorted entry names of a directory; [] if it does not exist."""
        try:
            return sorted(os.listdir(self.host_path(self.resolve(node_path))))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise DiscoveryError(f"cannot list {node_path} under {self.path}: {exc.strerror}") from exc

    def root_only_stat(self, node_path: str, expected: EntryType) -> os.stat_result | None:
        """The ``fstat`` of ``node_path`` if it is, without following any link, an
        ``expected`` entry that only root can change; None if it is absent;
        DiscoveryError, naming the component and why, if it is there but not safe to
        hand to a container. The inode is the one the walk held, so a caller can
        compare it with what a bind mount of the path gave a container.

        The runtime binds the path again, following links, at every container start,
        so a check of what it points to now is worth nothing unless no one but root
        can change it later; and once root removes it (a daemon stops, a reboot),
        anyone may create it again, so it is checked again at every CreateContainer
        and compared with the container's mount at its start. Hence, from the root
        down: no component is a link (each is opened ``O_PATH|O_NOFOLLOW`` relative
        to the one before, and that very inode is checked: nothing can be swapped in
        between), every folder is root's and writable by no one else, unless it is
        sticky like ``/tmp`` (there only an entry's owner can move it, and the next
        component must be root's and no mount point: anyone may mount a FUSE file
        system on a folder of theirs there, and its root then reports any owner),
        and the entry itself is of the expected type and root's; a directory entry
        is writable by no one else either (its contents reach every container).
        """
        if node_path == "/" or not is_clean_absolute(node_path):
            raise DiscoveryError(f"{node_path!r} is not a clean absolute path")
        parts = node_path.split("/")[1:]
        try:
            fd = os.open(self.path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise DiscoveryError(f"{self.path}: {exc.strerror}") from exc
        try:
            parent = os.fstat(fd)
            _check_folder(self.path, parent, sticky_ok=True)
            for depth, name in enumerate(parts, 1):
                shown = self.host_path("/".join(parts[:depth]))
                in_sticky = bool(parent.st_mode & stat.S_ISVTX)
                try:
                    child = _open_in_sticky(fd, name) if in_sticky else os.open(name, _O_WALK, dir_fd=fd)
                except FileNotFoundError:
                    return None
                except OSError as exc:
                    if exc.errno == errno.EXDEV:
                        raise DiscoveryError(_MOUNT_IN_STICKY.format(shown)) from exc
                    raise DiscoveryError(f"{shown}: {exc.strerror}") from exc
                os.close(fd)
                fd = child
                last = depth == len(parts)
                st = os.fstat(fd)
                want = _FORMAT[expected] if last else stat.S_IFDIR
                if stat.S_IFMT(st.st_mode) != want:
                    got = _TYPE_NAMES.get(stat.S_IFMT(st.st_mode), "of an unknown type")
                    if stat.S_ISLNK(st.st_mode):
                        raise DiscoveryError(f"{shown} is a symbolic link (links are never followed here)")
                    raise DiscoveryError(f"{shown} is {got}, not {_TYPE_NAMES[want]}")
                if in_sticky and st.st_dev != parent.st_dev:  # kept: the open above is what holds
                    raise DiscoveryError(_MOUNT_IN_STICKY.format(shown))
                if stat.S_ISDIR(st.st_mode):
                    _check_folder(shown, st, sticky_ok=not last)
                elif st.st_uid != 0:
                    raise DiscoveryError(f"{shown} is owned by uid {st.st_uid}, not root")
                parent = st
            return parent
        finally:
            os.close(fd)


_MOUNT_IN_STICKY = "{} is a mount point in a sticky folder (its owner and mode are the mount's word)"


def _open_in_sticky(dirfd: int, name: str) -> int:
    """``name`` in a sticky folder like ``/tmp``, refused (EXDEV) if it is a mount point.

    Anyone may mount a FUSE file system on a folder of theirs there; its root shows
    whatever owner and mode its daemon likes, and an ``fstat`` of it waits on that
    daemon (FUSE_GETATTR), on the event loop at every CreateContainer. Refusing the
    crossing in the lookup itself never asks the mounted file system anything.
    """
    # Imported here: engine.start imports this module (a top-level import would be
    # circular). The module is loaded by then in every process that gets here.
    from nri_gpu.engine.start import syscalls

    return syscalls.openat2(dirfd, name, _O_WALK, 0, syscalls.RESOLVE_NO_XDEV | syscalls.RESOLVE_NO_SYMLINKS)


def _check_folder(shown: str, st: os.stat_result, *, sticky_ok: bool) -> None:
    if st.st_uid != 0:
        raise DiscoveryError(f"{shown} is owned by uid {st.st_uid}, not root")
    if st.st_mode & 0o022 and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        raise DiscoveryError(f"{shown} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})")
