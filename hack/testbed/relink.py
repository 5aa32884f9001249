"""Run a dynamically linked binary from a newer Debian suite on this older machine.

podman 5.x from trixie and sid is built against glibc 2.38+ and libraries these
machines (bookworm, glibc 2.36) lack. ``LD_LIBRARY_PATH`` is not enough: the
program must also start under the newer suite's loader, and podman re-executes
itself (``/proc/self/exe``) and hands its environment to conmon and runc, so
neither an explicit ``ld-linux … podman`` call nor a changed environment survives.
Instead a copy of the binary gets the unpacked loader as its ELF interpreter and
the unpacked library folders as its ``DT_RPATH`` (searched for every library the
process loads, unlike ``DT_RUNPATH``, which serves only the binary's own
``NEEDED`` entries: libgpgme's libassuan would be missed). patchelf comes from
Debian too. The copy lives in the cache, one per input set, made once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from . import debs
from .cache import cache_dir

__all__ = ["RelinkError", "relink"]

_PATCHELF = ("patchelf", "bookworm", "0.14.3-*")


class RelinkError(debs.DebError):
    """patchelf failed, or the relinked binary does not start."""


def relink(binary: Path, loader: Path, library_dirs: Sequence[Path], *, check: Sequence[str] = ("--version",)) -> Path:
    """A copy of ``binary`` that starts under ``loader`` and finds its libraries in
    ``library_dirs`` first (then the machine's own), checked by running it with
    ``check``. Raises debs.DebUnavailable / debs.DebError from fetching patchelf."""
    rpath = ":".join(str(d) for d in library_dirs)
    key = hashlib.sha256("\0".join([str(binary), str(loader), rpath]).encode()).hexdigest()[:16]
    dest = cache_dir() / "relinked" / f"{binary.name}-{key}" / binary.name
    if dest.is_file():
        return dest
    patchelf = debs.extract(*_PATCHELF) / "usr/bin/patchelf"
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Patched beside the destination and renamed over it: a test run killed halfway
    # leaves no half-patched binary under the name the next run trusts.
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".relink-") as tmp:
        work = Path(tmp) / binary.name
        shutil.copy2(binary, work)
        done = subprocess.run(
            [str(patchelf), "--set-interpreter", str(loader), "--force-rpath", "--set-rpath", rpath, str(work)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise RelinkError(f"patchelf on {binary} failed: {done.stderr.strip()[-2000:]}")
        started = subprocess.run(
            [str(work), *check],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        )
        if started.returncode != 0:
            raise RelinkError(
                f"relinked {binary.name} does not start ({' '.join(check)} exited "
                f"{started.returncode}): {started.stderr.strip()[-2000:]}"
            )
        os.replace(work, dest)
    return dest
