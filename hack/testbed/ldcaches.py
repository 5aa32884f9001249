"""ld.so.cache files written by the REAL glibc ldconfig, as inputs for parser tests.

A parser tested only against caches its authors wrote by hand agrees with its authors,
not with glibc. ``real_cache(kind)`` returns the bytes of a cache that this machine's
``ldconfig`` wrote for the library directories of the simulated node's driver tree
(``gpunode.driver_tree()``: the NVIDIA 550.163.01 libraries, 64-bit and i386, their
SONAME and ``.so`` links, and zlib), run as ``ldconfig -X -c FORMAT -r TREE``.

Kinds (all four are possible with the glibc 2.36 of Debian 12; glibc 2.32 only changed
the DEFAULT from ``compat`` to ``new``, writing the old format still works):

* ``"new"``:    ``glibc-ld.so.cache1.1`` only (the default since glibc 2.32).
* ``"old"``:    ``ld.so-1.7.0`` only (libc5-era format: no hwcap extension, no
                generator string).
* ``"compat"``: an ``ld.so-1.7.0`` table FOLLOWED by a complete ``glibc-ld.so.cache1.1``
                one (the default before 2.32; what long-lived hosts may still carry).
                Its string offsets are relative to the start of the new-format header.
* ``"new-hwcaps"``: ``new`` with one more library under
                ``usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/`` (zlib), so the
                cache carries the extension section with the hwcaps subdirectory names.

The caches are kept under ``<cache>/ldcaches/`` keyed by kind, the driver tree and the
``ldconfig --version`` line: the first call per kind takes ~0.1 s (plus the driver tree
on a fresh machine), later ones read a file. ``print_cache(data)`` gives what glibc's own
reader (``ldconfig -p -C``) makes of a cache: the reference answer for a parser.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import gpunode
from .cache import cache_dir, locked

__all__ = ["KINDS", "CacheEntry", "print_cache", "real_cache"]

KINDS = ("new", "old", "compat", "new-hwcaps")
_LIB_DIRS = (gpunode.LIB64, gpunode.LIB32)
_HWCAPS_DIR = f"{gpunode.LIB64}/glibc-hwcaps/x86-64-v3"


@dataclass(frozen=True)
class CacheEntry:
    """One line of ``ldconfig -p``: ``libcuda.so.1 (libc6,x86-64) => /usr/lib/...``."""

    soname: str
    flags: str  # as ldconfig prints them: "libc6,x86-64", "libc6", "libc6,x86-64, hwcap: \"x86-64-v3\""
    path: str


def real_cache(kind: str, tree: Path | None = None) -> bytes:
    """The bytes of an ld.so.cache of format ``kind`` (see KINDS) written by the real
    ldconfig. Raises ValueError for an unknown kind. ``tree``: the driver root whose
    libraries it lists: by default NVIDIA's (downloaded once; the cache is kept), else
    one such as ``gpunode.FIXTURE_DRIVER``, written anew at each call (nothing fetched)."""
    if kind not in KINDS:
        raise ValueError(f"unknown ld.so.cache kind {kind!r}; known: {', '.join(KINDS)}")
    if tree is not None:
        return _build(tree, kind)
    tree = gpunode.driver_tree()
    key = hashlib.sha256(f"{kind}|{tree.name}|{gpunode.ldconfig_version()}".encode()).hexdigest()[:12]
    base = cache_dir() / "ldcaches"
    out = base / f"{kind}-{key}.cache"
    if out.is_file():
        return out.read_bytes()
    with locked(base / ".lock"):
        if out.is_file():
            return out.read_bytes()
        data = _build(tree, kind)
        tmp = out.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, out)
    return data


def _build(tree: Path, kind: str) -> bytes:
    with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=".ldcache-") as tmp:
        root = Path(tmp)
        for libdir in _LIB_DIRS:
            (root / libdir).mkdir(parents=True, exist_ok=True)
            if not (tree / libdir).is_dir():
                continue  # the fixture has no i386 libraries
            # Only the libraries and their links: ldconfig reads the ELF headers (hard
            # links, so no copying); subdirectories other than glibc-hwcaps are not scanned.
            for src in (tree / libdir).iterdir():
                if src.is_symlink():
                    gpunode._symlink(os.readlink(src), root / libdir / src.name)
                elif src.is_file():
                    gpunode._link_or_copy(src, root / libdir / src.name)
        if kind == "new-hwcaps":
            real = (tree / gpunode.LIB64 / "libz.so.1").resolve()
            gpunode._link_or_copy(real, root / _HWCAPS_DIR / real.name)
            gpunode._symlink(real.name, root / _HWCAPS_DIR / "libz.so.1")
        gpunode._write_ld_so_conf(root, _LIB_DIRS)
        gpunode.run_ldconfig(root, "-c", "new" if kind == "new-hwcaps" else kind)
        return (root / "etc/ld.so.cache").read_bytes()


_LINE = re.compile(r"^\t(\S+) \((.*)\) => (.*)$")


def print_cache(data: bytes) -> list[CacheEntry]:
    """Entries of a cache as glibc's reader lists them (``ldconfig -p -C``), in its order."""
    with tempfile.NamedTemporaryFile(prefix="ld.so.cache-") as fh:
        fh.write(data)
        fh.flush()
        proc = subprocess.run([gpunode.ldconfig_binary(), "-p", "-C", fh.name], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ldconfig -p failed: {proc.stderr.strip()}")
    entries = []
    for line in proc.stdout.splitlines():
        m = _LINE.match(line)
        if m:
            entries.append(CacheEntry(*m.groups()))
    return entries


def _main() -> None:  # python -m testbed.ldcaches: write each kind next to the cwd
    for kind in KINDS:
        data = real_cache(kind)
        Path(f"ld.so.cache.{kind}").write_bytes(data)
        print(f"ld.so.cache.{kind}: {len(data)} bytes, {len(print_cache(data))} entries")


if __name__ == "__main__":
    _main()
