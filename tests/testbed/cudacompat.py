"""A real newer CUDA driver library for the CUDA forward-compatibility tests.

NVIDIA's ``cuda-compat`` package is not in Debian; its content is: the user-space
driver libraries of a newer driver in ``/usr/local/cuda/compat``. Debian
experimental has driver 555.58.02 (``libcuda1`` ``555.58.02-*``, non-free): its
``libcuda.so.555.58.02`` is newer than the simulated node's 550.163.01 and has
no ``.note.cuda.fwd_compatibility`` (the "compat major > host major" rule).
Fetched with ``apt-get download`` into the test bed's private cache (``debs``),
never installed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from . import debs

__all__ = ["COMPAT_VERSION", "install_compat", "libcuda"]

COMPAT_VERSION = "555.58.02"
_SUITE = "experimental"
_COMPONENTS = ("non-free",)


def libcuda() -> Path:
    """The real ``libcuda.so.555.58.02`` (raises ``debs.DebUnavailable`` offline with nothing cached)."""
    tree = debs.extract("libcuda1", _SUITE, f"{COMPAT_VERSION}-*", components=_COMPONENTS)
    found = sorted(tree.rglob(f"libcuda.so.{COMPAT_VERSION}"))
    if not found:
        raise debs.DebError(f"libcuda1 {COMPAT_VERSION}: no libcuda.so.{COMPAT_VERSION} in {tree}")
    return found[0]


def install_compat(rootfs: Path, *, cuda: str = "cuda-12.5") -> Path:
    """Lay out ``/usr/local/<cuda>/compat`` as the cuda-compat package does
    (``libcuda.so.<v>``, ``libcuda.so.1 -> libcuda.so.<v>``, ``libcuda.so -> libcuda.so.1``)
    and ``/usr/local/cuda -> <cuda>`` as nvidia/cuda images do; the compat folder."""
    folder = rootfs / "usr/local" / cuda / "compat"
    folder.mkdir(parents=True)
    shutil.copy(libcuda(), folder / f"libcuda.so.{COMPAT_VERSION}")
    os.symlink(f"libcuda.so.{COMPAT_VERSION}", folder / "libcuda.so.1")
    os.symlink("libcuda.so.1", folder / "libcuda.so")
    os.symlink(cuda, rootfs / "usr/local/cuda")
    return folder
