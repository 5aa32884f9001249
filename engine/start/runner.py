"""Run the start work in a forked worker, from asyncio.

Why a fork: ``setns`` into a mount namespace needs a single-threaded caller
and changes the caller for good; the plugin is a multi-threaded asyncio
process that must stay where it is. ``os.fork`` gives a one-thread copy in
about a millisecond; a fresh interpreter would cost more than the step's whole
budget (NRI gives a plugin 2 s per request).

The worker never returns into the caller's code: it does the work, writes
tagged JSON lines to a pipe (``step {"step": ...}`` as each step starts, then one
``result {"ok": true, ...}`` or ``result {"ok": false, "step": ..., "error": ...}``) and
``os._exit``s. It takes no lock the caller's threads may hold (no logging, no
asyncio), blocks every signal (a Python handler would write to the caller's
signal wake-up fd), and refuses imports: once inside the container, a module
not loaded yet would be searched for on ``sys.path`` *in the container's
root*, where the image could have planted one.

A worker that outlives the timeout is SIGKILLed (its ldconfig child follows
through ``PR_SET_PDEATHSIG``) and reported with the last step it started.

Off the request path: the caller returns as soon as the result line is in,
and the worker's exit (tearing down its copy of a 30 MiB address space, about
1.5 ms) is reaped in the background through a pidfd. So is a worker killed at
the timeout: SIGKILL does not end a process at once (one in uninterruptible
sleep, or in a frozen cgroup, stays until it wakes), and a blocking ``waitpid``
there would stop the event loop, and every request of the node with it. The worker runs no
Python collector: a collection writes to every object, copying every shared
page. A worker forked *ahead* of time was tried and measured: as long as it
waits it shares the plugin's pages, so the plugin's next CreateContainer pays
the copy-on-write faults instead (0.17 -> 1.09 ms per call in-process), which
ate most of what it saved at StartContainer.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.abc
import importlib.machinery
import json
import os
import signal
import stat
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, NoReturn

from nri_gpu.engine.errors import StartError
from nri_gpu.engine.start import actions, cgroup, procview, syscalls
from nri_gpu.engine.start.work import StartReport, StartWork

__all__ = [
    "DEFAULT_LDCONFIG",
    "DEFAULT_TIMEOUT",
    "Reporter",
    "find_init_pid",
    "run_start_async",
    "shows_driver_view",
]

DEFAULT_LDCONFIG = "/sbin/ldconfig"
DEFAULT_TIMEOUT = 1.5  # under containerd's 2 s plugin_request_timeout, with room for the rest of the handler
# The worker stops waiting for ldconfig this long before the caller's deadline,
# so that it can still say why it failed before it would be killed.
_REPORT_MARGIN = 0.1
_V1_CONTROLLERS = ("unified", "pids", "devices", "memory", "freezer", "cpu,cpuacct", "systemd")


Reporter = Callable[[StartReport], None]


async def run_start_async(
    pid: int,
    work: StartWork,
    *,
    ldconfig: str = DEFAULT_LDCONFIG,
    timeout: float = DEFAULT_TIMEOUT,
    on_report: Reporter | None = None,
) -> None:
    """Do ``work`` inside the container whose init process is ``pid``, without
    blocking the event loop: the loop watches the result pipe, and the worker's
    exit through its pidfd. A cancelled call kills the worker.

    ``ldconfig``: the host's static ldconfig (never one from the image).
    ``timeout``: seconds for everything, fork to result. ``on_report`` gets what
    was done and the per-step timings of a success.
    Raises ``StartError`` naming ``work.container`` and the failed step.
    """
    deadline = time.monotonic() + timeout
    child, fd = _spawn(pid, work, ldconfig, deadline)
    report = await _finish(child, fd, work, deadline, timeout)
    if on_report is not None:
        on_report(report)


def find_init_pid(cgroups_path: str, cgroup_root: str = "/sys/fs/cgroup", *, container: str = "") -> int:
    """The one process in the container's cgroup, for runtimes that report pid 0.

    ``cgroups_path``: the OCI ``linux.cgroupsPath`` (``/parent/id`` or
    ``slice:prefix:name``). Looks in the unified hierarchy, then the v1
    controllers. Raises ``StartError`` (step "find init pid").
    """
    try:
        relative = cgroup.relative_path(cgroups_path)
    except ValueError as exc:
        raise StartError(container, "find init pid", str(exc)) from exc
    for sub in ("", *_V1_CONTROLLERS):
        path = os.path.join(cgroup_root, sub, relative, "cgroup.procs")
        try:
            with open(path, encoding="ascii") as f:
                pids = [int(word) for word in f.read().split()]
        except (FileNotFoundError, NotADirectoryError):
            continue
        except (OSError, ValueError) as exc:
            raise StartError(container, "find init pid", f"{path}: {exc}") from exc
        if len(pids) != 1:
            found = ", ".join(map(str, pids)) or "none"
            raise StartError(container, "find init pid", f"{path}: expected exactly one process, found {found}")
        return pids[0]
    raise StartError(container, "find init pid", f"no cgroup.procs for {cgroups_path!r} under {cgroup_root}")


def shows_driver_view(pid: int, proc: str = "/proc") -> bool | None:
    """Whether process ``pid`` sees nri-gpu's finished ``/proc/driver`` view, which
    the start work mounts first. None when that cannot be told (the process is
    gone, or the lookup fails); never a false alarm.

    Looked at from the host without entering anything, and at a fixed cost
    whatever the container holds: the view's marker file is looked up in the
    process's root (``<proc>/<pid>/root``) with every link refused, and read
    (a few KiB at most) only once it is known to be a regular file. No
    mountinfo is read: a pod with 20,000 mounts at long paths has 72 MB of it.
    """
    try:
        root = os.open(f"{proc}/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        for path in _VIEW_MARKERS:
            marker = _read_marker(root, path)
            if marker is not None:
                return procview.is_finished(marker)
        return False
    except OSError:
        return None
    finally:
        os.close(root)


# Where the marker is: on a real node the view covers /proc/driver/nvidia, on a
# simulated one (no nvidia directory in procfs) all of /proc/driver.
_VIEW_MARKERS = (f"proc/driver/nvidia/{procview.MARKER}", f"proc/driver/{procview.MARKER}")
_MARKER_LIMIT = 4096
# In the container's root, and no link of any kind: neither one of the image's
# nor a /proc magic link may take the lookup out of it.
_CONFINED = syscalls.RESOLVE_IN_ROOT | syscalls.RESOLVE_NO_MAGICLINKS | syscalls.RESOLVE_NO_SYMLINKS


def _read_marker(root: int, path: str) -> bytes | None:
    """The first bytes of the regular file ``path`` in ``root``; None if there is none."""
    try:
        found = syscalls.openat2(root, path, os.O_PATH | os.O_CLOEXEC, resolve=_CONFINED)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(found).st_mode):
            return None
        # Reopen the very inode that was checked (no second lookup to race with):
        # a regular file, so opening it has no side effect, unlike a device or FIFO.
        fd = os.open(f"/proc/self/fd/{found}", os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    finally:
        os.close(found)
    try:
        return os.read(fd, _MARKER_LIMIT)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- parent side


def _spawn(pid: int, work: StartWork, ldconfig: str, deadline: float) -> tuple[int, int]:
    read_end, write_end = os.pipe()
    try:
        child = os.fork()
    except OSError as exc:  # EAGAIN at the pids limit, ENOMEM: a refusal, and no descriptor left open
        os.close(read_end)
        os.close(write_end)
        raise StartError(work.container, "fork", f"cannot start the worker: {exc}") from exc
    if child == 0:
        try:
            os.close(read_end)
            _worker(write_end, pid, work, ldconfig, deadline)
        finally:
            os._exit(70)
    os.close(write_end)
    return child, read_end


async def _finish(child: int, fd: int, work: StartWork, deadline: float, timeout: float) -> StartReport:
    """Wait on the worker's result pipe without blocking the loop; its report.

    Returns as soon as the result line is in, or at the deadline; the worker's
    exit is reaped in the background either way. A cancelled call kills the worker."""
    loop = asyncio.get_running_loop()
    _reap_exited()
    os.set_blocking(fd, False)
    data = bytearray()
    done: asyncio.Future[bool] = loop.create_future()  # True: EOF, the worker is gone

    def readable() -> None:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        data.extend(chunk)
        if not done.done() and (not chunk or _has_result(data)):
            done.set_result(not chunk)

    loop.add_reader(fd, readable)
    timed_out = exited = False
    try:
        try:
            exited = await asyncio.wait_for(done, max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            timed_out = True
    except BaseException:  # cancelled: the worker must not outlive the request
        loop.remove_reader(fd)
        os.close(fd)
        _kill(child)
        _reap_later(loop, child)
        raise
    loop.remove_reader(fd)
    os.close(fd)
    if timed_out:
        _kill(child)
    reaped = _reap_later(loop, child)
    status = None
    if exited:
        # It closed the pipe without a result: its exit status says why. It is
        # exiting now; wait for that on the loop, never past the deadline.
        try:
            status = await asyncio.wait_for(asyncio.shield(reaped), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            _kill(child)
    return _outcome(work, bytes(data), status, timed_out, timeout)


def _has_result(data: bytearray) -> bool:
    """Whether the worker's last complete line is its result (tagged ``result``)."""
    if not data.endswith(b"\n"):
        return False
    start = data.rfind(b"\n", 0, len(data) - 1) + 1
    return data.startswith(RESULT_TAG.encode() + b" ", start)


