"""The CUDA version the node's driver supports, as ``cuDriverGetVersion`` reports it.

Loading libcuda into the long-running plugin would map the driver's user-space
into it for good (and run its constructors there), so the call happens once, in
a short-lived child interpreter with an empty environment, isolated mode (no
site, no user paths), and a timeout. The child prints one integer.
"""

from __future__ import annotations

import logging
import subprocess
import sys

logger = logging.getLogger(__name__)

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
        proc = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _PROBE, libcuda],
            env={},
            cwd="/",
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"cannot run the CUDA version probe on {libcuda}: {exc}"
    fields = proc.stdout.split()
    if proc.returncode != 0 or len(fields) != 2 or not all(f.lstrip("-").isdigit() for f in fields):
        detail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"cuDriverGetVersion probe of {libcuda} failed (exit {proc.returncode}): {detail}"
    rc, value = int(fields[0]), int(fields[1])
    if rc != 0 or value <= 0:
        return None, f"cuDriverGetVersion in {libcuda} returned error {rc}"
    return format_cuda_version(value), None
