"""The CUDA version the node's driver supports, as ``cuDriverGetVersion`` reports it.

Loading libcuda into the long-running plugin would map the driver's user-space
into it for good (and run its constructors there), so the call happens once, in
a short-lived child interpreter with an empty environment, isolated mode (no
site, no user paths), and a timeout; its output is read as the NVML probe's is
(``engine.drain.bounded_output``: bounded, and the whole process group killed at
the limit, so no process left holding the pipe keeps us waiting). The child
prints two integers.
"""

from __future__ import annotations

import logging
import subprocess
import sys

from nri_gpu.engine.drain import bounded_output

logger = logging.getLogger(__name__)

_MAX_OUTPUT = 4096  # two integers, or a traceback's last lines
_PROBE = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
version = ctypes.c_int(0)
rc = lib.cuDriverGetVersion(ctypes.byref(version))
print(rc, version.value)
"""


def format_cuda_version(value: int) -> str:
    """12040 -> "12.4" (the encoding is 1000 * major + 10 * minor).

    >>> format_cuda_version(12040), format_cuda_version(11080)
    ('12.4', '11.8')
    """
    return f"{value // 1000}.{(value % 1000) // 10}"


def read_cuda_version(libcuda: str, timeout: float = 10.0) -> tuple[str | None, str | None]:
    """(version, None) or (None, why not) for the libcuda at host path ``libcuda``."""
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _PROBE, libcuda],
            env={},
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a timeout kills its whole group
        )
    except OSError as exc:
        return None, f"cannot run the CUDA version probe on {libcuda}: {exc}"
    try:
        raw_out, raw_err = bounded_output(proc, timeout, _MAX_OUTPUT)
    except subprocess.TimeoutExpired:
        return None, f"cuDriverGetVersion probe of {libcuda} did not answer within {timeout:g} s; killed"
    if len(raw_out) > _MAX_OUTPUT or len(raw_err) > _MAX_OUTPUT:
        return None, f"cuDriverGetVersion probe of {libcuda} wrote more than {_MAX_OUTPUT} bytes; killed"
    fields = raw_out.decode(errors="replace").split()
    if proc.returncode != 0 or len(fields) != 2 or not all(f.lstrip("-").isdigit() for f in fields):
        detail = (raw_err.decode(errors="replace").strip().splitlines() or ["no output"])[-1][:200]
        return None, f"cuDriverGetVersion probe of {libcuda} failed (exit {proc.returncode}): {detail}"
    rc, value = int(fields[0]), int(fields[1])
    if rc != 0 or value <= 0:
        return None, f"cuDriverGetVersion in {libcuda} returned error {rc}"
    return format_cuda_version(value), None