# Workers that are exiting or killed; reaped when their pidfd says so, or by the
# next call (a loop closed in between never runs the reader).
_exiting: set[int] = set()
_RUNNING = -1  # _try_reap: not exited yet


def _reap_later(loop: asyncio.AbstractEventLoop, child: int) -> asyncio.Future[int | None]:
    """Reap ``child`` once it has exited, without waiting for it now: its exit
    status (None if it was reaped elsewhere) when the loop sees it go."""
    reaped: asyncio.Future[int | None] = loop.create_future()
    status = _try_reap(child)
    if status != _RUNNING:
        reaped.set_result(status)
        return reaped
    try:
        pidfd = os.pidfd_open(child)
    except ProcessLookupError:  # reaped elsewhere in between
        reaped.set_result(None)
        return reaped
    except OSError:  # no descriptor to be had (EMFILE): the next call reaps it (_reap_exited)
        _exiting.add(child)
        reaped.set_result(None)
        return reaped
    _exiting.add(child)

    def exited() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        _exiting.discard(child)
        status = _try_reap(child)  # readable: it has exited, so this does not wait
        if not reaped.done():
            reaped.set_result(None if status == _RUNNING else status)

    loop.add_reader(pidfd, exited)
    return reaped


def _try_reap(child: int) -> int | None:
    """Its wait status if it has exited (reaping it), ``_RUNNING`` if not, None if
    reaped elsewhere. Never waits."""
    try:
        pid, status = os.waitpid(child, os.WNOHANG)
    except ChildProcessError:
        return None
    return status if pid else _RUNNING


