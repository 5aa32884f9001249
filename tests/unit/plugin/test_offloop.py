"""Blocking work off the event loop: bounded waits, and no thread that keeps the
process from exiting."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import pytest

from nri_gpu.plugin.offloop import in_thread, map_until


def test_map_until_returns_what_is_done_by_the_deadline() -> None:
    release = threading.Event()

    def check(n: int) -> int:
        if n == 2:
            release.wait(10)
        return n * 10

    async def main() -> list[int]:
        return await map_until(check, [0, 1, 2, 3], 0.3, "test")

    try:
        done = asyncio.run(main())
    finally:
        release.set()
    assert done == [0, 10]  # had it waited for 2 (released only now), 2 and 3 would be in


def test_in_thread_hands_the_exception_to_the_loop() -> None:
    def fail() -> None:
        raise OSError("probe could not start")

    async def main() -> None:
        with pytest.raises(OSError, match="probe could not start"):
            await in_thread(fail, "test")

    asyncio.run(main())


def test_a_thread_stuck_for_good_does_not_keep_the_process_from_exiting() -> None:
    """An executor's threads are joined at exit: a lookup stuck on a hung mount
    would then keep the plugin from ever exiting at SIGTERM."""
    script = (
        "import asyncio, threading\n"
        "from plugin.offloop import map_until\n"
        "asyncio.run(map_until(lambda n: threading.Event().wait(), [1], 0.1, 'stuck'))\n"
        "print('returned')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20)  # else: hangs
    assert done.returncode == 0 and done.stdout == "returned\n", done.stderr
