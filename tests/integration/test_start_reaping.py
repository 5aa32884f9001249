"""The start worker's end never blocks the event loop, even when SIGKILL cannot end
it at once (see ``engine.start.runner``).

A killed process leaves only when the kernel lets it: one in uninterruptible sleep,
or in a frozen cgroup, stays as long as that lasts. Here the worker is put in a
frozen (cgroup v1) freezer group while it waits on a hanging ldconfig; at the
timeout it is SIGKILLed, and it cannot die until the group is thawed 2.5 s later.

Needs root, runc and the cgroup v1 freezer (cgroup v2's lets a fatal signal through).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nri_gpu.engine.errors import StartError
from nri_gpu.engine.model import Plan
from nri_gpu.engine.start import StartWork, run_start_async, runner
from testbed.bundle import RuncHost
from tests.integration.test_start import (  # noqa: F401  (fixtures)
    _cannot_run,
    _running,
    children,
    gcc,
    gpu_container,
    node,
    plan,
    rebuild,
    runc,
    sleeper,
    work,
)

FREEZER = Path("/sys/fs/cgroup/freezer")
THAW_AFTER_S = 2.5


@pytest.fixture
def freezer() -> Iterator[Path]:
    if not (FREEZER / "freezer.state").exists() and not (FREEZER / "cgroup.procs").exists():
        _cannot_run("needs the cgroup v1 freezer (cgroup v2's lets SIGKILL end a frozen process)")
    group = FREEZER / f"nri-gpu-test-{os.getpid()}"
    group.mkdir()
    try:
        yield group
    finally:
        (group / "freezer.state").write_text("THAWED")
        deadline = time.monotonic() + 5
        while (group / "cgroup.procs").read_text().split() and time.monotonic() < deadline:
            time.sleep(0.02)
        group.rmdir()


def test_a_killed_worker_that_cannot_die_yet_does_not_stop_the_loop(
    runc: RuncHost,  # noqa: F811  (the fixtures imported above)
    plan: Plan,  # noqa: F811
    rebuild: StartWork,  # noqa: F811
    sleeper: Path,  # noqa: F811
    freezer: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner, "_REPORT_MARGIN", -10.0)  # the worker would wait on ldconfig for 10 s more
    c = gpu_container(runc, plan, "true")
    thawed = threading.Event()
    # In a whole test run the session's daemons are children too: only new ones count.
    others, other_zombies = set(children(zombies=False)), set(children(zombies=True))

    def _workers() -> list[int]:
        """The forked start worker (its ldconfig is its own child), if it is alive."""
        return [pid for pid in children(zombies=False) if pid not in others]

    def _zombie_children() -> list[int]:
        return [pid for pid in children(zombies=True) if pid not in other_zombies]

    reaping: list[asyncio.Future[int | None]] = []
    reap_later = runner._reap_later

    def recorded(loop: asyncio.AbstractEventLoop, child: int) -> asyncio.Future[int | None]:
        reaping.append(reap_later(loop, child))
        return reaping[-1]

    monkeypatch.setattr(runner, "_reap_later", recorded)

    def thaw() -> None:
        (freezer / "freezer.state").write_text("THAWED")
        thawed.set()

    async def main() -> tuple[float, float, float]:
        gaps: list[float] = []

        async def ticker() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        async def freeze_the_worker() -> None:
            while not _running(sleeper):  # until it waits on the hanging ldconfig
                await asyncio.sleep(0.01)
            (worker,) = _workers()
            (freezer / "cgroup.procs").write_text(str(worker))
            (freezer / "freezer.state").write_text("FROZEN")
            threading.Timer(THAW_AFTER_S, thaw).start()

        tick = asyncio.ensure_future(ticker())
        frozen = asyncio.ensure_future(freeze_the_worker())
        began = time.monotonic()
        with pytest.raises(StartError, match=r"not finished after 0\.8 s; the worker was killed"):
            await run_start_async(c.pid, rebuild, ldconfig=str(sleeper), timeout=0.8)
        answered = time.monotonic() - began
        await frozen
        assert not thawed.is_set()
        assert _workers(), "the killed worker should still be there, frozen"
        # The loop reaps it once the group is thawed: its pidfd turns readable.
        await asyncio.wait_for(asyncio.gather(*reaping), THAW_AFTER_S + 5)
        assert thawed.is_set()
        tick.cancel()
        return answered, max(gaps), time.monotonic() - began

    answered, worst_gap, total = asyncio.run(main())
    print(f"\nanswered after {answered:.2f} s; longest loop stall {worst_gap * 1000:.0f} ms; total {total:.2f} s")
    assert answered < 1.5, f"the refusal took {answered:.2f} s: the loop waited for the killed worker"
    assert worst_gap < 0.5, f"the event loop stalled for {worst_gap:.2f} s"
    assert _workers() == [] and _zombie_children() == [], "the worker was not reaped after the thaw"


def test_the_worker_holds_none_of_the_plugins_descriptors(
    runc: RuncHost,  # noqa: F811  (the fixtures imported above)
    plan: Plan,  # noqa: F811
    rebuild: StartWork,  # noqa: F811
    sleeper: Path,  # noqa: F811
) -> None:
    """A worker killed while stuck in the kernel can outlive the plugin: holding the
    plugin's listening status socket, its NRI connection or a probe's pipe, it would
    keep the port bound against a restarted plugin and the runtime from seeing EOF.
    The worker keeps stdio and its result pipe only."""
    import socket

    c = gpu_container(runc, plan, "true")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    others = set(children(zombies=False))

    async def main() -> list[str]:
        started = asyncio.ensure_future(run_start_async(c.pid, rebuild, ldconfig=str(sleeper), timeout=1.5))
        while not _running(sleeper):  # until the worker waits on the hanging ldconfig
            assert not started.done(), started
            await asyncio.sleep(0.01)
        (worker,) = [pid for pid in children(zombies=False) if pid not in others]
        held = sorted(os.readlink(f"/proc/{worker}/fd/{fd}") for fd in os.listdir(f"/proc/{worker}/fd"))
        started.cancel()
        with contextlib.suppress(BaseException):
            await started
        return held

    try:
        held = asyncio.run(main())
    finally:
        listener.close()
    sockets = [h for h in held if h.startswith("socket:")]
    assert not sockets, f"the worker holds the plugin's sockets: {held}"
