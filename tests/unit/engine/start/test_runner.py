"""The runner's parts that need no container: result lines, the worker's import guard."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest

from nri_gpu.engine.errors import StartError
from nri_gpu.engine.start import runner
from nri_gpu.engine.start.work import StartWork

WORK = StartWork('container "c" in pod "ns/p"', (), (), ())


def test_a_success_line_becomes_a_report() -> None:
    data = b'step {"step": "enter"}\nresult {"ok": true, "timings": {"total": 3.5}, "procfs": "created", "ld_cache": true}\n'
    report = runner._outcome(WORK, data, 0, False, 1.5)
    assert (report.timings_ms, report.procfs, report.ld_cache_written) == ({"total": 3.5}, "created", True)


def test_a_failure_line_names_container_and_step() -> None:
    data = b'step {"step": "enter"}\nstep {"step": "ldconfig"}\nresult {"ok": false, "step": "ldconfig", "error": "boom"}\n'
    with pytest.raises(StartError) as caught:
        runner._outcome(WORK, data, 0, False, 1.5)
    assert str(caught.value) == 'container "c" in pod "ns/p": ldconfig: boom'
    assert (caught.value.step, caught.value.error) == ("ldconfig", "boom")


def test_a_killed_worker_is_reported_with_the_step_it_was_in() -> None:
    with pytest.raises(
        StartError, match=r'^container "c" in pod "ns/p": symlinks: not finished after 1.5 s; the worker was killed$'
    ):
        runner._outcome(WORK, b'step {"step": "enter"}\nstep {"step": "symlinks"}\n', signal.SIGKILL, True, 1.5)


def test_a_worker_that_died_without_a_word() -> None:
    with pytest.raises(
        StartError, match=r": procfs isolation: the worker ended without a result \(killed by SIGSEGV\)$"
    ):
        runner._outcome(WORK, b'step {"step": "procfs isolation"}\ngarbage\n', signal.SIGSEGV, False, 1.5)


def test_the_worker_refuses_imports_once_detached() -> None:
    name = "this_module_is_not_loaded_yet_xyz"
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            runner._detach_from_caller(write_end)
            already = "json" in sys.modules and __import__("json") is sys.modules["json"]
            try:
                __import__(name)
                verdict = b"imported"
            except ImportError as exc:
                verdict = b"refused" if "may not import" in str(exc) and already else b"other"
            os.write(write_end, verdict)
        finally:
            os._exit(0)
    os.close(write_end)
    assert os.read(read_end, 100) == b"refused"
    os.waitpid(child, 0)
    os.close(read_end)


@pytest.mark.parametrize(
    ("data", "complete"),
    [
        (b"", False),
        (b'step {"step": "enter"}\n', False),
        (b'step {"step": "enter"}\nresult {"ok": true, "timings": {}', False),  # the result line is not whole yet
        (b'step {"step": "enter"}\nresult {"ok": true, "timings": {}}\n', True),
        (b'result {"ok": false, "step": "internal", "error": "x\\n{\\"ok\\": "}\n', True),
        (b'step {"step": "x{\\"ok\\": true}"}\n', False),  # escaped inside a step name: not a result
        (b'{"ok": true, "timings": {}}\n', False),  # untagged: only the tag makes a result
    ],
)
def test_the_result_line_is_recognised_as_soon_as_it_is_whole(data: bytes, complete: bool) -> None:
    assert runner._has_result(bytearray(data)) is complete


def test_a_fork_that_fails_is_a_refusal_and_leaks_no_descriptor(monkeypatch: pytest.MonkeyPatch) -> None:
    """fork(2) fails under the pod's pids limit or without memory: the start is
    refused naming the container, and the result pipe is closed. (Before: its two
    descriptors were left open at every such start, and the error was an internal one.)"""

    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    before = sorted(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(os, "fork", no_fork)
    with pytest.raises(StartError, match=r'^container "c" in pod "ns/p": fork: .*Resource temporarily unavailable'):
        asyncio.run(runner.run_start_async(1, WORK, timeout=1.0))
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_a_worker_without_a_pidfd_is_still_reaped(monkeypatch: pytest.MonkeyPatch) -> None:
    """pidfd_open can fail (no descriptor left, EMFILE): the worker is then reaped
    by the next start instead, and the start it served is not failed for it.
    (Before: the OSError reached the handler after the work was done, and the
    worker stayed a zombie for good, in no list that the next start reaps.)"""
    child = os.fork()
    if child == 0:
        time.sleep(0.2)
        os._exit(0)

    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(24, "Too many open files")

    async def main() -> int | None:
        return await runner._reap_later(asyncio.get_running_loop(), child)

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    try:
        assert asyncio.run(main()) is None
        assert child in runner._exiting
        time.sleep(0.4)
        runner._reap_exited()
        assert child not in runner._exiting
        with pytest.raises(ChildProcessError):
            os.waitpid(child, os.WNOHANG)  # already reaped
    finally:
        runner._exiting.discard(child)
