"""Blocking work for the event loop's handlers, run in a thread with a bound.

Everything that may take long (a discovery with its CUDA probe, a lookup in a
container's root that the container can make slow) runs here, so that the loop
keeps answering the runtime within its deadlines. Each call gets a daemon thread
of its own rather than an executor's: a thread stuck in the kernel (a lookup on a
hung FUSE mount) must never keep the process from exiting at SIGTERM, and an
executor's threads are joined at exit.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["in_thread", "map_until"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


def in_thread(work: Callable[[], T], name: str) -> asyncio.Future[T]:
    """``work()`` in a new daemon thread; its result (or exception) on the loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]  # None only with an error

    def run() -> None:
        result: T | None = None
        error: BaseException | None = None
        try:
            result = work()
        except BaseException as exc:  # handed to the loop, which decides
            error = exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


async def map_until(work: Callable[[T], R], items: Sequence[T], timeout: float, name: str) -> list[R]:
    """``[work(item) for item in items]`` in one daemon thread, for at most
    ``timeout`` seconds: the results done by then, in order (fewer than
    ``items`` when time ran out; the thread stops after the item at hand)."""
    done: list[R] = []
    stop = threading.Event()

    def run() -> None:
        for item in items:
            if stop.is_set():
                return
            done.append(work(item))

    running = in_thread(run, name)
    running.add_done_callback(_retrieved)  # it may fail after we stopped waiting
    try:
        await asyncio.wait_for(asyncio.shield(running), timeout)
    except TimeoutError:
        stop.set()
    return list(done)


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.debug("a thread given up on failed: %r", future.exception())
