"""``run_start``: the start work called as the tests' plain code needs it, blocking.

The engine has only ``run_start_async`` (the plugin's one caller is an event
loop); this runs it on a loop of its own and keeps that loop until the worker
is reaped, which the engine does in the background once the result is in. A
loop closed earlier would leave the worker's pidfd open and the worker a zombie
until the next call.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable

from nri_gpu.engine.start import StartWork, runner

__all__ = ["killing_at", "run_start"]

_REAP_WAIT = 5.0  # seconds: a killed worker stuck in the kernel is left to the next call


def run_start(
    pid: int,
    work: StartWork,
    *,
    ldconfig: str = runner.DEFAULT_LDCONFIG,
    timeout: float = runner.DEFAULT_TIMEOUT,
    on_report: runner.Reporter | None = None,
) -> None:
    """``await run_start_async(...)`` to the end, the worker's reaping included."""

    async def call() -> None:
        earlier = set(runner._exiting)  # workers of calls before: not this loop's to wait for
        try:
            await runner.run_start_async(pid, work, ldconfig=ldconfig, timeout=timeout, on_report=on_report)
        finally:
            deadline = time.monotonic() + _REAP_WAIT
            while runner._exiting - earlier and time.monotonic() < deadline:
                await asyncio.sleep(0.005)

    asyncio.run(call())


_EMIT = runner._emit  # the real one, taken before any test patches it


def killing_at(n: int) -> Callable[[int, str, dict[str, object]], None]:
    """The worker's ``_emit``, SIGKILLing the worker as it announces its ``n``-th step
    (counted in each forked worker from its own copy): for
    ``monkeypatch.setattr(runner, "_emit", killing_at(n))``."""
    seen = [0]

    def emit(out: int, tag: str, message: dict[str, object]) -> None:
        _EMIT(out, tag, message)
        if tag == runner.STEP_TAG:
            seen[0] += 1
            if seen[0] == n:
                os.kill(os.getpid(), signal.SIGKILL)

    return emit
