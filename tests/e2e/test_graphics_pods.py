"""Graphics on real containerd 1.7.24 and 2.1.9: a container asking for ``graphics``
on one GPU of the simulated 4-GPU node runs Debian's Vulkan loader (``vkprobe``,
hack/testbed/vulkan_image.py), which finds the NVIDIA ICD manifest nri-gpu mounted,
loads NVIDIA's ``libGLX_nvidia.so.0`` and its driver libraries, and fails only for
want of a kernel driver (``VK_ERROR_INCOMPATIBLE_DRIVER``), as nvidia-smi does. The
container has the DRM nodes of exactly its GPU and the ``EGLVisibleDGPUDevices``
profile with that GPU's minor; a compute container gets the OpenCL ICD and none of
the graphics files."""

from __future__ import annotations

import pytest

from nri_gpu.engine.graphics import APP_PROFILE_PATH, app_profile_text
from testbed import images
from testbed.cri import CriClient
from testbed.gpunode import DRM_MAJOR, SimNode
from testbed.plugins import NriGpuProcess
from testbed.vulkan_image import IMAGE, PROBE, vulkan_image

from .conftest import Testbed, probe_image

LIB = "/usr/lib/x86_64-linux-gnu"
ICD = "/etc/vulkan/icd.d/nvidia_icd.json"
GRAPHICS_FILES = (
    ICD,
    "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
    "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
    "/usr/share/nvidia/nvoptix.bin",
    f"{LIB}/libGLX_nvidia.so.0",
    f"{LIB}/libnvidia-egl-gbm.so.1",
)
VK_ERROR_INCOMPATIBLE_DRIVER = -9


@pytest.fixture(scope="module")
def image(containerd: Testbed) -> images.Image:
    return probe_image(containerd, vulkan_image, "the Vulkan image")


def container(cri: CriClient, name: str, env: dict[str, str]) -> str:
    pod = cri.run_pod(name)
    return cri.run_container(pod, "main", ["sh", "-c", "sleep 3600"], image=IMAGE, env=env)


def sh(cri: CriClient, cid: str, script: str) -> str:
    code, out, err = cri.exec_sync(cid, ["sh", "-c", script])
    assert code == 0, f"{script!r} failed ({code}): {err}"
    return out


def test_vulkan_loads_nvidias_icd_and_fails_only_for_the_kernel_driver(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode, image: images.Image
) -> None:
    gpu = node.gpus[2]
    cid = container(cri, "vulkan", {"NVIDIA_VISIBLE_DEVICES": "2", "NVIDIA_DRIVER_CAPABILITIES": "graphics"})
    code, out, err = cri.exec_sync(cid, ["env", "VK_LOADER_DEBUG=all", "LD_DEBUG=files", PROBE])
    log = out + err
    assert code == 1, log
    assert f"vkCreateInstance: {VK_ERROR_INCOMPATIBLE_DRIVER}" in out, log
    # The loader found the manifest nri-gpu mounted and loaded the library it names ...
    assert f"Found ICD manifest file {ICD}" in log, log
    assert "Searching for ICD drivers named libGLX_nvidia.so.0" in log, log
    assert f"file=libGLX_nvidia.so.0 [0];  dynamically loaded by {LIB}/libvulkan.so.1" in log, log
    for needed in ("libnvidia-glcore", "libnvidia-glsi", "libnvidia-tls"):
        assert f"file={needed}.so.550.163.01 [0];  needed by {LIB}/libGLX_nvidia.so.0" in log, needed
    assert f"calling init: {LIB}/libGLX_nvidia.so.0" in log, log
    # ... whose entry points answered; the ICD then declined: no kernel driver here.
    assert "cannot open shared object file" not in log, log
    assert "Ignoring this JSON" not in log, log
    assert "Could not get 'vkCreateInstance' via 'vk_icdGetInstanceProcAddr' for ICD libGLX_nvidia.so.0" in log, log

    # The DRM nodes of GPU 2 and no other, and the profile naming its minor alone.
    dri = sh(cri, cid, "ls /dev/dri").split()
    expected = [rel.split("/")[1] for rel, _, _, _ in node.drm_nodes(gpu)]
    assert sorted(dri) == sorted(expected) == ["card3", "renderD130"], dri
    listing = sh(cri, cid, "ls -l /dev/dri/card3 /dev/dri/renderD130")
    assert f"{DRM_MAJOR},   3" in listing and f"{DRM_MAJOR}, 130" in listing, listing
    assert sh(cri, cid, f"cat {APP_PROFILE_PATH}") == app_profile_text((gpu.minor,))
    assert gpu.minor != 2 and f'"EGLVisibleDGPUDevices", {1 << gpu.minor:#x}]' in app_profile_text((gpu.minor,))
    sh(cri, cid, "test ! -e /etc/OpenCL/vendors/nvidia.icd")  # OpenCL is compute's


def test_a_compute_container_gets_the_opencl_icd_and_no_graphics(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, image: images.Image
) -> None:
    cid = container(cri, "compute", {"NVIDIA_VISIBLE_DEVICES": "2", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"})
    assert "libnvidia-opencl.so.1" in sh(cri, cid, "cat /etc/OpenCL/vendors/nvidia.icd")
    for path in (*GRAPHICS_FILES, "/dev/dri", APP_PROFILE_PATH):
        sh(cri, cid, f"test ! -e {path}")
    code, out, err = cri.exec_sync(cid, ["env", "VK_LOADER_DEBUG=all", PROBE])
    assert code == 1 and f"vkCreateInstance: {VK_ERROR_INCOMPATIBLE_DRIVER}" in out, out + err
    assert "Found no drivers" in err and "nvidia_icd.json" not in err, err


def test_every_gpu_with_display_gets_every_drm_node_and_no_profile(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode, image: images.Image
) -> None:
    cid = container(cri, "display", {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "display"})
    dri = sorted(sh(cri, cid, "ls /dev/dri").split())
    assert dri == sorted(rel.split("/")[1] for g in node.gpus for rel, _, _, _ in node.drm_nodes(g)), dri
    assert "card0" not in dri  # the BMC's
    sh(cri, cid, f"test ! -e {APP_PROFILE_PATH}")
    sh(cri, cid, "test -f /usr/lib/xorg/modules/drivers/nvidia_drv.so && test -c /dev/nvidia-modeset")
    target = sh(cri, cid, "readlink /usr/lib/xorg/modules/extensions/libglxserver_nvidia.so").strip()
    assert target == "libglxserver_nvidia.so.550.163.01"
