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

from . import debs, images

__all__ = ["COMPAT_VERSION", "IMAGE", "build_probe", "compat_image", "install_compat", "libcuda"]

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


IMAGE = "localhost/nri-gpu/cuda-compat:1"
_PROBE = r"""
#include <stdio.h>
#include <string.h>
int main(void) {
    char line[1024];
    FILE *maps = fopen("/proc/self/maps", "r");
    while (maps && fgets(line, sizeof line, maps))
        if (strstr(line, "libcuda")) { fputs(strrchr(line, ' ') + 1, stdout); return 0; }
    puts("no libcuda mapped");
    return 0;
}
"""


def build_probe(gcc: str, workdir: Path) -> Path:
    """``/probe``: linked against ``libcuda.so.1`` (a stub at build time, ``--no-as-needed``),
    it prints the path of the libcuda file glibc's loader mapped for it."""
    import subprocess

    (workdir / "stub.c").write_text("void cuInit(void) {}\n")
    stub = workdir / "libcuda.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub), str(workdir / "stub.c")],
                   check=True)  # fmt: skip
    (workdir / "probe.c").write_text(_PROBE)
    out = workdir / "probe"
    subprocess.run([gcc, "-o", str(out), str(workdir / "probe.c"), f"-L{workdir}", "-Wl,--no-as-needed", "-lcuda"],
                   check=True)  # fmt: skip
    return out


def compat_image(gcc: str) -> images.Image:
    """The glibc test image plus NVIDIA's real ``libcuda.so.555.58.02`` laid out as
    cuda-compat (``/usr/local/cuda -> cuda-12.5``) and ``/probe``; the image's own
    cache lists its libc only (the compat folder is in no conf file, as in nvidia/cuda)."""
    import tempfile

    lib = libcuda()

    def build(out: Path) -> tuple[str, str]:
        layer = images.glibc_layer()
        folder = "usr/local/cuda-12.5/compat"
        layer.file(f"{folder}/libcuda.so.{COMPAT_VERSION}", lib.read_bytes(), 0o644)
        layer.symlink(f"{folder}/libcuda.so.1", f"libcuda.so.{COMPAT_VERSION}")
        layer.symlink(f"{folder}/libcuda.so", "libcuda.so.1")
        layer.symlink("usr/local/cuda", "cuda-12.5")
        with tempfile.TemporaryDirectory() as tmp:
            layer.file("probe", build_probe(gcc, Path(tmp)).read_bytes(), 0o755)
        config = {"Env": [images._PATH], "Cmd": ["sh"], "WorkingDir": "/"}
        return IMAGE, images._write_layout(out, IMAGE, layer, config)

    return images._cached_build("cuda_compat", [*images.glibc_key(), str(lib).encode(), _PROBE.encode()], build)
