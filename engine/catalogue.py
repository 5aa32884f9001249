"""Which driver files each capability needs.  (pure)

The lists follow libnvidia-container's legacy mode, the one mode of the toolkit
that gave a container only what its ``NVIDIA_DRIVER_CAPABILITIES`` named (CDI
mode mounts every driver library into every GPU container). A library belongs
to the driver when its file name is ``<stem>.so.<driver version>``; that is how
a stale library from an older driver is kept out.
"""

from __future__ import annotations

import re

from nri_gpu.engine.model import Capability, EntryType

C = Capability

_UTILITY = frozenset({C.UTILITY})
# video needs the compute libraries too (NVENC/NVDEC sit on CUDA).
_COMPUTE = frozenset({C.COMPUTE, C.VIDEO})
_VIDEO = frozenset({C.VIDEO})
# display is graphics plus the modeset device.
_GRAPHICS = frozenset({C.GRAPHICS, C.DISPLAY})

# Library stem (file name up to ".so") -> capabilities that bring it.
LIBRARIES: dict[str, frozenset[Capability]] = {
    "libnvidia-ml": _UTILITY,
    "libnvidia-cfg": _UTILITY,
    "libnvidia-nscq": _UTILITY,
    "libcuda": _COMPUTE,
    "libcudadebugger": _COMPUTE,
    "libnvidia-opencl": _COMPUTE,
    # The GL and EGL cores need gpucomp too.
    "libnvidia-gpucomp": _COMPUTE | _GRAPHICS,
    "libnvidia-ptxjitcompiler": _COMPUTE,
    "libnvidia-fatbinaryloader": _COMPUTE,
    # GBM's backend (gbm/nvidia-drm_gbm.so) is the allocator too.
    "libnvidia-allocator": _COMPUTE | _GRAPHICS,
    "libnvidia-compiler": _COMPUTE,
    "libnvidia-pkcs11": _COMPUTE,
    "libnvidia-pkcs11-openssl3": _COMPUTE,
    "libnvidia-nvvm": _COMPUTE,
    "libnvidia-tileiras": _COMPUTE,
    "libvdpau_nvidia": _VIDEO,
    "libnvidia-encode": _VIDEO,
    "libnvidia-opticalflow": _VIDEO,
    "libnvcuvid": _VIDEO,
    "libnvidia-eglcore": _GRAPHICS,
    "libnvidia-glcore": _GRAPHICS,
    "libnvidia-tls": _GRAPHICS,
    "libnvidia-glsi": _GRAPHICS,
    "libnvidia-fbc": _GRAPHICS,
    "libnvidia-ifr": _GRAPHICS,
    "libnvidia-rtcore": _GRAPHICS,
    "libnvoptix": _GRAPHICS,
    "libGLX_nvidia": _GRAPHICS,
    "libEGL_nvidia": _GRAPHICS,
    "libGLESv2_nvidia": _GRAPHICS,
    "libGLESv1_CM_nvidia": _GRAPHICS,
    "libnvidia-glvkspirv": _GRAPHICS,
    "libnvidia-cbl": _GRAPHICS,
    "libnvidia-vulkan-producer": _GRAPHICS,
    "libnvidia-ngx": frozenset({C.NGX}),
}

# Graphics libraries with versions of their own (egl-gbm 1.1.2, egl-wayland 1.1.18):
# taken when the file name is ``<stem>.so.<digits>.<digits>[...]``, the toolkit's
# ``*.so.*.*`` (a SONAME link such as ``libnvidia-egl-gbm.so.1`` is not the file).
OWN_VERSION_LIBRARIES: dict[str, frozenset[Capability]] = {
    stem: frozenset({C.GRAPHICS, C.DISPLAY})
    for stem in (
        "libnvidia-egl-gbm",
        "libnvidia-egl-wayland",
        "libnvidia-egl-wayland2",
        "libnvidia-egl-xcb",
        "libnvidia-egl-xlib",
    )
}

# Binaries, looked up in these folders of the driver root, first match wins.
BINARY_FOLDERS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin", "/usr/local/sbin")
BINARIES: dict[str, frozenset[Capability]] = {
    "nvidia-smi": frozenset({C.UTILITY}),
    "nvidia-debugdump": frozenset({C.UTILITY}),
    "nvidia-persistenced": frozenset({C.UTILITY}),
    "nv-fabricmanager": frozenset({C.UTILITY}),
    "nvidia-cuda-mps-control": frozenset({C.COMPUTE}),
    "nvidia-cuda-mps-server": frozenset({C.COMPUTE}),
}

