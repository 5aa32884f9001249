"""The files ``nri-gpu install`` reads and writes beside a runtime's config, by descriptor.

``install`` and ``uninstall`` run as root in folders such as ``/etc/containerd``.
If anyone else can write such a folder (a mistake, but one that must not give
them more), every name in it is theirs to swap between two of our calls. So:

* a file is looked up once, as an ``O_PATH`` handle that follows no link and
  opens nothing (no device node's or FIFO's open runs), and must be a regular
  file: its ``fstat`` is the one every later decision uses (its mode and owner
  included), and only that inode is then opened for reading, through the handle;
* a file is written as a new temporary file in the same folder (``O_EXCL``, so
  never someone else's), given its mode and owner through its descriptor, and
  renamed over the name; the name is then checked to be that file;
* every name is looked up relative to one descriptor of the folder.

A link where a regular file is expected is refused, never followed or replaced:
a ``config.toml`` that is a link to the real file stays one.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from types import TracebackType

__all__ = ["FileRefused", "Folder"]

_LIMIT = 16 << 20  # a runtime's config is a few KiB


class FileRefused(Exception):
    """A file is not what nri-gpu may read or replace; the message names it and why."""


class Folder:
    """The folder of ``path``'s files, held open (``with Folder(...) as folder``).

    A folder that does not exist reads as empty, and is created (mode 0755,
    with its parents) by the first write when ``create`` is set. With ``at``, a
    descriptor of the folder already looked up (``nri-gpu node-setup`` resolves it
    inside the host's root), that folder is used and ``path`` only names it."""

    def __init__(self, path: Path, *, create: bool = False, at: int | None = None) -> None:
        self.path = path
        self._create = create
        self._at = at
        self._fd: int | None = None

    def __enter__(self) -> Folder:
        try:
            if self._at is not None:
                self._fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self._at)
                return self
            self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            self._fd = None
        except OSError as exc:
            raise FileRefused(f"{self.path}: cannot open the folder: {exc.strerror}") from exc
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read(self, name: str, *, if_link: str) -> tuple[bytes, os.stat_result] | None:
        """The bytes and the ``fstat`` of the regular file ``name``; None if there is
        none. A link is refused, with ``if_link`` (what to do about it) in the message."""
        if self._fd is None:
            return None
        shown = self.path / name
        try:
            handle = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise FileRefused(f"{shown}: cannot read: {exc.strerror}") from exc
        try:
            info = os.fstat(handle)
            if stat.S_ISLNK(info.st_mode):
                raise FileRefused(f"{shown} is a symbolic link (to {self._target(name)}); {if_link}")
            if not stat.S_ISREG(info.st_mode):
                raise FileRefused(f"{shown} is not a regular file")
            # The inode just checked, opened again through its handle: a name looked up
            # a second time could be a device node by then.
            fd = os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as exc:
            raise FileRefused(f"{shown}: cannot read: {exc.strerror}") from exc
        finally:
            os.close(handle)
        try:
            if info.st_size > _LIMIT:
                raise FileRefused(f"{shown} is over {_LIMIT} bytes")
            chunks, size = [], 0
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
                size += len(chunk)
                if size > _LIMIT:
                    raise FileRefused(f"{shown} is over {_LIMIT} bytes")
            return b"".join(chunks), info
        except OSError as exc:
            raise FileRefused(f"{shown}: cannot read: {exc.strerror}") from exc
        finally:
            os.close(fd)

    def _target(self, name: str) -> str:
        try:
            return os.readlink(name, dir_fd=self._fd)
        except OSError:
            return "?"

    def write(self, name: str, data: bytes, like: os.stat_result | None = None) -> None:
        """Replace ``name`` with ``data`` atomically, with ``like``'s mode and owner
        (0644 and ours when None). Raises FileRefused when the name turns out not
        to be our file after the rename (someone else writes this folder), OSError."""
        dirfd = self._open_for_writing()
        temp = f".{name}.{secrets.token_hex(8)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, 0o600, dir_fd=dirfd)
        renamed = False
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if like is not None:
                try:
                    os.fchown(fd, like.st_uid, like.st_gid)  # before the mode: chown clears set-id bits
                except PermissionError:
                    pass  # not root: the file stays ours
            os.fchmod(fd, 0o644 if like is None else stat.S_IMODE(like.st_mode))
            os.fsync(fd)
            swapped = FileRefused(
                f"{self.path / name} was replaced while nri-gpu wrote it: someone else can write {self.path}"
            )
            try:
                os.rename(temp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
                renamed = True
                placed = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            except FileNotFoundError as exc:
                raise swapped from exc
            mine = os.fstat(fd)
            if (placed.st_dev, placed.st_ino) != (mine.st_dev, mine.st_ino):
                raise swapped
            os.fsync(dirfd)
        except BaseException:
            if not renamed:
                self._unlink_quietly(temp)
            raise
        finally:
            os.close(fd)

    def remove(self, name: str) -> None:
        """Remove ``name`` (a link itself, never what it points to), if it exists."""
        if self._fd is not None:
            self._unlink_quietly(name)

    def _unlink_quietly(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self._fd)
        except FileNotFoundError:
            pass

    def _open_for_writing(self) -> int:
        if self._fd is None:
            if not self._create:
                raise FileRefused(f"{self.path}: no such folder")
            os.makedirs(self.path, mode=0o755, exist_ok=True)
            self.__enter__()
            assert self._fd is not None
        return self._fd
