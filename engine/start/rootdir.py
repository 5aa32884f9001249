"""The container's root as a directory fd, and every path resolved against it.

After ``setns`` into the container's mount namespace, ``/`` is the container's
root, but a path string handed to ``open`` would still follow whatever the image
put on the way: an absolute symlink, ``..``, or a procfs magic link such as
``/proc/1/root`` that leads back out to the host. So every path inside the
container is resolved here with ``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)``
from the root fd: symlinks are followed *as the container would see them*
(absolute ones restart at the container's root, ``..`` stops there) and magic
links are refused. Final components are then handled with the ``*at`` calls
relative to a resolved directory fd, with no-follow flags, so the last
component is never followed either.

The steps that read and write files do it through ``RootDir.detached_copy``: a
detached clone of the container's mount tree (``open_tree``) that is
``nodev,nosuid`` throughout and writable at its top. A device node the image
or a volume holds cannot be opened through it at all (``EACCES``), whatever
swaps a sidecar makes between a check and an open; the container's own mounts
keep their flags (a read-only root stays read-only, even if the worker is
killed halfway); and the clone goes away with the worker's last reference to
it. Every open is one ``openat2`` with ``O_NONBLOCK | O_NOCTTY`` (a FIFO opened
that way for reading never waits), then ``fstat`` decides.
"""

from __future__ import annotations

import errno
import os
import stat

from nri_gpu.engine.start import syscalls
from nri_gpu.engine.start.work import WorkError

__all__ = ["IN_ROOT", "READ", "WRITE", "OverLimit", "RootDir", "describe", "read_regular", "split", "write_atomically"]

IN_ROOT = syscalls.RESOLVE_IN_ROOT | syscalls.RESOLVE_NO_MAGICLINKS
# For a directory written into: stay on the container's root file system. A link
# (or a path) into a volume or a host bind mount is refused, because there the
# plugin's rights are not the container's: a root-owned host folder mounted for
# a non-root container must not get files from us that its user could not make.
WRITE = syscalls.RESOLVE_NO_XDEV
# For a file read: the same. A cache or a conf file reached through a volume is
# another container's (or the node's) and counts as absent.
READ = syscalls.RESOLVE_NO_XDEV
_DIR = os.O_PATH | os.O_DIRECTORY
_CLONE = syscalls.OPEN_TREE_CLONE | syscalls.OPEN_TREE_CLOEXEC | syscalls.AT_RECURSIVE | syscalls.AT_EMPTY_PATH


class OverLimit(WorkError):
    """A file bigger than its reader's limit (the message names both)."""


def describe(exc: OSError, path: str) -> str:
    """A reader's sentence for ``exc`` on the container path ``path``."""
    code = exc.errno
    if code == errno.ELOOP:
        # O_NOFOLLOW and RESOLVE_NO_SYMLINKS/NO_MAGICLINKS all answer ELOOP.
        return (
            f"{path}: refused: its resolution meets a link not followed here (a symlink, a /proc magic link or a loop)"
        )
    if code == errno.EXDEV:
        return (
            f"{path}: refused: it leads out of the container's root file system "
            "(into a volume or another mount), where the plugin's rights are not the container's"
        )
    if code == errno.ENOTDIR:
        return f"{path}: a path component is not a directory"
    if code == errno.EROFS:
        return f"{path}: read-only file system"
    return f"{path}: {os.strerror(code) if code else exc}"


def split(path: str) -> tuple[str, str]:
    """``/a/b/c`` -> (``/a/b``, ``c``) for a clean absolute path with a final name."""
    parent, _, name = path.rpartition("/")
    if not name or name in (".", ".."):
        raise WorkError(f"{path!r} has no final file name")
    return parent or "/", name


