"""Graphics and display: the GPUs' DRM nodes, the links and the application profile.  (pure)

What ``graphics`` or ``display`` add to a plan besides their libraries and files
(``engine.catalogue``: ``LIBRARIES``, ``OWN_VERSION_LIBRARIES``, ``CONFIGS``,
``VULKAN_CONFIGS``, ``XORG_MODULES``), for the whole GPUs the container gets:

* each GPU's DRM nodes, ``/dev/dri/card<n>`` and ``/dev/dri/renderD<n>`` (Vulkan
  WSI, EGL devices, GBM and X.Org open them), found at discovery through
  ``/dev/dri/by-path/pci-<bus>-card`` and ``-render``; a GPU without them
  (``nvidia-drm`` not loaded) is a note, not a refusal: headless EGL and Vulkan
  work without them;
* the links the installer makes and no ldconfig would: ``gbm/nvidia-drm_gbm.so ->
  ../libnvidia-allocator.so.1`` (Mesa's GBM finds NVIDIA's backend by that name)
  and, with display, ``libglxserver_nvidia.so -> libglxserver_nvidia.so.<version>``
  (X.Org loads the GLX module by its short name);
* when the container gets some of the node's GPUs but not all of them, NVIDIA's
  application profile ``EGLVisibleDGPUDevices``, written at start to
  ``APP_PROFILE_PATH`` in the container, as libnvidia-container does: EGL and
  Vulkan enumerate devices through ``/dev/nvidia<minor>`` nodes and the driver's
  ``/proc`` view, and the profile keeps them to the granted ones (a bit per device
  minor). It is a hint the driver's user-space reads, not a boundary: the device
  nodes are.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from nri_gpu.engine.model import Capability, DeviceNode, DriverFile, FileKind, Gpu, Inventory, Library, Symlink

__all__ = ["APP_PROFILE_PATH", "MAX_PROFILE_MINOR", "GraphicsPlan", "app_profile_text", "plan_graphics"]

APP_PROFILE_PATH = "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf"
# The driver documents EGLVisibleDGPUDevices as a 32-bit mask.
MAX_PROFILE_MINOR = 31
_GRAPHICS = frozenset({Capability.GRAPHICS, Capability.DISPLAY})


@dataclass(frozen=True)
class GraphicsPlan:
    devices: tuple[DeviceNode, ...] = ()
    symlinks: tuple[Symlink, ...] = ()
    app_profile: str = ""
    notes: tuple[str, ...] = ()


def app_profile_text(minors: tuple[int, ...]) -> str:
    """The profile that shows EGL and Vulkan the devices ``minors`` only; libnvidia-container's
    text (the driver's JSON reader takes the hexadecimal mask).

    >>> print(app_profile_text((0, 2)), end="")
    {"profiles": [{"name": "_container_", "settings": ["EGLVisibleDGPUDevices", 0x5]}],
     "rules": [{"pattern": [], "profile": "_container_"}]}
    """
    mask = 0
    for minor in minors:
        mask |= 1 << minor
    return (
        f'{{"profiles": [{{"name": "_container_", "settings": ["EGLVisibleDGPUDevices", {mask:#x}]}}],\n'
        ' "rules": [{"pattern": [], "profile": "_container_"}]}\n'
    )


def plan_graphics(
    caps: frozenset[Capability],
    gpus: tuple[Gpu, ...],
    inventory: Inventory,
    libraries: tuple[Library, ...],
    files: tuple[DriverFile, ...],
) -> GraphicsPlan:
    """The DRM nodes, links and profile for the whole GPUs ``gpus`` given with ``caps``;
    ``libraries`` and ``files``: those the plan mounts."""
    if not caps & _GRAPHICS:
        return GraphicsPlan()
    devices: list[DeviceNode] = []
    notes: list[str] = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        nodes = inventory.drm_nodes(gpu.bus_id)
        if nodes is None:
            notes.append(
                f"GPU {gpu.index} ({gpu.bus_id}) has no DRM nodes (/dev/dri/by-path/pci-{gpu.bus_id}-card, -render; "
                "is nvidia-drm loaded?): graphics without /dev/dri"
            )
        else:
            devices.extend(nodes)
    links: list[Symlink] = []
    allocator = next((lib for lib in libraries if lib.soname == "libnvidia-allocator.so.1" and lib.is_64bit), None)
    if allocator is not None:
        links.append(Symlink(posixpath.join(allocator.folder, "gbm/nvidia-drm_gbm.so"), "../libnvidia-allocator.so.1"))
    for f in files:
        name = posixpath.basename(f.path)
        if f.kind is FileKind.XORG and name.startswith("libglxserver_nvidia.so."):
            links.append(Symlink(posixpath.join(posixpath.dirname(f.path), "libglxserver_nvidia.so"), name))
    profile = ""
    if gpus and len(gpus) < len(inventory.gpus):
        minors = tuple(sorted(g.minor for g in gpus))
        if max(minors) > MAX_PROFILE_MINOR:
            notes.append(
                f"no EGLVisibleDGPUDevices application profile: device minor {max(minors)} is past the "
                f"driver's 32-bit mask; EGL and Vulkan may list the node's other GPUs (they cannot open them)"
            )
        else:
            profile = app_profile_text(minors)
    return GraphicsPlan(tuple(devices), tuple(links), profile, tuple(notes))