def _reap_exited() -> None:
    """Reap the exiting workers that have exited by now (never waits)."""
    for child in list(_exiting):
        if _try_reap(child) != _RUNNING:
            _exiting.discard(child)


def _kill(child: int) -> None:
    # Safe by pid: the worker is our child and not reaped yet, so its pid is not reused.
    try:
        os.kill(child, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _outcome(work: StartWork, data: bytes, status: int | None, timed_out: bool, timeout: float) -> StartReport:
    steps: list[str] = []
    result: dict[str, Any] | None = None
    for line in data.decode("utf-8", "replace").splitlines():
        tag, _, body = line.partition(" ")
        try:
            message = json.loads(body)
        except ValueError:
            continue
        if not isinstance(message, dict):
            continue
        if tag == STEP_TAG and "step" in message:
            steps.append(str(message["step"]))
        elif tag == RESULT_TAG and result is None:
            result = message
    last_step = steps[-1] if steps else "start"
    if timed_out and result is None:
        raise StartError(work.container, last_step, f"not finished after {timeout:.3g} s; the worker was killed")
    if result is None:
        raise StartError(work.container, last_step, f"the worker ended without a result ({_describe(status)})")
    if not result.get("ok"):
        raise StartError(work.container, str(result.get("step", last_step)), str(result.get("error", "failed")))
    timings = {str(k): float(v) for k, v in dict(result.get("timings", {})).items()}
    return StartReport(
        timings_ms=timings,
        procfs=str(result.get("procfs")),
        ld_cache_written=bool(result.get("ld_cache")),
        cuda_compat=str(result.get("cuda_compat", ""))[:1000],
    )


def _describe(status: int | None) -> str:
    if status is None:
        return "exit status unknown"
    code = os.waitstatus_to_exitcode(status)
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"


# --------------------------------------------------------------------------- worker side


class _NoImports(importlib.abc.MetaPathFinder):
    """Refuse every import not already done: ``sys.path`` may now name the container's files."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        raise ImportError(f"the start worker may not import {fullname!r} (it runs inside the container)")


def _worker(out: int, pid: int, work: StartWork, ldconfig: str, deadline: float) -> NoReturn:
    try:
        _detach_from_caller(out)

        def progress(step: str) -> None:
            _emit(out, STEP_TAG, {"step": step})

        report = actions.perform(
            pid, work, ldconfig_path=ldconfig, deadline=deadline - _REPORT_MARGIN, on_step=progress
        )
        _emit(
            out,
            RESULT_TAG,
            {
                "ok": True,
                "timings": report.timings_ms,
                "procfs": report.procfs,
                "ld_cache": report.ld_cache_written,
                "cuda_compat": report.cuda_compat,
            },
        )
    except actions.StepFailed as exc:
        _emit(out, RESULT_TAG, {"ok": False, "step": exc.step, "error": str(exc)})
    except BaseException as exc:
        _emit(out, RESULT_TAG, {"ok": False, "step": "internal", "error": f"{type(exc).__name__}: {exc}"})
    finally:
        os._exit(0)


def _detach_from_caller(out: int) -> None:
    # Nothing of the plugin's but stdio and the result pipe: a worker killed while
    # stuck in the kernel can outlive the plugin, and must not keep its status port
    # bound, its NRI connection open (the runtime would see no EOF) or a pipe. The
    # worker opens all it needs itself; no object owning a closed fd is ever
    # finalised here (no collection, and the worker leaves by os._exit). A library
    # whose at-fork handler starts threads on inherited fds would break here (gRPC's
    # does): the plugin loads none, and the setns into the container refuses a
    # worker with a second thread.
    os.closerange(3, out)
    os.closerange(out + 1, _FD_CEILING)
    gc.disable()  # a collection would write to every object, copying the shared pages
    try:
        signal.set_wakeup_fd(-1)  # the caller's event loop's fd: not ours to write to
    except ValueError:
        pass  # forked from a thread that is not the main one: there is no wake-up fd to clear
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    sys.meta_path.insert(0, _NoImports())


_FD_CEILING = 1 << 20  # above any RLIMIT_NOFILE; closerange is one close_range(2) call


# The worker's lines: "<tag> <json>", so the caller tells a step from the result
# by the tag, not by which keys the JSON happens to hold.
STEP_TAG = "step"
RESULT_TAG = "result"


def _emit(out: int, tag: str, message: dict[str, Any]) -> None:
    try:
        os.write(out, tag.encode() + b" " + json.dumps(message).encode() + b"\n")
    except BaseException:
        pass  # the caller is gone or killed us: nobody to tell
