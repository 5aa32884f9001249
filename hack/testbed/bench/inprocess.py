"""nri-gpu's CreateContainer path run in this process, split into its steps and profiled.

The plugin times request parsing, planning and the encoding of the adjustment
as one step (``plan``), so the split comes from here: the same functions the
handler calls (``plugin.request``, ``engine.request``, ``engine.plan``,
``plugin.adjustment``), on the same simulated node, timed one by one; then the
whole ``GpuPlugin.create_container`` with its JSON log line written to
/dev/null, and the protobuf serialisation of the reply the stub does after it.
``profile_create`` runs the handler under cProfile.

The handler never awaits on this path, so its coroutine is driven by hand
(one ``send``), without an event loop in the measurement.
"""

from __future__ import annotations

import cProfile
import logging
import os
import pstats
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.discover import InventoryCache
from nri_gpu.engine.plan import plan as make_plan
from nri_gpu.engine.request import parse_request
from nri_gpu.engine.start.work import StartWork
from nri_gpu.plugin._proto import nri_pb2 as api
from nri_gpu.plugin.adjustment import to_adjustment
from nri_gpu.plugin.handlers import GpuPlugin
from nri_gpu.plugin.logfmt import JsonFormatter
from nri_gpu.plugin.request import container_info, may_request
from testbed.gpunode import SimNode

from .session import VARIANTS
from .stats import summarize

__all__ = ["SPLIT_STEPS", "measure_create_split", "profile_create"]

T = TypeVar("T")
_ROOT = Path(__file__).resolve().parents[3]

# What a CRI container of the benchmark carries (host network, busybox+glibc image).
_ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME=bench")
_MOUNTS = ("/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/dev/shm", "/dev/termination-log")
SPLIT_STEPS = ("may_request", "parse", "plan", "encode", "serialize", "handler", "handler+log")


def _drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("the handler suspended; it cannot be timed without an event loop")


async def _no_start(pid: int, work: StartWork, **kw: Any) -> None:
    return None


def _messages(annotations: dict[str, str]) -> tuple[api.PodSandbox, api.Container]:
    pod = api.PodSandbox(id="a" * 64, name="bench", namespace="default", uid="u" * 32, annotations=annotations)
    ctr = api.Container(
        id="b" * 64,
        pod_sandbox_id=pod.id,
        name="main",
        env=list(_ENV),
        mounts=[api.Mount(destination=m, source=f"/var/lib/pod{m}", type="bind") for m in _MOUNTS],
    )
    return pod, ctr


def _plugin(node: SimNode) -> tuple[GpuPlugin, EngineConfig, InventoryCache]:
    config = EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root))
    inventory = InventoryCache(config)  # the real discovery, as `nri-gpu run` takes it
    return GpuPlugin(config, inventory, starter=_no_start), config, inventory


def _json_log_to_devnull(name: str = "nri_gpu.plugin.handlers", level: int = logging.DEBUG) -> Callable[[], None]:
    """Make the logger ``name`` log at ``level`` as ``nri-gpu run --log-format json``
    does, into /dev/null; returns the undo."""
    logger = logging.getLogger(name)
    sink = open(os.devnull, "w")  # closed by the undo
    handler = logging.StreamHandler(sink)
    handler.setFormatter(JsonFormatter())
    saved = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False

    def undo() -> None:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        sink.close()

    return undo


def _split_once(
    plugin: GpuPlugin,
    config: EngineConfig,
    inventory: InventoryCache,
    pod: api.PodSandbox,
    ctr: api.Container,
    times: dict[str, list[float]],
) -> None:
    """One CreateContainer, step by step, then whole (without and with its log line)."""
    clock, policy, handlers_log = time.perf_counter, config.policy, logging.getLogger("nri_gpu.plugin.handlers")
    t0 = clock()
    wanted = may_request(pod, ctr, policy)
    t1 = clock()
    times["may_request"].append((t1 - t0) * 1000)
    if wanted:
        request = parse_request(container_info(pod, ctr), policy).request
        t2 = clock()
        assert request is not None
        planned = make_plan(request, inventory.get(), config)
        t3 = clock()
        adjustment = to_adjustment(planned, ctr)
        t4 = clock()
        adjustment.SerializeToString()
        t5 = clock()
        for step, ms in (("parse", t2 - t1), ("plan", t3 - t2), ("encode", t4 - t3), ("serialize", t5 - t4)):
            times[step].append(ms * 1000)
    handlers_log.setLevel(logging.CRITICAL)
    t0 = clock()
    _drive(plugin.create_container(pod, ctr))
    t1 = clock()
    handlers_log.setLevel(logging.DEBUG)
    _drive(plugin.create_container(pod, ctr))
    t2 = clock()
    times["handler"].append((t1 - t0) * 1000)
    times["handler+log"].append((t2 - t1) * 1000)


def measure_create_split(node: SimNode, iterations: int) -> dict[str, dict[str, dict[str, float | int]]]:
    """Per nri-gpu variant, a summary (ms) of each step in ``SPLIT_STEPS``."""
    plugin, config, inventory = _plugin(node)
    out: dict[str, dict[str, dict[str, float | int]]] = {}
    undo = _json_log_to_devnull()
    try:
        for variant in (v for v in VARIANTS if v.plugin == "nri-gpu"):
            pod, ctr = _messages(dict(variant.annotations))
            times: dict[str, list[float]] = {step: [] for step in SPLIT_STEPS}
            for _ in range(iterations):
                _split_once(plugin, config, inventory, pod, ctr, times)
            out[variant.name] = {step: summarize(v).as_dict(4) for step, v in times.items() if v}
    finally:
        undo()
    return out


def _where(filename: str, line: int, func: str) -> str:
    path = Path(filename)
    try:
        shown = str(path.resolve().relative_to(_ROOT))
    except ValueError:
        shown = path.name  # the standard library or site-packages: the file name says enough
    return f"{shown}:{line}({func})" if line else func


def profile_create(node: SimNode, annotations: dict[str, str], iterations: int, top: int = 15) -> dict[str, Any]:
    """cProfile of ``GpuPlugin.create_container`` (with its JSON log line) over ``iterations``
    calls; the ``top`` functions by own time, with per-call figures in microseconds."""
    plugin, _, _ = _plugin(node)
    pod, ctr = _messages(annotations)
    _drive(plugin.create_container(pod, ctr))  # first-call costs (caches) out of the profile
    undo = _json_log_to_devnull()
    profiler = cProfile.Profile()
    try:
        profiler.enable()
        for _ in range(iterations):
            reply = _drive(plugin.create_container(pod, ctr))
            if reply is not None:
                reply.SerializeToString()
        profiler.disable()
    finally:
        undo()
    stats = pstats.Stats(profiler)
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = stats.stats  # type: ignore[attr-defined]
    total = sum(tt for (_, _, tt, _, _) in raw.values())
    rows = sorted(raw.items(), key=lambda item: item[1][2], reverse=True)[:top]
    return {
        "iterations": iterations,
        "total_us_per_call": round(total / iterations * 1e6, 1),
        "top_by_own_time": [
            {
                "function": _where(*key),
                "calls_per_call": round(nc / iterations, 2),
                "own_us_per_call": round(tt / iterations * 1e6, 2),
                "cumulative_us_per_call": round(ct / iterations * 1e6, 2),
            }
            for key, (_, nc, tt, ct, _) in rows
        ],
    }
