"""LiveInventory: the inventory for the event loop, taken again in a thread."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.discover import InventoryCache, discover
from nri_gpu.engine.model import Inventory
from nri_gpu.plugin.inventory import LiveInventory
from testbed.gpunode import FIXTURE_DRIVER, build_node


def test_a_refresh_whose_thread_cannot_start_is_tried_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread that cannot be started (the pod's pids limit, no memory) is a
    passing failure: the old inventory serves, and the next check starts a
    refresh again. (Before: the refresh was marked running before its thread
    started, so it stayed "running" for good: no refresh ever again, and every
    request for a missing GPU waited its whole budget for it.)"""
    node = build_node(tmp_path, gpus=2, driver_files=FIXTURE_DRIVER)
    config = EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root))

    def take(c: EngineConfig) -> Inventory:
        return discover(c, cuda_version=lambda p: ("12.4", None))

    live = LiveInventory(InventoryCache(config, interval=0, take=take), interval=0, recheck=0)
    start = threading.Thread.start

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    async def main() -> None:
        monkeypatch.setattr(threading.Thread, "start", refuse)
        assert len(live.current().gpus) == 2  # the old inventory, not an exception
        assert not live.refreshing
        assert await live.newer(0.5) is not None
        monkeypatch.setattr(threading.Thread, "start", start)
        assert await live.newer(5.0) is not None  # a refresh runs again
        assert not live.refreshing

    asyncio.run(main())


def test_a_refresh_that_outlived_a_whole_request_is_not_waited_for_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refresh stuck in the kernel (a sick driver's procfs) or in a slow CUDA probe:
    the first request for a GPU the node lacks waits its budget for it, but the next
    ones must not each wait again: the runtime holds its node-wide lock for the whole
    call, so every such retry would stall every container creation of the node."""
    node = build_node(tmp_path, gpus=2, driver_files=FIXTURE_DRIVER)
    config = EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root))
    cache = InventoryCache(config, interval=0, take=lambda c: discover(c, cuda_version=lambda p: ("12.4", None)))
    release = threading.Event()
    monkeypatch.setattr(cache, "refresh", lambda force=False: release.wait(10))
    now = [0.0]
    live = LiveInventory(cache, interval=1000, recheck=0, hang_after=2.0, clock=lambda: now[0])

    async def main() -> None:
        now[0] = 1.0
        assert await live.newer(0.2) is None  # waited its budget: the refresh may yet bring the GPU
        assert live.refreshing
        now[0] = 4.0  # the refresh has now run longer than a request's whole budget
        asked = live.newer(30)
        try:
            asked.send(None)  # its first step: returns, or suspends to wait
        except StopIteration as answered:
            assert answered.value is None
        else:
            asked.close()
            raise AssertionError("waited again for a refresh that hangs")
        finally:
            release.set()

    asyncio.run(main())


def test_a_forced_refresh_takes_the_inventory_again_though_procfs_looks_the_same(tmp_path: Path) -> None:
    """A MIG instance destroyed and made again under the same ids keeps its procfs
    folders (same fingerprint) but gets a new MIG UUID from NVML: a request naming
    the new UUID asks for a forced refresh, which must run discovery again."""
    node = build_node(tmp_path, gpus=2, driver_files=FIXTURE_DRIVER)
    config = EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root))
    taken: list[int] = []

    def take(c: EngineConfig) -> Inventory:
        taken.append(1)
        return discover(c, cuda_version=lambda p: ("12.4", None))

    live = LiveInventory(InventoryCache(config, interval=1000, take=take), interval=1000, recheck=0)

    async def main() -> None:
        await live.newer(5.0)
        assert len(taken) == 1  # the fingerprint is the same: nothing taken again
        await live.newer(5.0, force=True)
        assert len(taken) == 2

    asyncio.run(main())
