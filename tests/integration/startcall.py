"""``run_start``: the start work called as the tests' plain code needs it, blocking.

The engine has only ``run_start_async`` (the plugin's one caller is an event
loop); this runs it on a loop of its own and keeps that loop until the worker
is reaped, which the engine does in the background once the result is in. A
loop closed earlier would leave the worker's pidfd open and the worker a zombie
until the next call.
"""

from __future__ import annotations

import asyncio
import time

from engine.start import StartWork, runner

__all__ = ["run_start"]

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
