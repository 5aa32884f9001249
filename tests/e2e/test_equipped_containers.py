"""Containers another producer already equipped, on real containerd 1.7.24 and 2.1.9,
with nri-gpu's default policy (``equipped_containers = "stand-aside"``). A CDI spec
written by the test stands in for NVIDIA's, DRA's or the device plugin's
(containerd 1.7 and 2.1 apply CDI from ``cdi.k8s.io/`` annotations before NRI);
the device plugin's device specs are CRI devices."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testbed.cri import CriClient, CriError
from testbed.gpunode import SimNode
from testbed.plugins import NriGpuProcess

from .conftest import Testbed
from .equipped_support import run, sh, write_other_spec


@pytest.fixture
def other_spec(testbed: Testbed, node: SimNode) -> Iterator[None]:
    path = write_other_spec(testbed.containerd.cdi_dir, node)
    yield
    path.unlink(missing_ok=True)


def test_a_cdi_equipped_container_is_left_as_its_producer_made_it(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode, other_spec: None
) -> None:
    cid = run(cri, "cdi-same", cdi="1", annotations={"nvidia.com/gpus": "1"})  # asks us for the same GPU
    spec = cri.container_status(cid, verbose=True).spec
    nodes = [d["path"] for d in spec["linux"]["devices"] if d["path"].startswith("/dev/nvidia")]
    assert nodes == [f"/dev/nvidia{node.gpus[1].minor}"]
    assert "nri-gpu.io/gpus" not in spec.get("annotations", {})  # nothing of ours
    assert len([m for m in spec["mounts"] if "libnvidia" in m["destination"] or "libcuda" in m["destination"]]) == 1
    plugin.wait_for_log("nri-gpu stands aside")


def test_a_request_for_other_gpus_than_cdi_gave_is_refused_naming_both(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, other_spec: None
) -> None:
    with pytest.raises(CriError) as err:
        run(cri, "cdi-other", cdi="1", annotations={"nvidia.com/gpus": "0"})
    message = str(err.value)
    assert "it already has GPU 1" in message and 'annotation "nvidia.com/gpus" asks for GPU 0' in message, message


def test_device_specs_are_completed_with_the_driver_files_but_never_widened(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode
) -> None:
    g = node.gpus[3]
    spec = cri.pb.Device(
        container_path=f"/dev/nvidia{g.minor}", host_path=str(node.dev_root / f"dev/nvidia{g.minor}"), permissions="rw"
    )
    cid = run(cri, "specs-same", annotations={"nvidia.com/gpus": "3"}, devices=[spec])
    assert sh(cri, cid, "ls /proc/driver/nvidia/gpus").split() == [g.bus_id]
    assert "libcuda.so.1" in sh(cri, cid, "ldconfig -p")
    with pytest.raises(CriError) as err:
        run(cri, "specs-other", annotations={"nvidia.com/gpus": "0"}, devices=[spec])
    assert "it already has GPU 3 (device nodes already in its spec)" in str(err.value), err.value
