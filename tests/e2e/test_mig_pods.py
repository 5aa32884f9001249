"""MIG pods on real containerd 1.7.24 and 2.1.9, through ``nri-gpu run`` pointed at a
simulated node whose GPU 2 is carved into MIG devices (procfs exactly as the 550
driver writes it, the simulated NVML beside the real user-space). Every test runs on
both containerd versions.

What a MIG container must see: its parent's ``/dev/nvidia<minor>``, its two
``/dev/nvidia-caps`` nodes, its two access files under
``/proc/driver/nvidia/capabilities`` and its parent's ``gpus/<bus>``, and nothing of
any other GPU or instance; ``NVIDIA_VISIBLE_DEVICES`` names the MIG device, never
the parent.
"""

from __future__ import annotations

import json
import time

import pytest

from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.discover import discover
from nri_gpu.engine.model import MigDevice
from nri_gpu.engine.selection import mig_devices
from testbed.cri import CriClient, CriError
from testbed.gpunode import CAPS_MAJOR, SimNode, build_node, reconfigure_mig
from testbed.images import GLIBC
from testbed.plugins import NriGpuProcess

from .conftest import Testbed, write_cdi_spec

SLEEP = ["sh", "-c", "sleep 3600"]
# GPU 1: MIG on, no instances; GPU 2: a 3g GPU instance with three compute instances, a 2g with one.
MIG = {1: [], 2: [(2, [0, 1, 2]), (3, [0])]}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    # No host /dev/nvidia-caps nodes for GPU instance 3 (the kernel makes none, and
    # nvidia-modprobe may not have run): neither path may need them.
    return build_node(tmp_path_factory.mktemp("mig-node"), gpus=4, mig=MIG, without_cap_nodes=(3,))


def devices_of(node: SimNode) -> list[MigDevice]:
    """The node's MIG devices as nri-gpu's own discovery (NVML probe included) sees them."""
    config = EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root))
    inventory = discover(config)
    assert inventory.mig.nvml is not None, inventory.mig.nvml_error
    return list(mig_devices(inventory))


def run(cri: CriClient, pod_name: str, env: dict[str, str], namespace: str = "default") -> str:
    pod = cri.run_pod(pod_name, namespace=namespace)
    return cri.run_container(pod, "main", SLEEP, image=GLIBC, env=env)


def sh(cri: CriClient, cid: str, script: str) -> str:
    code, out, err = cri.exec_sync(cid, ["sh", "-c", script])
    assert code == 0, f"{script!r} failed ({code}): {err}"
    return out


def visible(cri: CriClient, cid: str) -> str:
    env = dict(line.split("=", 1) for line in sh(cri, cid, "env").splitlines() if "=" in line)
    return env["NVIDIA_VISIBLE_DEVICES"]


def caps_files(cri: CriClient, cid: str) -> list[str]:
    out = sh(cri, cid, "cd /proc/driver/nvidia/capabilities && find . -type f | sort")
    return [line[2:] for line in out.split()]


