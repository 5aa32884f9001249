"""A simulated ``libnvidia-ml.so.1`` (``nvmlsim.c``), built with gcc on first use.

The library exports the NVML calls ``engine.nvml``'s probe makes, with NVML's ABI,
and answers from ``nvml-sim.txt`` in its own folder (format in ``nvmlsim.c``;
``description`` writes it). ``gpunode.build_node(mig=...)`` installs it in place of
the real 64-bit ``libnvidia-ml.so.550.163.01``, which without a kernel driver can
only say "Driver Not Loaded".

The build is cached under ``<cache>/nvmlsim/<hash of the source and flags>/``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .cache import cache_dir, locked

__all__ = ["DESCRIPTION", "SOURCE", "SimNvmlGpu", "SimNvmlMig", "description", "library"]

SOURCE = Path(__file__).with_name("nvmlsim.c")
DESCRIPTION = "nvml-sim.txt"
_FLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-fvisibility=hidden", "-Wl,-soname,libnvidia-ml.so.1")


@dataclass(frozen=True)
class SimNvmlMig:
    """A MIG device as the simulated NVML lists it: raw index ``j`` of ``i:j``."""

    index: int
    uuid: str
    gi: int
    ci: int


@dataclass(frozen=True)
class SimNvmlGpu:
    uuid: str
    minor: int
    mig: tuple[bool, bool] | None  # (current, pending); None: MIG not supported
    mig_devices: tuple[SimNvmlMig, ...] = ()
    max_mig_devices: int = 7


def description(gpus: Sequence[SimNvmlGpu], *, init_rc: int = 0, init_sleep_ms: int = 0) -> str:
    """The text of ``nvml-sim.txt``: GPUs by NVML index (their position)."""
    lines = ["# simulated NVML (hack/testbed/nvmlsim.c)", f"init {init_rc} {init_sleep_ms}"]
    for gpu in gpus:
        cur, pend = (-1, -1) if gpu.mig is None else (int(gpu.mig[0]), int(gpu.mig[1]))
        lines.append(f"gpu {gpu.uuid} {gpu.minor} {cur} {pend} {gpu.max_mig_devices}")
    for i, gpu in enumerate(gpus):
        lines += [f"mig {i} {m.index} {m.uuid} {m.gi} {m.ci}" for m in gpu.mig_devices]
    return "\n".join(lines) + "\n"


def library() -> Path:
    """The built library (cached; compiled with gcc the first time)."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + "\0".join(_FLAGS).encode()).hexdigest()[:12]
    base = cache_dir() / "nvmlsim"
    built = base / key / "libnvidia-ml-sim.so"
    if built.is_file():
        return built
    with locked(base / ".lock"):
        if built.is_file():
            return built
        tmp = Path(tempfile.mkdtemp(dir=base, prefix=".build-"))
        try:
            cmd = ["gcc", *_FLAGS, "-o", str(tmp / built.name), str(SOURCE)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr}")
            os.chmod(tmp, 0o755)
            os.replace(tmp, built.parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return built
