"""The node's ``/`` as ``nri-gpu node-setup`` sees it from its container (``--host-root``).

The host's files are not ours: any link in them may point anywhere, and a name
looked up twice may be something else the second time. So every path of the
node is looked up once, relative to one descriptor of the host root, with
``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)``: an absolute link target
starts again at the host root and ``..`` never climbs above it, as if the
process were chrooted there. What is found is then used through its descriptor:
a folder's descriptor is what ``nri_gpu.plugin.cli.config_files.Folder`` writes in, a
socket's is what ``connect(2)`` reaches (through ``/proc/self/fd/N``).

A binary of the node that ``node-setup`` runs (the host's ``systemctl``) must be
root's alone: every component from the host root down is root's, no link and
not writable by group or others, so no one but root can change what runs with
our privileges between the check and the ``exec``.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from types import TracebackType

from nri_gpu.engine import open_in_root

__all__ = ["NodeRoot", "NodeRootError", "relative"]

_WALK = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC  # O_PATH opens no device or FIFO; a link gives the link


class NodeRootError(Exception):
    """A node path is missing or not what node-setup may use; the message names it."""


def relative(node_path: str) -> str:
    """``/etc/containerd`` -> ``etc/containerd``: the lookup is relative to the root's
    descriptor. Raises NodeRootError for a path that is not absolute."""
    if not node_path.startswith("/") or "\0" in node_path:
        raise NodeRootError(f"{node_path!r} is not an absolute path")
    return node_path.lstrip("/") or "."


class NodeRoot:
    """The host's ``/`` mounted at ``path`` (``with NodeRoot("/host") as root``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def __enter__(self) -> NodeRoot:
        try:
            self._fd = os.open(self.path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise NodeRootError(f"host root {self.path}: {exc.strerror}") from exc
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def fd(self) -> int:
        if self._fd is None:
            raise NodeRootError("the host root is not open")
        return self._fd

    def open(self, node_path: str, flags: int = os.O_PATH) -> int:
        """A descriptor of ``node_path``, links followed inside the root only. The caller
        closes it. Raises FileNotFoundError when it is not there, NodeRootError otherwise."""
        try:
            return open_in_root(self.fd, relative(node_path), flags | os.O_CLOEXEC)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise NodeRootError(f"{node_path} (under {self.path}): {exc.strerror}") from exc

    def open_folder(self, node_path: str) -> int:
        """A descriptor of the folder ``node_path``. Raises NodeRootError, naming it, when
        it is missing or not a folder."""
        try:
            return self.open(node_path, os.O_PATH | os.O_DIRECTORY)
        except FileNotFoundError as exc:
            raise NodeRootError(f"{node_path} (under {self.path}): no such folder") from exc

    def connect(self, node_path: str, timeout: float) -> socket.socket:
        """A stream socket connected to the Unix socket ``node_path``. Raises
        FileNotFoundError when nothing is there, ConnectionRefusedError when a socket
        file is there and nobody listens, TimeoutError when its backlog stays full,
        NodeRootError when it is not a socket or refuses us otherwise."""
        fd = self.open(node_path)
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                raise NodeRootError(f"{node_path} (under {self.path}) is not a socket")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            try:
                # The inode just checked: connect(2) follows the descriptor's magic link
                # to it, never the node path again.
                sock.connect(f"/proc/self/fd/{fd}")
            except (FileNotFoundError, ConnectionRefusedError, TimeoutError):
                sock.close()
                raise
            except OSError as exc:
                sock.close()
                raise NodeRootError(f"{node_path} (under {self.path}): connect: {exc.strerror}") from exc
            except BaseException:
                sock.close()
                raise
            return sock
        finally:
            os.close(fd)

    def check_root_only(self, node_path: str) -> os.stat_result:
        """The ``fstat`` of the executable ``node_path`` when it and every folder above
        it, from the host root down, is root's, no link and not writable by group or
        others. Raises NodeRootError naming the component and why."""
        parts = relative(node_path).split("/")
        fd = os.open(".", _WALK | os.O_DIRECTORY, dir_fd=self.fd)
        try:
            info = os.fstat(fd)
            _check(self.path, info, folder=True)
            for depth, name in enumerate(parts, 1):
                shown = "/" + "/".join(parts[:depth])
                if name in ("", ".", ".."):
                    raise NodeRootError(f"{node_path!r} is not a clean path")
                try:
                    child = os.open(name, _WALK, dir_fd=fd)
                except OSError as exc:
                    why = "no such file" if exc.errno == errno.ENOENT else exc.strerror
                    raise NodeRootError(f"{shown} (under {self.path}): {why}") from exc
                os.close(fd)
                fd = child
                info = os.fstat(fd)
                if stat.S_ISLNK(info.st_mode):
                    raise NodeRootError(f"{shown} (under {self.path}) is a symbolic link; links are not followed here")
                last = depth == len(parts)
                _check(f"{shown} (under {self.path})", info, folder=not last)
            if not stat.S_ISREG(info.st_mode) or not info.st_mode & 0o100:
                raise NodeRootError(f"{node_path} (under {self.path}) is not an executable regular file")
            return info
        finally:
            os.close(fd)


def _check(shown: str, info: os.stat_result, *, folder: bool) -> None:
    if folder and not stat.S_ISDIR(info.st_mode):
        raise NodeRootError(f"{shown} is not a folder")
    if info.st_uid != 0:
        raise NodeRootError(f"{shown} is owned by uid {info.st_uid}, not root")
    if info.st_mode & 0o022:
        raise NodeRootError(f"{shown} is writable by group or others (mode {stat.S_IMODE(info.st_mode):04o})")
