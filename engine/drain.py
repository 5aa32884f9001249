"""A child process's pipes read until they close, within a deadline: the engine's
one poll loop (the NVML and CUDA probes' output, the confined ldconfig's).

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
import signal
import subprocess
import time
from collections.abc import Callable, Sequence

__all__ = ["Drained", "bounded_output", "drain"]

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


def bounded_output(proc: subprocess.Popen[bytes], timeout: float, limit: int) -> tuple[bytes, bytes]:
    """(stdout, stderr) of ``proc`` once it has exited, each read up to ``limit`` + 1
    bytes: past that, or past ``timeout`` seconds (``TimeoutExpired``), its process
    group is killed. ``communicate`` would hold whatever a broken library prints."""
    assert proc.stdout is not None and proc.stderr is not None
    deadline = time.monotonic() + timeout
    out, err = bytearray(), bytearray()
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}

    def keep(fd: int, chunk: bytes) -> bool:
        streams[fd].extend(chunk)
        return len(streams[fd]) <= limit

    try:
        drained = drain(list(streams), deadline, keep)
        if drained is Drained.TIMED_OUT:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        if drained is Drained.STOPPED:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(max(0.0, deadline - time.monotonic()))
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        proc.stdout.close()
        proc.stderr.close()
    return bytes(out), bytes(err)
