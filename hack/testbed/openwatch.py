"""inotify ``IN_OPEN`` watches: proof that nothing of ours opened a planted file.

Every *successful* open of the watched inode is an event, a device node's or a
FIFO's included; an ``O_PATH`` open is not (it reaches no driver), nor an open of
what later replaces the name. On a directory, opens of its entries are events,
named. Python has no inotify binding, hence ctypes.
"""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

__all__ = ["OpenWatch"]

_IN_OPEN = 0x20
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


class OpenWatch:
    """An ``IN_OPEN`` watch on ``path`` (a file, or a directory's entries)."""

    def __init__(self, path: Path | str) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if libc.inotify_add_watch(self.fd, os.fsencode(path), _IN_OPEN) < 0:
            err = ctypes.get_errno()
            os.close(self.fd)
            raise OSError(err, f"inotify_add_watch({path})")

    def opened(self) -> list[str]:
        """A name per open since the last call ('' for the watched file itself)."""
        names: list[str] = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return names
            at = 0
            while at < len(data):
                _, mask, _, size = _EVENT.unpack_from(data, at)
                if mask & _IN_OPEN:
                    names.append(data[at + _EVENT.size : at + _EVENT.size + size].rstrip(b"\0").decode())
                at += _EVENT.size + size

    def opens(self) -> int:
        """How many opens since the last call."""
        return len(self.opened())

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> OpenWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