@pytest.mark.parametrize("form", ["uuid", "index", "placement"])
def test_a_mig_device_by_each_form_sees_exactly_its_parent_caps_and_access_files(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode, form: str
) -> None:
    dev = next(d for d in devices_of(node) if (d.gpu_instance.gi, d.compute_instance.ci) == (2, 1))
    parent = dev.parent
    assert dev.uuid is not None and dev.index is not None
    asked = {"uuid": dev.uuid, "index": dev.index, "placement": f"MIG-{parent.uuid}/2/1"}[form]
    cid = run(cri, f"mig-{form}", {"NVIDIA_VISIBLE_DEVICES": asked})
    gi, ci = dev.gpu_instance.access.minor, dev.compute_instance.access.minor
    listing = sorted(d for d in sh(cri, cid, "ls /dev").split() if d.startswith("nvidia"))
    assert listing == sorted(["nvidiactl", f"nvidia{parent.minor}", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps"])
    assert sh(cri, cid, "ls /dev/nvidia-caps").split() == sorted([f"nvidia-cap{gi}", f"nvidia-cap{ci}"])
    nodes = sh(cri, cid, f"ls -l /dev/nvidia-caps/nvidia-cap{ci}")
    assert nodes.startswith("cr--r--r--") and f"{CAPS_MAJOR}, {ci:>3}" in nodes, nodes
    # The device cgroup admits both: opening fails for want of a kernel driver, not EPERM.
    for cap in (gi, ci):
        out = cri.exec_sync(cid, ["sh", "-c", f"cat /dev/nvidia-caps/nvidia-cap{cap} 2>&1; true"])[1]
        assert "No such device or address" in out, out
    m = parent.minor
    assert caps_files(cri, cid) == [f"gpu{m}/mig/gi2/access", f"gpu{m}/mig/gi2/ci1/access"]
    assert f"DeviceFileMinor: {ci}\n" in sh(cri, cid, f"cat /proc/driver/nvidia/capabilities/gpu{m}/mig/gi2/ci1/access")
    assert sh(cri, cid, "ls /proc/driver/nvidia/gpus").split() == [parent.bus_id]
    # NVML's name, known here, whatever form was asked (the placement form too)
    assert visible(cri, cid) == dev.uuid
    spec = cri.container_status(cid, verbose=True).spec
    assert spec["annotations"]["nri-gpu.io/gpus"] == visible(cri, cid)


def test_a_device_plugin_style_pod_sees_every_mig_device_and_the_monitor_cap(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode
) -> None:
    env = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_MIG_MONITOR_DEVICES": "all"}
    cid = run(cri, "device-plugin", env, namespace="kube-system")
    caps = sh(cri, cid, "ls /dev/nvidia-caps").split()
    assert "nvidia-cap2" in caps and "nvidia-cap1" not in caps
    files = caps_files(cri, cid)
    assert "mig/monitor" in files and "mig/config" not in files
    assert len([f for f in files if f.endswith("/access")]) == 2 + 4  # both GPU instances, all four CIs
    # GPU 1 (MIG on, no instances: NVML says so) and GPU 2 are not handed out whole.
    names = visible(cri, cid).split(",")
    assert [n for n in names if n.startswith("MIG-")] == [d.uuid for d in devices_of(node)]
    assert node.gpus[1].uuid not in names and node.gpus[2].uuid not in names


def test_monitor_from_a_namespace_policy_leaves_out_is_refused(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess
) -> None:
    with pytest.raises(CriError) as err:
        run(cri, "monitor-default", {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_MIG_MONITOR_DEVICES": "all"})
    assert "policy.mig_monitor_namespaces" in str(err.value) and '"default"' in str(err.value), err.value


def test_a_bad_mig_id_is_refused_naming_it_and_what_the_node_has(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode
) -> None:
    with pytest.raises(CriError) as err:
        run(cri, "bad-mig", {"NVIDIA_VISIBLE_DEVICES": "2:1"})  # the simulated NVML leaves j = 1 out
    message = str(err.value)
    first = devices_of(node)[0]
    assert "no MIG device 2:1" in message and f"{first.index} ({first.uuid})" in message, message


def test_a_reconfigured_node_is_picked_up(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode
) -> None:
    parent = node.gpus[2]
    try:
        reconfigure_mig(node, {1: [], 2: [(1, [0])]})  # a 4g GPU instance replaces both
        # A request for a device the inventory lacks re-takes it at most once a second
        # (``recheck``: a pod asking for a missing device in a loop costs nothing), and
        # the test before may have just done so.
        time.sleep(1.1)
        cid = run(cri, "after", {"NVIDIA_VISIBLE_DEVICES": f"MIG-{parent.uuid}/1/0"})
        assert caps_files(cri, cid) == [f"gpu{parent.minor}/mig/gi1/access", f"gpu{parent.minor}/mig/gi1/ci0/access"]
        (dev,) = devices_of(node)
        by_uuid = run(cri, "after-uuid", {"NVIDIA_VISIBLE_DEVICES": str(dev.uuid)})
        assert visible(cri, by_uuid) == dev.uuid
        with pytest.raises(CriError) as err:
            run(cri, "gone", {"NVIDIA_VISIBLE_DEVICES": f"MIG-{parent.uuid}/2/1"})
        assert "has no GPU instance 2 with compute instance 1" in str(err.value), err.value
    finally:
        reconfigure_mig(node, MIG)


def test_the_cdi_path_gives_a_mig_device_the_same_view(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode
) -> None:
    """``nvidia.com/gpu=<i:j>`` and ``=MIG-<uuid>`` from the spec ``nri-gpu cdi generate``
    writes: containerd's CDI code adds the nodes, our hook makes the view; the
    container must equal one given the same MIG device through NRI."""
    dev = next(d for d in devices_of(node) if (d.gpu_instance.gi, d.compute_instance.ci) == (3, 0))
    assert not (node.dev_root / f"dev/nvidia-caps/nvidia-cap{dev.compute_instance.access.minor}").exists()
    path = write_cdi_spec(testbed, node, "nri-gpu-mig.json")
    try:
        names = [d["name"] for d in json.loads(path.read_text())["devices"]]
        assert dev.index in names and dev.uuid in names
        seen = []
        for name in (dev.index, dev.uuid):
            pod = cri.run_pod(f"cdi-mig-{len(seen)}")
            cid = cri.run_container(
                pod, "main", SLEEP, image=GLIBC, annotations={"cdi.k8s.io/nri-gpu": f"nvidia.com/gpu={name}"}
            )
            seen.append(cid)
        nri = run(cri, "nri-mig", {"NVIDIA_VISIBLE_DEVICES": str(dev.uuid)})

        def looks(cid: str) -> tuple[str, str, str]:
            return (
                sh(cri, cid, "ls -l /dev/nvidia* /dev/nvidia-caps | awk '{print $1, $5, $6, $NF}'"),
                sh(cri, cid, "cd /proc/driver/nvidia && find . | sort"),
                sh(cri, cid, "ldconfig -p | grep -c nvidia"),
            )

        m = dev.parent.minor
        for cid in seen:
            assert looks(cid) == looks(nri)
            assert caps_files(cri, cid) == [f"gpu{m}/mig/gi3/access", f"gpu{m}/mig/gi3/ci0/access"]
    finally:
        path.unlink(missing_ok=True)
