"""A child process's pipes read until they close, within a deadline: the engine's
one poll loop (the NVML probe's output, the confined ldconfig's).

A child that never closes its pipes, or writes without end, must cost the caller
no more than its deadline and a bounded buffer: ``communicate`` would wait for
EOF and keep everything. The caller decides what to keep of each chunk and when
enough is enough (``take`` returns False: stop reading, the caller kills the
child). Imported before the start work's worker forks, which may load no
module afterwards.
"""

from __future__ import annotations

import enum
import os
import select
import time
from collections.abc import Callable, Sequence

__all__ = ["Drained", "drain"]

_CHUNK = 65536


class Drained(enum.Enum):
    CLOSED = "closed"  # every pipe reached its end
    STOPPED = "stopped"  # ``take`` said enough
    TIMED_OUT = "timed out"  # the deadline passed first


def drain(fds: Sequence[int], deadline: float, take: Callable[[int, bytes], bool]) -> Drained:
    """Read each of ``fds`` until its end, handing every chunk to ``take(fd,
    chunk)``; ``deadline`` is a ``time.monotonic()`` time."""
    poller = select.poll()
    open_fds = set(fds)
    for fd in open_fds:
        poller.register(fd, select.POLLIN)
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            return Drained.TIMED_OUT
        for fd, _ in poller.poll(max(1, int(left * 1000))):
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                poller.unregister(fd)
                open_fds.discard(fd)
            elif not take(fd, chunk):
                return Drained.STOPPED
    return Drained.CLOSED