class RootDir:
    """The container's root directory; owns ``fd`` (an ``O_PATH`` directory)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def current(cls) -> RootDir:
        """This process's ``/``: the container's root once ``setns`` entered it."""
        return cls(os.open("/", _DIR | os.O_CLOEXEC))

    def close(self) -> None:
        os.close(self.fd)

    def detached_copy(self) -> RootDir:
        """A detached clone of the mount tree at this root: ``nodev,nosuid`` on every
        mount, writable at the top mount only (the container's root file system;
        a read-only volume or library bind mount stays read-only). Nothing of the
        container's own mounts changes. Raises ``WorkError``.
        """
        try:
            fd = syscalls.open_tree(self.fd, "", _CLONE)
        except OSError as exc:
            raise WorkError(describe(exc, "/") + " (cloning the container's mounts)") from exc
        try:
            flags = syscalls.AT_EMPTY_PATH
            safe = syscalls.MOUNT_ATTR_NODEV | syscalls.MOUNT_ATTR_NOSUID
            # Private: a clone of a shared mount would otherwise join its peer group.
            syscalls.mount_setattr(
                fd, "", flags | syscalls.AT_RECURSIVE, attr_set=safe, propagation=syscalls.MS_PRIVATE
            )
            # A file system read-only itself (an erofs image) stays so: a write
            # then fails naming its path, and work that writes nothing still runs.
            syscalls.mount_setattr(fd, "", flags, attr_clr=syscalls.MOUNT_ATTR_RDONLY)
        except OSError as exc:
            os.close(fd)
            raise WorkError(describe(exc, "/") + " (setting up the writable copy of the root)") from exc
        except BaseException:
            os.close(fd)
            raise
        return RootDir(fd)

    def open(self, path: str, flags: int, mode: int = 0, *, resolve: int = 0) -> int:
        """An fd for ``path`` resolved in the root; raises ``OSError`` (callers explain it)."""
        return syscalls.openat2(self.fd, path, flags, mode, IN_ROOT | resolve)

    def opendir(self, path: str, *, resolve: int = 0) -> int:
        """An ``O_PATH`` fd of the directory at ``path``; ``WorkError`` if there is none."""
        try:
            return self.open(path, _DIR, resolve=resolve)
        except OSError as exc:
            raise WorkError(describe(exc, path)) from exc

    def find_dir(self, path: str, *, resolve: int = 0) -> int | None:
        """Like ``opendir``, None when ``path`` does not exist."""
        try:
            return self.open(path, _DIR, resolve=resolve)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise WorkError(describe(exc, path)) from exc

    def makedirs(self, path: str, mode: int = 0o755, *, resolve: int = WRITE) -> int:
        """``mkdir -p`` inside the root; an ``O_PATH`` fd of the directory, by default
        on the root file system only (``WRITE``): it is for writing into.

        Each prefix is resolved from the root again, so a symlink on the way is
        followed the way the container will follow it; a symlink that points
        nowhere is an error (creating its target would mean guessing).
        """
        fd = os.dup(self.fd)
        prefix = ""
        for name in (p for p in path.split("/") if p):
            prefix += "/" + name
            try:
                found = self.find_dir(prefix, resolve=resolve)
                if found is None:
                    try:
                        os.mkdir(name, mode, dir_fd=fd)
                    except FileExistsError:
                        pass  # a dangling link (reported below) or a racing mkdir
                    except OSError as exc:
                        raise WorkError(describe(exc, prefix)) from exc
                    found = self.find_dir(prefix, resolve=resolve)
                    if found is None:
                        raise WorkError(f"{prefix}: a symlink to nowhere in the container is in the way")
            finally:
                os.close(fd)
            fd = found
        return fd

    def read_small(self, path: str, limit: int, *, resolve: int = READ) -> bytes | None:
        """Contents of the regular file at ``path`` (links followed in the root, by
        default on the root file system only), None if it does not exist or lies
        across a mount; ``WorkError`` if it is no regular file or over ``limit``.

        One open, then ``fstat``: a type checked by a separate lookup first could be
        swapped (by a sidecar on a shared volume) before the open. The open cannot
        block (``O_NONBLOCK``: a FIFO without a writer) and cannot reach a device
        through a ``nodev`` root (``detached_copy``)."""
        try:
            fd = self.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY, resolve=resolve)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.EXDEV and resolve & syscalls.RESOLVE_NO_XDEV:
                return None
            raise WorkError(describe(exc, path)) from exc
        try:
            return read_regular(fd, path, limit)
        finally:
            os.close(fd)


def read_regular(fd: int, what: str, limit: int) -> bytes:
    """All of the regular file ``fd``, refusing FIFOs, devices and oversized files
    (by their size before reading, and by what a read returns)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise WorkError(f"{what}: not a regular file")
    if info.st_size > limit:
        raise OverLimit(f"{what}: {info.st_size} bytes, over the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = os.read(fd, min(1 << 20, limit + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise OverLimit(f"{what}: more than {limit} bytes, over the limit of {limit} bytes")


def write_atomically(dirfd: int, name: str, data: bytes, mode: int, *, what: str) -> None:
    """Replace ``name`` in ``dirfd`` with a file holding ``data``: a temporary
    created with ``O_EXCL | O_NOFOLLOW`` (never written through a planted link),
    then renamed over the name (which replaces a link rather than following it)."""
    tmp = f".{name}.nri-gpu-tmp"
    try:
        try:
            os.unlink(tmp, dir_fd=dirfd)
        except FileNotFoundError:
            pass
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
        fd = os.open(tmp, flags, mode, dir_fd=dirfd)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)  # the umask does not decide what the container gets
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
    except OSError as exc:
        raise WorkError(describe(exc, what)) from exc


def current_bytes(dirfd: int, name: str, limit: int = 1 << 16) -> bytes | None:
    """What the regular file ``name`` in ``dirfd`` holds, or None (missing, a link,
    a device, a FIFO, over ``limit``: each is replaced by ``write_file``). One open
    with ``O_NOFOLLOW | O_NONBLOCK``, then ``fstat``: through the nodev copy of the
    root a device cannot be opened, and a FIFO does not make it wait."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dirfd)
    except OSError:
        return None
    try:
        return read_regular(fd, name, limit)
    except WorkError:
        return None
    finally:
        os.close(fd)


def write_file(root: RootDir, path: str, data: bytes, mode: int = 0o644) -> bool:
    """``path`` in the container's root holding ``data``: its folder made inside the
    root, the file replaced atomically (``write_atomically``) unless it already
    holds exactly that; True when written."""
    parent, name = split(path)
    folder = root.makedirs(parent)
    try:
        if current_bytes(folder, name) == data:
            return False
        write_atomically(folder, name, data, mode, what=path)
        return True
    finally:
        os.close(folder)
