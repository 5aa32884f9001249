"""Container-start work inside the container's mount namespace (NRI StartContainer).

``start_work(plan, container, proc_root)`` takes what a plan leaves for start
time; ``await run_start_async(pid, work)`` does it in a forked worker: the
GPU-restricted ``/proc/driver/nvidia`` view, the library symlinks,
``/etc/ld.so.conf.d/00-nri-gpu.conf`` and the ld.so cache (the driver's entries
merged into the image's, or rebuilt by the host's static ldconfig, confined).
Failures raise ``engine.errors.StartError``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names as the type checker sees them; loaded lazily below
    from nri_gpu.engine.start.runner import (
        DEFAULT_LDCONFIG,
        DEFAULT_TIMEOUT,
        find_init_pid,
        run_start_async,
        shows_driver_view,
    )
    from nri_gpu.engine.start.work import StartReport, StartWork, start_work

# Loaded on first use (PEP 562): a command that plans (``nri-gpu plan``) does not
# pay for the NRI path's forked runner, which imports asyncio.
_EXPORTS = {
    "DEFAULT_LDCONFIG": "nri_gpu.engine.start.runner",
    "DEFAULT_TIMEOUT": "nri_gpu.engine.start.runner",
    "find_init_pid": "nri_gpu.engine.start.runner",
    "run_start_async": "nri_gpu.engine.start.runner",
    "shows_driver_view": "nri_gpu.engine.start.runner",
    "StartReport": "nri_gpu.engine.start.work",
    "StartWork": "nri_gpu.engine.start.work",
    "start_work": "nri_gpu.engine.start.work",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'nri_gpu.engine.start' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "DEFAULT_LDCONFIG",
    "DEFAULT_TIMEOUT",
    "StartReport",
    "StartWork",
    "find_init_pid",
    "run_start_async",
    "shows_driver_view",
    "start_work",
]
