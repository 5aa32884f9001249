"""GPU pods on real containerd 1.7.24 and 2.1.9, through ``nri-gpu run`` pointed at a
simulated 4-GPU node (real Debian NVIDIA 550.163.01 user-space, minors not in bus
order). Every test runs on both containerd versions."""

from __future__ import annotations

import json

import pytest

from testbed.cri import CriClient, CriError
from testbed.gpunode import SimNode
from testbed.images import GLIBC
from testbed.plugins import NriGpuProcess

from .conftest import Testbed

SLEEP = ["sh", "-c", "sleep 3600"]


def run(cri: CriClient, pod_name: str, *, annotations: dict[str, str] | None = None, **kw: object) -> str:
    pod = cri.run_pod(pod_name, annotations=annotations or {})
    return cri.run_container(pod, str(kw.pop("name", "main")), SLEEP, image=GLIBC, **kw)  # type: ignore[arg-type]


def sh(cri: CriClient, cid: str, script: str) -> str:
    code, out, err = cri.exec_sync(cid, ["sh", "-c", script])
    assert code == 0, f"{script!r} failed ({code}): {err}"
    return out


def nvidia_devices(cri: CriClient, cid: str) -> list[str]:
    return sorted(d for d in sh(cri, cid, "ls /dev").split() if d.startswith("nvidia"))


def test_pod_gets_exactly_the_requested_gpus_device_nodes(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode
) -> None:
    cid = run(cri, "gpus-0-1", annotations={"nvidia.com/gpus": "0,1"})
    g0, g1 = node.gpus[0], node.gpus[1]
    assert g0.minor != 0, "the simulated node must have minors out of bus order"
    assert nvidia_devices(cri, cid) == sorted(
        ["nvidiactl", f"nvidia{g0.minor}", f"nvidia{g1.minor}", "nvidia-uvm", "nvidia-uvm-tools"]
    )
    listing = sh(cri, cid, f"ls -l /dev/nvidia{g0.minor} /dev/nvidiactl")
    assert f"195,   {g0.minor}" in listing and "195, 255" in listing
    # The device cgroup admits it: the open fails for want of a kernel driver, not EPERM.
    out = cri.exec_sync(cid, ["sh", "-c", f"cat /dev/nvidia{g0.minor} 2>&1; true"])[1]
    assert "No such device or address" in out, out
    env = dict(line.split("=", 1) for line in sh(cri, cid, "env").splitlines() if "=" in line)
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"{g0.uuid},{g1.uuid}"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    spec = cri.container_status(cid, verbose=True).spec
    assert spec["annotations"]["nri-gpu.io/gpus"] == f"{g0.uuid},{g1.uuid}"


def test_driver_files_are_mounted_read_only(testbed: Testbed, cri: CriClient, plugin: NriGpuProcess) -> None:
    cid = run(cri, "files", annotations={"nvidia.com/gpus": "0"})
    lib = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.163.01"
    assert sh(cri, cid, f"head -c 4 {lib} | od -c | head -1").split()[1:5] == ["177", "E", "L", "F"]
    code, _, err = cri.exec_sync(cid, ["sh", "-c", f"echo x > {lib}"])
    assert code != 0 and "Read-only file system" in err
    assert "/usr/bin/nvidia-smi" in sh(cri, cid, "ls /usr/bin/nvidia-smi")


def test_container_scoped_annotation_uuid_and_none(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode
) -> None:
    g2, g3 = node.gpus[2], node.gpus[3]
    pod = cri.run_pod("scoped", annotations={"nvidia.com/gpus": "0", "nvidia.com/gpus.container.trainer": "3"})
    trainer = cri.run_container(pod, "trainer", SLEEP, image=GLIBC)
    assert f"nvidia{g3.minor}" in nvidia_devices(cri, trainer)

    by_uuid = run(cri, "by-uuid", env={"NVIDIA_VISIBLE_DEVICES": g2.uuid.upper()})
    devices = nvidia_devices(cri, by_uuid)
    assert [d for d in devices if d[6:].isdigit()] == [f"nvidia{g2.minor}"]

    none = run(cri, "none", env={"NVIDIA_VISIBLE_DEVICES": "none"})
    assert nvidia_devices(cri, none) == ["nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"]
    sh(cri, none, "test -f /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.163.01")


def test_pod_without_request_is_untouched(testbed: Testbed, cri: CriClient, plugin: NriGpuProcess) -> None:
    cid = run(cri, "plain")
    assert nvidia_devices(cri, cid) == []
    spec = cri.container_status(cid, verbose=True).spec
    assert not any("nvidia" in json.dumps(m) for m in spec.get("mounts", []))
    assert "nri-gpu.io/gpus" not in spec.get("annotations", {})
    assert sh(cri, cid, "ls /proc/driver 2>/dev/null; true").split().count("nvidia") == 0


