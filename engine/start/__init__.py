"""Container-start work inside the container's mount namespace (NRI StartContainer).

``start_work(plan, container, proc_root)`` takes what a plan leaves for start
time; ``run_start(pid, work)`` / ``await run_start_async(pid, work)`` does it in a
forked worker: the GPU-restricted ``/proc/driver/nvidia`` view, the library
symlinks, ``/etc/ld.so.conf.d/00-nri-gpu.conf`` and the ld.so cache (the driver's
entries merged into the image's, or rebuilt by the host's static ldconfig, confined).
Failures raise ``engine.errors.StartError``.
"""

from engine.start.runner import (
    DEFAULT_LDCONFIG,
    DEFAULT_TIMEOUT,
    find_init_pid,
    run_start,
    run_start_async,
    shows_driver_view,
)
from engine.start.work import StartReport, StartWork, start_work

__all__ = [
    "DEFAULT_LDCONFIG",
    "DEFAULT_TIMEOUT",
    "StartReport",
    "StartWork",
    "find_init_pid",
    "run_start",
    "run_start_async",
    "shows_driver_view",
    "start_work",
]
