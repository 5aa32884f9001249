"""An image holding NVIDIA's CUDA runtime from its PyPI wheel, and a probe that asks it
for the driver.

``nvidia-cuda-runtime-cu12`` (what ``pip install torch`` brings) ships
``libcudart.so.12``, which finds the driver by ``dlopen("libcuda.so.1")``: through the
container's ld.so cache, the way a pip-installed framework finds it. ``/probe``
loads it from ``/opt/cudart`` and prints ``cudaDriverGetVersion`` (0 when no
libcuda was found; 12040 for the simulated node's 550.163.01, which needs no device)
and ``cudaRuntimeGetVersion``.

The wheel is downloaded once with pip (``--no-deps``, binary only), checked against
the SHA256 pinned here, and kept under ``<cache>/wheels/``.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from . import images
from .cache import cache_dir, locked

__all__ = ["DRIVER_API", "IMAGE", "cudart_image"]

IMAGE = "localhost/nri-gpu/cudart:1"
DRIVER_API = 12040  # cudaDriverGetVersion of driver 550.163.01 (CUDA 12.4)
_WHEEL = "nvidia_cuda_runtime_cu12-12.4.127-py3-none-manylinux2014_x86_64.whl"
_SHA256 = "64403288fa2136ee8e467cdc9c9427e0434110899d07c779f25b5c068934faa5"
_PROBE = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *rt = dlopen("/opt/cudart/libcudart.so.12", RTLD_NOW);
    if (!rt) { printf("dlopen: %s\n", dlerror()); return 2; }
    int (*driver)(int *) = (int (*)(int *))dlsym(rt, "cudaDriverGetVersion");
    int (*runtime)(int *) = (int (*)(int *))dlsym(rt, "cudaRuntimeGetVersion");
    int d = -1, r = -1;
    int rc = driver(&d);
    runtime(&r);
    printf("driver %d runtime %d rc %d\n", d, r, rc);
    return 0;
}
"""


def _wheel() -> Path:
    store = cache_dir() / "wheels"
    path = store / _WHEEL
    with locked(store / ".cudart.lock"):
        if not path.is_file():
            version = _WHEEL.split("-")[1]
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--no-deps",
                    "--only-binary",
                    ":all:",
                    "--platform",
                    "manylinux2014_x86_64",
                    "--python-version",
                    "3.11",
                    f"nvidia-cuda-runtime-cu12=={version}",
                    "-d",
                    str(store),
                ],
                check=True,
            )
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != _SHA256:
        raise RuntimeError(f"{path}: sha256 {digest}, expected {_SHA256}")
    return path


def cudart_image(gcc: str) -> images.Image:
    """The glibc test image plus ``/opt/cudart/libcudart.so.12`` and ``/probe``.

    Raises subprocess.CalledProcessError when pip or gcc fails."""
    with zipfile.ZipFile(_wheel()) as wheel:
        lib = wheel.read("nvidia/cuda_runtime/lib/libcudart.so.12")

    def build(out: Path) -> tuple[str, str]:
        layer = images.glibc_layer()
        layer.file("opt/cudart/libcudart.so.12", lib, 0o755)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "probe.c").write_text(_PROBE)
            subprocess.run([gcc, "-o", f"{tmp}/probe", f"{tmp}/probe.c", "-ldl"], check=True)
            layer.file("probe", Path(tmp, "probe").read_bytes(), 0o755)
        config: dict[str, object] = {"Env": [images._PATH], "Cmd": ["sh"], "WorkingDir": "/"}
        return IMAGE, images._write_layout(out, IMAGE, layer, config)

    return images._cached_build("cudart", [*images.glibc_key(), _SHA256.encode(), _PROBE.encode()], build)
