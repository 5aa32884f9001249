"""Fabric and I/O devices on real containerd 1.7.24 and 2.1.9, through ``nri-gpu run``
pointed at a simulated node that has them (``build_node(fabric=True)``: 16 nvidia-fs
nodes, two uverbs and rdma_cm, gdrdrv, two NVSwitches and their control node, GDS's
``cufile.json`` and udev database; no IMEX channel node on the host). Every test runs
on both containerd versions.

A GPU container asking for them sees exactly the nodes asked for, each admitted by
its device cgroup (opening fails for want of a kernel driver, never with EPERM); a
container without GPUs gets none of them; a channel the node cannot have is refused,
naming it.
"""

from __future__ import annotations

import pytest

from testbed.cri import CriClient, CriError
from testbed.gpunode import FS_MAJOR, GDRDRV_MAJOR, IMEX_MAJOR, NVSWITCH_MAJOR, UVERBS_MAJOR, SimNode, build_node
from testbed.images import GLIBC
from testbed.plugins import NriGpuProcess

from .conftest import Testbed

SLEEP = ["sh", "-c", "sleep 3600"]
EVERYTHING = {
    "NVIDIA_VISIBLE_DEVICES": "0",
    "NVIDIA_IMEX_CHANNELS": "0,5",
    "NVIDIA_GDS": "enabled",
    "NVIDIA_MOFED": "enabled",
    "NVIDIA_GDRCOPY": "enabled",
    "NVIDIA_NVSWITCH": "enabled",
}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    built = build_node(tmp_path_factory.mktemp("fabric-node"), gpus=2, fabric=True)
    assert built.real_device_nodes, "the e2e tests run as root"
    return built


def run(cri: CriClient, pod_name: str, env: dict[str, str]) -> str:
    pod = cri.run_pod(pod_name)
    return cri.run_container(pod, "main", SLEEP, image=GLIBC, env=env)


def sh(cri: CriClient, cid: str, script: str) -> str:
    code, out, err = cri.exec_sync(cid, ["sh", "-c", script])
    assert code == 0, f"{script!r} failed ({code}): {err}"
    return out


def numbers(cri: CriClient, cid: str, path: str) -> tuple[str, int, int]:
    """(mode string, major, minor) of a node in the container, from ``ls -l``."""
    fields = sh(cri, cid, f"ls -l {path}").replace(",", " ").split()
    return fields[0], int(fields[4]), int(fields[5])


def opened(cri: CriClient, cid: str, path: str) -> str:
    return cri.exec_sync(cid, ["sh", "-c", f"cat {path} 2>&1; true"])[1]


def fabric_listing(cri: CriClient, cid: str) -> list[str]:
    script = (
        "cd /dev && for p in nvidia-fs* gdrdrv nvidia-nvswitch* infiniband/* nvidia-caps-imex-channels/*; "
        'do [ -e "$p" ] && echo "$p"; done; true'
    )
    return sorted(sh(cri, cid, script).split())