@pytest.mark.parametrize(
    ("annotations", "env", "message"),
    [
        ({"nvidia.com/gpus": "7"}, {}, "GPU 7 does not exist; this node has 4 GPUs"),
        ({"nvidia.com/gpus": "0,,1"}, {}, '"0,,1"'),
        ({}, {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=12.8"}, "cuda>=12.8"),
    ],
    ids=["unknown-gpu", "malformed-annotation", "unmet-cuda-requirement"],
)
def test_bad_requests_fail_creation_with_our_message(
    testbed: Testbed,
    cri: CriClient,
    plugin: NriGpuProcess,
    annotations: dict[str, str],
    env: dict[str, str],
    message: str,
) -> None:
    with pytest.raises(CriError) as err:
        run(cri, "refused", annotations=annotations, env=env)
    assert message in str(err.value)
    assert "nri-gpu: CreateContainer" in str(err.value)


def test_read_only_root_filesystem(testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode) -> None:
    cid = run(cri, "read-only", annotations={"nvidia.com/gpus": "1"}, readonly_rootfs=True)
    assert f"nvidia{node.gpus[1].minor}" in nvidia_devices(cri, cid)
    code, _, err = cri.exec_sync(cid, ["sh", "-c", "echo x > /etc/probe"])
    assert code != 0 and "Read-only file system" in err


def test_plugin_log_has_one_line_per_decision(plugin: NriGpuProcess, testbed: Testbed, cri: CriClient) -> None:
    run(cri, "logged", annotations={"nvidia.com/gpus": "2"})
    plugin.wait_for_log('container "main" in pod "default/logged": GPUs 2')


# -- StartContainer: what only the container's own mount namespace can hold ------------


def test_proc_shows_only_the_selected_gpus(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode
) -> None:
    cid = run(cri, "procfs", annotations={"nvidia.com/gpus": "0,1"})
    assert sh(cri, cid, "ls /proc/driver/nvidia/gpus").split() == sorted([node.gpus[0].bus_id, node.gpus[1].bus_id])
    info = sh(cri, cid, f"cat /proc/driver/nvidia/gpus/{node.gpus[1].bus_id}/information")
    assert node.gpus[1].uuid in info
    assert "ModifyDeviceFiles: 0" in sh(cri, cid, "cat /proc/driver/nvidia/params")
    assert "550.163.01" in sh(cri, cid, "cat /proc/driver/nvidia/version")


def test_libraries_resolve_and_nvidia_smi_reaches_for_the_driver(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess
) -> None:
    cid = run(cri, "ldcache", annotations={"nvidia.com/gpus": "0"})
    cache = sh(cri, cid, "ldconfig -p")
    assert "libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1" in cache
    assert "libnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1" in cache
    assert sh(cri, cid, "readlink /usr/lib/x86_64-linux-gnu/libcuda.so.1").strip() == "libcuda.so.550.163.01"
    assert "/usr/lib/x86_64-linux-gnu" in sh(cri, cid, "cat /etc/ld.so.conf.d/00-nri-gpu.conf")
    code, out, err = cri.exec_sync(cid, ["nvidia-smi"])
    # Every library resolved: it gets as far as talking to the (absent) kernel driver.
    assert code != 0 and "couldn't communicate with the NVIDIA driver" in out + err, out + err


def test_driver_only_container_sees_no_gpu_in_proc(testbed: Testbed, cri: CriClient, plugin: NriGpuProcess) -> None:
    cid = run(cri, "driver-only", env={"NVIDIA_VISIBLE_DEVICES": "none"})
    assert sh(cri, cid, "ls /proc/driver/nvidia/gpus").split() == []
    assert "libnvidia-ml.so.1" in sh(cri, cid, "ldconfig -p")


def test_read_only_root_gets_the_same_start_work(
    testbed: Testbed, cri: CriClient, plugin: NriGpuProcess, node: SimNode
) -> None:
    cid = run(cri, "read-only-start", annotations={"nvidia.com/gpus": "2"}, readonly_rootfs=True)
    assert sh(cri, cid, "ls /proc/driver/nvidia/gpus").split() == [node.gpus[2].bus_id]
    assert "libcuda.so.1" in sh(cri, cid, "ldconfig -p")
    code, _, err = cri.exec_sync(cid, ["sh", "-c", "echo x > /etc/probe"])
    assert code != 0 and "Read-only file system" in err  # and it is read-only again
