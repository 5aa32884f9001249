"""The graphics test image: glibc, Debian's Vulkan loader and the X11 client libraries
NVIDIA's Vulkan ICD (``libGLX_nvidia.so.0``) links against, and ``vkprobe``.

``localhost/nri-gpu/vulkan:1`` is the glibc image (bookworm's libc6) plus bookworm's
``libvulkan1`` (the Khronos loader, 1.3.239) and ``libx11-6``, ``libxext6`` with their
dependencies: what a Vulkan application's image has. It has no NVIDIA file: every one
the loader finds comes from nri-gpu. ``/usr/local/bin/vkprobe`` (``vkprobe.c``, built
here with gcc) calls ``vkCreateInstance`` and ``vkEnumeratePhysicalDevices`` through
the loader; run with ``VK_LOADER_DEBUG=all`` the loader says which ICD manifests it
found and what became of each, and ``LD_DEBUG=files`` shows which driver libraries
were loaded.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from . import debs
from .images import _PATH, Image, _add_tree, _cached_build, _write_layout, glibc_key, glibc_layer

__all__ = ["IMAGE", "PROBE", "vulkan_image"]

IMAGE = "localhost/nri-gpu/vulkan:1"
PROBE = "/usr/local/bin/vkprobe"
_PROBE_C = Path(__file__).with_name("vkprobe.c")
# (package, suite, version): bookworm's, to match the glibc image's libc6 2.36.
DEBS = (
    ("libvulkan1", "bookworm", "1.3.239.0-*"),
    ("libx11-6", "bookworm", "2:1.8.4-*"),
    ("libxext6", "bookworm", "2:1.3.4-*"),
    ("libxcb1", "bookworm", "1.15-*"),
    ("libxau6", "bookworm", "1:1.0.9-*"),
    ("libxdmcp6", "bookworm", "1:1.1.2-*"),
    ("libbsd0", "bookworm", "0.11.7-*"),
    ("libmd0", "bookworm", "1.0.4-*"),
)


def vulkan_image(gcc: str) -> Image:
    """The image, built on first use with ``gcc``. Raises debs.DebUnavailable offline
    with the packages not cached."""
    trees = [debs.extract(*deb) for deb in DEBS]
    gcc_version = subprocess.run([gcc, "--version"], capture_output=True).stdout
    key = [Path(__file__).read_bytes(), _PROBE_C.read_bytes(), gcc_version, *glibc_key()]
    key += [str(tree).encode() for tree in trees]

    def build(out: Path) -> tuple[str, str]:
        layer = glibc_layer()
        for tree in trees:
            _add_tree(layer, tree)
        with tempfile.TemporaryDirectory() as tmp:
            probe = Path(tmp) / "vkprobe"
            subprocess.run([gcc, "-O2", "-o", str(probe), str(_PROBE_C), "-ldl"], check=True, capture_output=True)
            layer.file(PROBE.lstrip("/"), probe.read_bytes(), 0o755)
        config = {"Env": [_PATH], "Cmd": ["sh"], "WorkingDir": "/"}
        return IMAGE, _write_layout(out, IMAGE, layer, config)

    return _cached_build("vulkan", key, build)
