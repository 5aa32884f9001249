"""The engine's one poll loop: pipes read until they close, within a deadline."""

from __future__ import annotations

import os
import threading
import time

from nri_gpu.engine.drain import Drained, drain


def test_every_pipe_is_read_to_its_end() -> None:
    pipes = [os.pipe(), os.pipe()]
    got: dict[int, bytearray] = {r: bytearray() for r, _ in pipes}

    def write(w: int, size: int) -> None:
        with os.fdopen(w, "wb") as f:  # more than a pipe holds: written while read
            f.write(b"x" * size)

    writers = [threading.Thread(target=write, args=(w, 100_000 + i)) for i, (_, w) in enumerate(pipes)]
    for t in writers:
        t.start()
    try:
        drained = drain([r for r, _ in pipes], time.monotonic() + 10, lambda fd, c: got[fd].extend(c) is None)
    finally:
        for t in writers:
            t.join()
        for r, _ in pipes:
            os.close(r)
    assert drained is Drained.CLOSED
    assert [len(got[r]) for r, _ in pipes] == [100_000, 100_001]


def test_take_stops_it_at_once() -> None:
    r, w = os.pipe()
    os.write(w, b"enough")  # the writer stays open: only take can end this
    calls = []
    try:
        assert drain([r], time.monotonic() + 10, lambda fd, c: calls.append(c) and False) is Drained.STOPPED
    finally:
        os.close(r)
        os.close(w)
    assert calls == [b"enough"]


def test_a_pipe_that_never_closes_costs_its_deadline() -> None:
    r, w = os.pipe()
    try:
        assert drain([r], time.monotonic() + 0.05, lambda fd, c: True) is Drained.TIMED_OUT
    finally:
        os.close(r)
        os.close(w)
