"""The plugin's own image, run as its DaemonSet would run it, serves GPU pods.

The image (``localhost/nri-gpu/nri-gpu:dev``, tests/testbed/plugin_image.py) runs as
a CRI pod and container on real containerd 1.7.24 and 2.1.9: privileged, in the
host's PID and network namespaces, with the NRI socket's directory mounted at the
same path and the host's ``/`` at ``/host`` (read-only). The simulated GPU node is
reached through ``/host``; ``--host-root /host`` makes the plugin hand the runtime
host paths. A GPU pod then gets what tests/e2e/test_gpu_pods.py asserts for the
plugin run beside containerd.

The CRI client creates pods and containers with a private PID namespace, so the
plugin's pod is requested here with the CRI messages built directly.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.testbed import images
from tests.testbed.cri import CriClient
from tests.testbed.gpunode import SimNode, build_node
from tests.testbed.images import GLIBC
from tests.testbed.plugin_image import IMAGE, plugin_image
from tests.testbed.plugins import wait_until

from .conftest import Testbed

SLEEP = ["sh", "-c", "sleep 3600"]
HOST = "/host"  # where the plugin's container sees the host's /
_NS_NODE = 2  # CRI NamespaceMode NODE: the host's namespace
_imported: set[str] = set()  # containerd workdirs the image was imported into


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    return build_node(tmp_path_factory.mktemp("gpu-node"), gpus=4)


@dataclass
class PluginPod:
    pod_id: str
    container_id: str
    cri: CriClient

    def logs(self) -> str:
        return self.cri.logs(self.container_id)


def _root_propagation(pb: object) -> int:
    """rslave when the host's / may propagate (shared or slave), else private: the
    runtime refuses rslave on a private mount."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            optional = fields[6:fields.index("-")]
            if any(o.startswith(("shared:", "master:")) for o in optional):
                return int(pb.PROPAGATION_HOST_TO_CONTAINER)  # type: ignore[attr-defined]
    return int(pb.PROPAGATION_PRIVATE)  # type: ignore[attr-defined]


def run_plugin_pod(bed: Testbed, node: SimNode) -> PluginPod:
    """The DaemonSet's pod: privileged, hostPID, hostNetwork, the NRI socket's
    directory and the host's / mounted."""
    cri, pb = bed.cri, bed.cri.pb
    socket = Path(bed.containerd.nri_socket)
    uid = uuid.uuid4().hex
    log_dir = cri.log_root / f"kube-system_nri-gpu_{uid}"
    log_dir.mkdir(parents=True, exist_ok=True)
    host_ns = pb.NamespaceOption(network=_NS_NODE, pid=_NS_NODE, ipc=_NS_NODE)
    pod_config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name="nri-gpu", uid=uid, namespace="kube-system", attempt=0),
        log_directory=str(log_dir),
        labels={"app": "nri-gpu"},
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=f"{cri.cgroup_parent}/pod{uid}",
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=host_ns, privileged=True),
        ),
    )
    pod_id = cri.call("RunPodSandbox", pb.RunPodSandboxRequest(config=pod_config)).pod_sandbox_id
    command = [
        "python3.11", "-m", "plugin", "run",
        "--socket", str(socket),
        "--host-root", HOST,
        "--driver-root", f"{HOST}{node.driver_root}",
        "--dev-root", f"{HOST}{node.dev_root}",
        "--proc-root", f"{HOST}{node.proc_root}",
        "--metrics-address", "",
        "--log-level", "debug",
    ]  # ldconfig: engine.ldconfig's default /sbin/ldconfig is the image's own
    mounts = [
        pb.Mount(container_path=str(socket.parent), host_path=str(socket.parent)),
        pb.Mount(container_path=HOST, host_path="/", readonly=True, propagation=_root_propagation(pb)),
    ]
    config = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name="nri-gpu", attempt=0),
        image=pb.ImageSpec(image=IMAGE),
        command=command,
        log_path="nri-gpu_0.log",
        mounts=mounts,
        linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
            namespace_options=host_ns, privileged=True)),
    )
    req = pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=pod_config)
    cid = cri.call("CreateContainer", req).container_id
    cri.start_container(cid)
    return PluginPod(str(pod_id), str(cid), cri)


@pytest.fixture
def plugin_pod(testbed: Testbed, node: SimNode) -> Iterator[PluginPod]:
    workdir = str(testbed.workdir)
    if workdir not in _imported:
        images.import_image(testbed.containerd, plugin_image())
        _imported.add(workdir)
    pod = run_plugin_pod(testbed, node)

    def registered() -> bool:
        state = testbed.cri.container_status(pod.container_id).state
        assert state == "CONTAINER_RUNNING", f"the plugin's container is {state}:\n{pod.logs()}"
        return "registered with" in pod.logs()

    try:
        wait_until(registered, 20, "the containerized plugin to register")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; its log:\n{pod.logs()}") from None
    yield pod
    # The DaemonSet's pod goes away with SIGTERM and a grace period: a clean exit.
    testbed.cri.stop_container(pod.container_id, timeout=10)
    status = testbed.cri.container_status(pod.container_id).status
    assert status.exit_code == 0, pod.logs()
    assert "nri-gpu stopped" in pod.logs()


def sh(cri: CriClient, cid: str, script: str) -> str:
    code, out, err = cri.exec_sync(cid, ["sh", "-c", script])
    assert code == 0, f"{script!r} failed ({code}): {err}"
    return out


def test_plugin_image_runs_as_daemonset_and_serves_gpu_pods(
    testbed: Testbed, cri: CriClient, plugin_pod: PluginPod, node: SimNode
) -> None:
    pod = cri.run_pod("gpus-0-1", annotations={"nvidia.com/gpus": "0,1"})
    cid = cri.run_container(pod, "main", SLEEP, image=GLIBC)
    g0, g1 = node.gpus[0], node.gpus[1]

    devices = sorted(d for d in sh(cri, cid, "ls /dev").split() if d.startswith("nvidia"))
    assert devices == sorted(["nvidiactl", f"nvidia{g0.minor}", f"nvidia{g1.minor}", "nvidia-uvm", "nvidia-uvm-tools"])
    assert sh(cri, cid, "ls /proc/driver/nvidia/gpus").split() == sorted([g0.bus_id, g1.bus_id])
    cache = sh(cri, cid, "ldconfig -p")
    assert "libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1" in cache
    assert sh(cri, cid, "readlink /usr/lib/x86_64-linux-gnu/libcuda.so.1").strip() == "libcuda.so.550.163.01"

    # The sources the plugin handed the runtime are host paths, not the plugin's /host view.
    spec = cri.container_status(cid, verbose=True).spec
    assert spec["annotations"]["nri-gpu.io/gpus"] == f"{g0.uuid},{g1.uuid}"
    ours = [m for m in spec.get("mounts", []) if "nvidia" in json.dumps(m)]
    assert ours, "no driver mounts in the GPU container's spec"
    sources = [m["source"] for m in ours]
    assert not [s for s in sources if s == HOST or s.startswith(HOST + "/")], sources
    assert any(s.startswith(f"{node.driver_root}/") for s in sources), sources
    device_paths = {d["path"] for d in spec["linux"].get("devices", [])}
    assert f"/dev/nvidia{g0.minor}" in device_paths

    cri.wait_for_log(plugin_pod.container_id, 'container "main" in pod "default/gpus-0-1": GPUs')
