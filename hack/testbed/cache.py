"""Where the test bed keeps what it downloads and builds.

Everything the end-to-end tests need (Debian packages, images, generated CRI stubs)
is expensive to produce and identical between runs, so it lives in one cache
directory that outlives a checkout: CI runs on a clean clone but keeps the cache.

Order of precedence: ``$NRI_GPU_CACHE``, then ``$XDG_CACHE_HOME/nri-gpu``, then
``~/.cache/nri-gpu``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["cache_dir", "locked"]


def cache_dir() -> Path:
    """Return the cache directory, creating it if needed."""
    env = os.environ.get("NRI_GPU_CACHE")
    if env:
        path = Path(env)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        path = Path(xdg) / "nri-gpu" if xdg else Path.home() / ".cache" / "nri-gpu"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def locked(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``lock_file``.

    Several pytest processes (or a test run and ``hack/fetch-runtimes``) may fill the
    same cache at once; the lock serialises apt runs and builds of one item, while
    the atomic renames done by the callers keep readers safe without a lock.
    """
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