# IPC endpoints of daemons on the node: (path, what it must be, capabilities). Mounted
# read-only, nosuid, nodev, noexec (a client connects through a read-only mount), and
# only when nothing but root can change the path (``Root.root_only_stat``).
MPS_PIPE_DIRECTORY = "/tmp/nvidia-mps"  # in /tmp: handed out only when configured (engine.mps)
IPC: tuple[tuple[str, EntryType, frozenset[Capability]], ...] = (
    ("/run/nvidia-persistenced/socket", EntryType.SOCKET, frozenset({C.UTILITY})),
    ("/run/nvidia-fabricmanager/socket", EntryType.SOCKET, frozenset({C.UTILITY})),
    (MPS_PIPE_DIRECTORY, EntryType.DIRECTORY, frozenset({C.COMPUTE})),
)
IPC_TYPES: dict[str, EntryType] = {path: expected for path, expected, _ in IPC}

FIRMWARE_FOLDERS = ("/lib/firmware/nvidia", "/usr/lib/firmware/nvidia")

# Graphics, display and OpenCL configuration files, looked for as the toolkit does in
# the driver root's /etc, then $XDG_DATA_DIRS (/usr/local/share, /usr/share), first
# match wins, and mounted at the path where they were found. OpenCL's ICD goes with
# compute: an OpenCL application is a compute one, and the toolkit's CDI mode gives
# it to every GPU container.
GRAPHICS = frozenset({C.GRAPHICS, C.DISPLAY})
CONFIG_FOLDERS = ("/etc", "/usr/local/share", "/usr/share")
CONFIGS: tuple[tuple[str, frozenset[Capability]], ...] = (
    ("glvnd/egl_vendor.d/10_nvidia.json", GRAPHICS),
    ("egl/egl_external_platform.d/09_nvidia_wayland2.json", GRAPHICS),
    ("egl/egl_external_platform.d/10_nvidia_wayland.json", GRAPHICS),
    ("egl/egl_external_platform.d/15_nvidia_gbm.json", GRAPHICS),
    ("egl/egl_external_platform.d/20_nvidia_xcb.json", GRAPHICS),
    ("egl/egl_external_platform.d/20_nvidia_xlib.json", GRAPHICS),
    ("nvidia/nvoptix.bin", GRAPHICS),
    ("X11/xorg.conf.d/10-nvidia.conf", frozenset({C.DISPLAY})),
    ("X11/xorg.conf.d/nvidia-drm-outputclass.conf", frozenset({C.DISPLAY})),
    ("OpenCL/vendors/nvidia.icd", frozenset({C.COMPUTE})),
)
# Vulkan's ICD and layer files: looked for in the same folders and then at the driver
# root itself (GKE puts them at <root>/vulkan), and always mounted under /etc in the
# container, as the toolkit does: /etc comes before /usr/share in the loader's search.
VULKAN_CONFIG_FOLDER = "/etc"
VULKAN_CONFIGS = (
    "vulkan/icd.d/nvidia_icd.json",
    "vulkan/icd.d/nvidia_icd.x86_64.json",
    "vulkan/icd.d/nvidia_layers.json",
    "vulkan/implicit_layer.d/nvidia_layers.json",
)
# X.Org's driver and GLX module for display, the toolkit's list: under the driver's
# library folder first, then X.Org's usual module folders; first match wins.
XORG_MODULES = ("nvidia_drv.so", "libglxserver_nvidia.so.{version}")


def xorg_folders(library_folder: str | None) -> tuple[str, ...]:
    """Where X.Org modules are looked for; ``library_folder``: the 64-bit libcuda's.

    >>> xorg_folders("/usr/lib/x86_64-linux-gnu")[:2]
    ('/usr/lib/x86_64-linux-gnu/nvidia/xorg', '/usr/lib/x86_64-linux-gnu/xorg/modules/drivers')
    """
    subs = ("modules/drivers", "modules/extensions", "modules/updates/drivers", "modules/updates/extensions")
    bases = ["/usr/lib/xorg", "/usr/lib64/xorg", "/usr/X11R6/lib", "/usr/X11R6/lib64"]
    first = [] if library_folder is None else [f"{library_folder}/nvidia/xorg"]
    if library_folder is not None:
        bases.insert(0, f"{library_folder}/xorg")
    return tuple(first + [f"{base}/{sub}" for base in bases for sub in subs])