def test_a_gpu_pod_sees_exactly_the_fabric_nodes_it_asked_for(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode
) -> None:
    cid = run(cri, "fabric-all", EVERYTHING)
    expected = [f"nvidia-fs{n}" for n in range(16)] + [
        "gdrdrv",
        "infiniband/rdma_cm",
        "infiniband/uverbs0",
        "infiniband/uverbs1",
        "nvidia-caps-imex-channels/channel0",
        "nvidia-caps-imex-channels/channel5",
        "nvidia-nvswitch0",
        "nvidia-nvswitch1",
        "nvidia-nvswitchctl",
    ]
    assert fabric_listing(cri, cid) == sorted(expected)
    # The channel nodes come from numbers: the host has none.
    assert not (node.dev_root / "dev/nvidia-caps-imex-channels").exists()
    assert numbers(cri, cid, "/dev/nvidia-caps-imex-channels/channel5") == ("crw-rw-rw-", IMEX_MAJOR, 5)
    assert numbers(cri, cid, "/dev/nvidia-fs15")[1:] == (FS_MAJOR, 15)
    assert numbers(cri, cid, "/dev/infiniband/uverbs1")[1:] == (UVERBS_MAJOR, 193)
    assert numbers(cri, cid, "/dev/gdrdrv")[1:] == (GDRDRV_MAJOR, 0)
    assert numbers(cri, cid, "/dev/nvidia-nvswitchctl")[1:] == (NVSWITCH_MAJOR, 255)
    # The device cgroup admits every one: no driver backs these majors here, so opening
    # fails with ENXIO (rdma_cm, a misc minor nobody registered: ENODEV), never EPERM.
    for path in (
        "/dev/nvidia-caps-imex-channels/channel0",
        "/dev/nvidia-caps-imex-channels/channel5",
        "/dev/nvidia-fs0",
        "/dev/nvidia-fs15",
        "/dev/infiniband/uverbs0",
        "/dev/gdrdrv",
        "/dev/nvidia-nvswitch1",
        "/dev/nvidia-nvswitchctl",
    ):
        assert "No such device or address" in opened(cri, cid, path), path
    rdma = opened(cri, cid, "/dev/infiniband/rdma_cm")
    assert "No such device" in rdma and "not permitted" not in rdma, rdma
    # A channel not asked for cannot be made: the cgroup refuses it.
    made = cri.exec_sync(cid, ["sh", "-c", f"mknod /tmp/c6 c {IMEX_MAJOR} 6 && cat /tmp/c6 2>&1; true"])[1]
    assert "not permitted" in made, made
    # GDS's files, read-only; /run/udev holds only udev's database, not udevd's socket.
    assert '"logging"' in sh(cri, cid, "cat /etc/cufile.json")
    assert sh(cri, cid, "ls /run/udev").split() == ["data"]
    assert sh(cri, cid, "ls /run/udev/data").split() == [f"c{UVERBS_MAJOR}:192"]
    assert "Read-only file system" in cri.exec_sync(cid, ["sh", "-c", "{ echo x >> /etc/cufile.json; } 2>&1; true"])[1]


def test_a_gpu_pod_that_asks_for_none_of_them_gets_none(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess
) -> None:
    cid = run(cri, "fabric-plain", {"NVIDIA_VISIBLE_DEVICES": "0"})
    assert fabric_listing(cri, cid) == []
    assert sh(cri, cid, "ls /etc/cufile.json /run/udev 2>&1; true").count("No such file") == 2


def test_a_pod_without_gpus_gets_nothing_for_the_gated_variables(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess
) -> None:
    env = {k: v for k, v in EVERYTHING.items() if k != "NVIDIA_VISIBLE_DEVICES"}
    cid = run(cri, "fabric-no-gpu", env)
    assert fabric_listing(cri, cid) == []
    assert sh(cri, cid, "ls /dev").split().count("nvidiactl") == 0
    spec = cri.container_status(cid, verbose=True).spec
    assert "nri-gpu.io/gpus" not in spec.get("annotations", {})
    # "none" is the driver without a GPU: the fabric devices stay out too (a note says so).
    none = run(cri, "fabric-none", {**EVERYTHING, "NVIDIA_VISIBLE_DEVICES": "none"})
    assert fabric_listing(cri, none) == []
    assert "nvidiactl" in sh(cri, none, "ls /dev").split()
    assert "ignored: they come only with GPUs" in plugin.log()


@pytest.mark.parametrize(
    ("channels", "message"),
    [
        ("0,x", 'env NVIDIA_IMEX_CHANNELS="0,x": IMEX channel "x" is not a channel number'),
        ("5,2048", "asks for IMEX channel 2048, but this node has channels 0-2047"),
    ],
)
def test_a_bad_channel_is_refused_naming_it(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, channels: str, message: str
) -> None:
    with pytest.raises(CriError) as err:
        run(cri, f"fabric-bad-{len(channels)}", {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_IMEX_CHANNELS": channels})
    assert message in str(err.value), err.value
