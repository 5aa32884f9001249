"""CUDA forward compatibility on real containerd 1.7.24 and 2.1.9: an image with
NVIDIA's real libcuda.so.555.58.02 as cuda-compat lays it out, on the simulated
550.163.01 node. With ``policy.cuda_compat`` (the default) the container's
``ldconfig -p`` lists the compat ``libcuda.so.1`` first (the loader takes the
first match) and a program linked against libcuda maps the compat file; with
``cuda_compat = false`` the driver's. The plugin logs the decision."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed import images
from testbed.cri import CriClient
from testbed.cudacompat import COMPAT_VERSION, IMAGE, compat_image
from testbed.gpunode import SimNode
from testbed.plugins import NriGpuProcess

from .conftest import Testbed, probe_image

LIB = "/usr/lib/x86_64-linux-gnu"
COMPAT = "/usr/local/cuda/compat"


@pytest.fixture(scope="module")
def image(containerd: Testbed) -> images.Image:
    return probe_image(containerd, compat_image, f"the cuda-compat image (libcuda1 {COMPAT_VERSION})")


def gpu_container(cri: CriClient, name: str) -> str:
    pod = cri.run_pod(name, annotations={"nvidia.com/gpus": "0"})
    return cri.run_container(pod, "main", ["sh", "-c", "sleep 3600"], image=IMAGE)


def sh(cri: CriClient, cid: str, script: str) -> str:
    code, out, err = cri.exec_sync(cid, ["sh", "-c", script])
    assert code == 0, f"{script!r} failed ({code}): {err}"
    return out


def libcuda_order(cri: CriClient, cid: str) -> list[str]:
    return [line.split(" => ")[1] for line in sh(cri, cid, "ldconfig -p").splitlines() if "\tlibcuda.so.1 " in line]


def serve(containerd: Testbed, node: SimNode, workdir: Path, policy: str) -> NriGpuProcess:
    config = workdir / "config.toml"
    config.write_text(f"[policy]\n{policy}")
    return NriGpuProcess(
        containerd.containerd.nri_socket, workdir / "nri-gpu.log", "--config", str(config), *node.flags()
    ).start()


def test_the_compat_libcuda_goes_first_and_the_switch_turns_it_off(
    testbed: Testbed, cri: CriClient, node: SimNode, image: images.Image, tmp_path: Path
) -> None:
    on = serve(testbed, node, tmp_path, "")
    try:
        cid = gpu_container(cri, "compat-on")
        assert libcuda_order(cri, cid) == [f"{COMPAT}/libcuda.so.1", f"{LIB}/libcuda.so.1"]
        assert sh(cri, cid, "/probe").strip() == f"/usr/local/cuda-12.5/compat/libcuda.so.{COMPAT_VERSION}"
        assert sh(cri, cid, "cat /etc/ld.so.conf.d/00-compat-nri-gpu.conf").splitlines()[1:] == [COMPAT]
        on.wait_for_log(f"CUDA forward compatibility: libcuda.so.{COMPAT_VERSION} in {COMPAT} is used over the driver")
    finally:
        assert on.stop() == 0, on.log()
    cri.remove_all()
    (tmp_path / "off").mkdir()
    off = serve(testbed, node, tmp_path / "off", "cuda_compat = false\n")
    try:
        cid = gpu_container(cri, "compat-off")
        assert libcuda_order(cri, cid) == [f"{LIB}/libcuda.so.1"]
        assert sh(cri, cid, "/probe").strip() == f"{LIB}/libcuda.so.550.163.01"
        assert "CUDA forward compatibility" not in off.log()
    finally:
        assert off.stop() == 0, off.log()