def library_stem(file_name: str) -> str | None:
    """``libcuda.so.550.163.01`` -> ``libcuda``; None if it is no shared-object name."""
    stem, sep, _ = file_name.partition(".so")
    return stem if sep and stem else None


def library_capabilities(file_name: str, driver_version: str) -> frozenset[Capability] | None:
    """The capabilities of a driver library file, or None if it is not one of this driver's.

    >>> sorted(c.value for c in library_capabilities("libcuda.so.550.163.01", "550.163.01"))
    ['compute', 'video']
    >>> library_capabilities("libcuda.so.535.54.03", "550.163.01") is None
    True
    """
    stem = library_stem(file_name)
    if stem is None or file_name != f"{stem}.so.{driver_version}":
        return None
    return LIBRARIES.get(stem)


def own_version_library_capabilities(file_name: str) -> frozenset[Capability] | None:
    """The capabilities of a graphics library that carries its own version, or None.

    >>> sorted(c.value for c in own_version_library_capabilities("libnvidia-egl-gbm.so.1.1.2"))
    ['display', 'graphics']
    >>> own_version_library_capabilities("libnvidia-egl-gbm.so.1") is None
    True
    """
    stem = library_stem(file_name)
    caps = OWN_VERSION_LIBRARIES.get(stem or "")
    parts = file_name[len(f"{stem}.so.") :].split(".") if caps is not None else []
    if caps is None or not file_name.startswith(f"{stem}.so.") or len(parts) < 2:
        return None
    return caps if all(p.isdigit() for p in parts) else None


def wanted_library_capabilities(capabilities: frozenset[Capability]) -> frozenset[Capability]:
    """The library capabilities a request needs; compat32 only changes the word size."""
    return frozenset(capabilities - {C.COMPAT32})


# Best effort, from the model name the driver prints, for NVIDIA_REQUIRE_* ``arch``
# and ``brand`` (NVML would know; we do not load it). Each pattern must match whole
# words of the name (``A10`` is not the start of ``A100``, ``RTX 40`` not of Quadro
# ``RTX 4000``, a Turing card); the first that matches wins, so the specific come
# before the general. Unknown stays None, which the requirement check treats as
# satisfied, as the toolkit does for a value it cannot read.
_ARCH = (
    (r"RTX [0-9]+ Ada", "8.9"),  # "NVIDIA RTX 4000 Ada Generation"
    (r"Quadro RTX [0-9]+", "7.5"),
    (r"GeForce RTX 40[0-9]0", "8.9"), (r"GeForce RTX 30[0-9]0", "8.6"), (r"GeForce RTX 20[0-9]0", "7.5"),
    (r"RTX A[0-9]+", "8.6"),
    (r"GB200|B200|B100", "10.0"),
    (r"GH200|H200|H100|H800", "9.0"),
    (r"L40S?|L4", "8.9"),
    (r"A100|A800|A30", "8.0"),
    (r"A40|A16|A10G?|A2", "8.6"),
    (r"T4", "7.5"),
    (r"V100", "7.0"), (r"P100", "6.0"),
)  # fmt: skip
_BRAND = (("GeForce", "geforce"), ("Quadro", "quadro"), ("Tesla", "tesla"), ("TITAN", "titan"))


def _words(pattern: str, flags: int = 0) -> re.Pattern[str]:
    """``pattern`` matching whole words only: no letter or digit just before or after."""
    return re.compile(rf"(?<![A-Za-z0-9])(?:{pattern})(?![A-Za-z0-9])", re.ASCII | flags)


_ARCH_RE = tuple((_words(pattern), arch) for pattern, arch in _ARCH)
_BRAND_RE = tuple((_words(word, re.IGNORECASE), brand) for word, brand in _BRAND)


def gpu_facts(model: str) -> tuple[str | None, str | None]:
    """(compute capability, brand) guessed from the model name; None where unknown.

    >>> gpu_facts("NVIDIA A100-SXM4-80GB"), gpu_facts("Tesla V100-SXM2-16GB"), gpu_facts("Mystery")
    (('8.0', None), ('7.0', 'tesla'), (None, None))
    """
    arch = next((value for pattern, value in _ARCH_RE if pattern.search(model)), None)
    brand = next((value for pattern, value in _BRAND_RE if pattern.search(model)), None)
    return arch, brand
