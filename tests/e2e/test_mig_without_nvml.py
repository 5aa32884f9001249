"""MIG pods where NVML cannot answer, on real containerd 1.7.24 and 2.1.9: the
simulated MIG node keeps NVIDIA's own ``libnvidia-ml`` (no kernel driver here:
"Driver Not Loaded"), as in the shipped DaemonSet, whose pod has no GPU nodes of
its own for NVML to open.

Then the placement form still works, a ``MIG-<uuid>`` alone is refused with NVML's
reason, and a ``MIG-<uuid>`` with the device plugin's device specs (passDeviceSpecs,
the GPU operator's default: CRI devices for the parent and both cap nodes) is the
MIG device those nodes are.
"""

from __future__ import annotations

from typing import Any

import pytest

from testbed.cri import CriClient, CriError
from testbed.gpunode import SimNode, build_node, cap_minor
from testbed.images import GLIBC
from testbed.plugins import NriGpuProcess

from .conftest import Testbed

SLEEP = ["sh", "-c", "sleep 3600"]
MIG = {2: [(2, [0, 1]), (3, [0])]}
MIG_UUID = "MIG-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d"  # what the device plugin would name it


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    return build_node(tmp_path_factory.mktemp("mig-real-nvml"), gpus=4, mig=MIG, nvml="real")


def sh(cri: CriClient, cid: str, script: str) -> str:
    code, out, err = cri.exec_sync(cid, ["sh", "-c", script])
    assert code == 0, f"{script!r} failed ({code}): {err}"
    return out


def run(cri: CriClient, name: str, env: dict[str, str], devices: list[Any] | None = None) -> str:
    pod = cri.run_pod(name)
    return cri.run_container(pod, "main", SLEEP, image=GLIBC, env=env, devices=devices or [])


def caps_files(cri: CriClient, cid: str) -> list[str]:
    out = sh(cri, cid, "cd /proc/driver/nvidia/capabilities && find . -type f | sort")
    return [line[2:] for line in out.split()]


def test_the_placement_form_needs_no_nvml(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode
) -> None:
    parent = node.gpus[2]
    cid = run(cri, "placement", {"NVIDIA_VISIBLE_DEVICES": f"MIG-{parent.uuid}/2/1"})
    assert caps_files(cri, cid) == [f"gpu{parent.minor}/mig/gi2/access", f"gpu{parent.minor}/mig/gi2/ci1/access"]


def test_a_mig_uuid_alone_is_refused_with_nvmls_reason(testbed: Testbed, cri: CriClient, plugin: NriGpuProcess) -> None:
    with pytest.raises(CriError) as err:
        run(cri, "uuid-alone", {"NVIDIA_VISIBLE_DEVICES": MIG_UUID})
    message = str(err.value)
    assert "can only be found through NVML" in message and "Driver Not Loaded" in message, message
    assert "name them by placement instead" in message, message


def test_a_mig_uuid_with_the_device_plugins_device_specs_is_the_device_they_name(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode
) -> None:
    parent = node.gpus[2]
    m = parent.minor
    nodes = [f"nvidia{m}", f"nvidia-caps/nvidia-cap{cap_minor(m, 3)}", f"nvidia-caps/nvidia-cap{cap_minor(m, 3, 0)}"]
    specs = [
        cri.pb.Device(container_path=f"/dev/{n}", host_path=str(node.dev_root / "dev" / n), permissions="rw")
        for n in nodes
    ]
    cid = run(cri, "uuid-with-specs", {"NVIDIA_VISIBLE_DEVICES": MIG_UUID}, specs)
    assert caps_files(cri, cid) == [f"gpu{m}/mig/gi3/access", f"gpu{m}/mig/gi3/ci0/access"]
    assert sh(cri, cid, "ls /dev/nvidia-caps").split() == sorted(n.split("/")[1] for n in nodes[1:])
    assert sh(cri, cid, "ls /proc/driver/nvidia/gpus").split() == [parent.bus_id]
    env = dict(line.split("=", 1) for line in sh(cri, cid, "env").splitlines() if "=" in line)
    assert env["NVIDIA_VISIBLE_DEVICES"] == MIG_UUID  # one name, one device: the name asked for
    plugin.wait_for_log("served as the MIG device(s) whose nodes the container already has")
