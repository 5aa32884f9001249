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

from engine.errors import DiscoveryError

_MAX_LINKS = 40  # the kernel's own limit on links followed in one lookup
_MAX_READ = 16 * 1024 * 1024  # no file the engine reads is near this; a guard against /dev/zero-like surprises


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

        Raises DiscoveryError on a link loop. A missing component ends resolution
        there (the remaining components are appended as they are).
        """
        parts = [p for p in node_path.split("/") if p and p != "."]
        done: list[str] = []
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == "..":
                if done:
                    done.pop()
                continue
            candidate = "/" + "/".join([*done, part])
            try:
                target = os.readlink(self.host_path(candidate))
            except OSError as exc:
                if exc.errno == errno.EINVAL:  # not a link
                    done.append(part)
                    continue
                # Missing or unreadable: nothing more to resolve.
                done.append(part)
                done.extend(p for p in parts if p and p != ".")
                break
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

    def is_socket(self, node_path: str) -> bool:
        st = self.stat(node_path)
        return st is not None and stat.S_ISSOCK(st.st_mode)

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
