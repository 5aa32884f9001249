"""The node's inventory for the event loop: read at once, taken again in a thread.

A new driver, a GPU or a MIG instance coming or going changes the inventory;
noticing it costs two small procfs reads and a few listings of the MIG folders
(``engine.discover.fingerprint``), taking it again a whole
discovery with a CUDA probe in a child process (about 12 ms here, up to the
probe's 10 s timeout on a sick node). Neither runs on the loop: ``current()``
costs a clock read, and when a check is due it starts ``InventoryCache.refresh``
in a thread; the old inventory serves every request until the new one is
complete, and is then replaced in one assignment.

A request that names a GPU the current inventory lacks may be early for a
hot-plugged GPU or a new driver: ``newer(timeout)`` waits for the refresh in
flight (or starts one, unless one started less than ``recheck`` seconds ago, so
that a pod asking for GPU 99 in a loop costs nothing), at most ``timeout``
seconds.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable

from nri_gpu.engine import Inventory, InventoryCache
from nri_gpu.plugin.budget import DEFAULT_REQUEST
from nri_gpu.plugin.offloop import in_thread

__all__ = ["LiveInventory"]

logger = logging.getLogger(__name__)


class LiveInventory:
    """``InventoryCache`` for callers on an event loop; one refresh at a time.

    ``interval``: seconds between checks (default: the cache's); ``recheck``: the
    least time between two refreshes that a request for a missing GPU starts;
    ``hang_after``: a refresh running longer than this (a request's whole budget) is
    no longer waited for, so that a pod asking for a missing GPU again and again
    cannot make each of its calls wait, while the runtime holds its node-wide lock.
    """

    def __init__(
        self,
        cache: InventoryCache,
        *,
        interval: float | None = None,
        recheck: float = 1.0,
        hang_after: float = DEFAULT_REQUEST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cache = cache
        self._interval = cache.interval if interval is None else interval
        self._recheck = recheck
        self._hang_after = hang_after
        self._clock = clock
        self._began = clock()  # of the last refresh (the cache took one when it was made)
        self._running: asyncio.Future[Inventory] | None = None

    @property
    def refreshing(self) -> bool:
        return self._running is not None

    def current(self) -> Inventory:
        """The inventory now; starts a refresh in the background when one is due."""
        if self._running is None and self._clock() - self._began >= self._interval:
            self._start()
        return self._cache.current

    async def newer(self, timeout: float, *, force: bool = False) -> Inventory | None:
        """The inventory once the refresh in flight (or one started now) is done;
        the current one if a refresh began less than ``recheck`` seconds ago and
        none runs; None if not done within ``timeout`` seconds (it goes on).
        ``force``: a refresh started now takes the inventory again even if the
        fingerprint has not changed (``InventoryCache.refresh``)."""
        running = self._running
        if running is None:
            if self._clock() - self._began < self._recheck:
                return self._cache.current
            running = self._start(force=force)
        elif self._clock() - self._began > self._hang_after:
            return None  # it hangs or crawls: the next check after it ends takes over
        try:
            return await asyncio.wait_for(asyncio.shield(running), timeout)
        except TimeoutError:
            return None

    def _start(self, *, force: bool = False) -> asyncio.Future[Inventory]:
        self._began = self._clock()
        running: asyncio.Future[Inventory] = asyncio.get_running_loop().create_future()
        try:
            taking = in_thread(functools.partial(self._cache.refresh, force=force), "nri-gpu-inventory")
        except RuntimeError as exc:
            # No thread to be had (the pod's pids limit, memory): the old inventory
            # serves, and the next check tries again. Never marked running: nothing
            # would ever settle it, and no refresh would start again.
            logger.error("cannot take the node's inventory again: %s", exc)
            running.set_result(self._cache.current)
            return running
        self._running = running

        def refreshed(outcome: asyncio.Future[bool]) -> None:
            self._running = None
            error = None if outcome.cancelled() else outcome.exception()
            if error is not None:
                # The old inventory goes on serving; the next check tries again.
                logger.error("taking the node's inventory again failed: %s", error, exc_info=error)
            running.set_result(self._cache.current)

        taking.add_done_callback(refreshed)
        return running
