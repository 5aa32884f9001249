"""The plugin's own image, run as its DaemonSet would run it, serves GPU pods.

The image (``localhost/nri-gpu/nri-gpu:dev``, tests/testbed/plugin_image.py) runs as
a CRI pod and container on real containerd 1.7.24 and 2.1.9, as deploy/daemonset.yaml
describes it: that file's args after the image's entrypoint, its namespaces (the
host's PID and network), privileges and volume mounts (the NRI socket's directory,
the host's ``/`` read-only at ``/host``), and deploy/configmap.yaml's config.toml at
the path the DaemonSet mounts it. Only what the test bed must change is changed: the
NRI socket's directory is containerd's work dir, and flags point the roots at the
simulated GPU node under ``/host`` and the metrics at a free port. A GPU pod then gets
what tests/e2e/test_gpu_pods.py asserts for the plugin run beside containerd, and the
DaemonSet's probes answer 200.

The CRI client creates pods and containers with a private PID namespace, so the
plugin's pod is requested here with the CRI messages built directly.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from plugin.config import Settings, from_toml
from tests.testbed import images
from tests.testbed.cri import CriClient
from tests.testbed.gpunode import SimNode
from tests.testbed.images import GLIBC
from tests.testbed.plugin_image import IMAGE, plugin_image
from tests.testbed.plugins import wait_until

from .conftest import Testbed

SLEEP = ["sh", "-c", "sleep 3600"]
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
_NS_POD, _NS_NODE = 0, 2  # CRI NamespaceMode POD (the pod's own) and NODE (the host's)
_imported: set[str] = set()  # containerd workdirs the image was imported into


@dataclass(frozen=True)
class Manifest:
    """What deploy/daemonset.yaml and deploy/configmap.yaml make of the plugin's pod."""

    daemonset: dict[str, Any]
    configmap: dict[str, Any]

    @classmethod
    def load(cls) -> Manifest:
        return cls(yaml.safe_load((DEPLOY / "daemonset.yaml").read_text()),
                   yaml.safe_load((DEPLOY / "configmap.yaml").read_text()))

    @property
    def pod(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.daemonset["spec"]["template"]["spec"]
        return spec

    @property
    def container(self) -> dict[str, Any]:
        (container,) = self.pod["containers"]
        assert isinstance(container, dict)
        return container

    @property
    def settings(self) -> Settings:
        return from_toml(self.configmap["data"]["config.toml"], source="deploy/configmap.yaml")


@dataclass
class PluginPod:
    pod_id: str
    container_id: str
    cri: CriClient
    metrics_port: int

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


def _free_port() -> int:
    """A loopback TCP port nobody listens on now: the pod shares this machine's network."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _mounts(bed: Testbed, manifest: Manifest, config_dir: Path) -> list[object]:
    """The DaemonSet's volume mounts as CRI mounts: the ConfigMap's files from
    ``config_dir``, the NRI socket's directory from containerd's, the rest as written."""
    pb = bed.cri.pb
    nri_socket = Path(bed.containerd.nri_socket)
    socket_dir = manifest.settings.plugin.socket.rpartition("/")[0]
    assert nri_socket.name == manifest.settings.plugin.socket.rpartition("/")[2]
    volumes = {v["name"]: v for v in manifest.pod["volumes"]}
    mounts = []
    for mount in manifest.container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            assert volume["configMap"]["name"] == manifest.configmap["metadata"]["name"]
            for key, text in manifest.configmap["data"].items():
                (config_dir / key).write_text(text)
            host_path = str(config_dir)
        elif volume["hostPath"]["path"] == socket_dir == mount["mountPath"]:
            host_path = str(nri_socket.parent)
        else:
            host_path = volume["hostPath"]["path"]
        propagation = int(pb.PROPAGATION_PRIVATE)
        if mount.get("mountPropagation") == "HostToContainer":
            assert host_path == "/", mount  # _root_propagation looks at / only
            propagation = _root_propagation(pb)
        mounts.append(pb.Mount(container_path=mount["mountPath"], host_path=host_path,
                               readonly=mount.get("readOnly", False), propagation=propagation))
    return mounts


def run_plugin_pod(bed: Testbed, node: SimNode) -> PluginPod:
    """The DaemonSet's pod, as deploy/daemonset.yaml and deploy/configmap.yaml make it."""
    cri, pb = bed.cri, bed.cri.pb
    manifest = Manifest.load()
    pod, container = manifest.pod, manifest.container
    name, namespace = manifest.daemonset["metadata"]["name"], manifest.daemonset["metadata"]["namespace"]
    uid = uuid.uuid4().hex
    log_dir = cri.log_root / f"{namespace}_{name}_{uid}"
    log_dir.mkdir(parents=True, exist_ok=True)
    config_dir = cri.log_root / f"{namespace}_{name}_{uid}.config"
    config_dir.mkdir()
    host_ns = pb.NamespaceOption(
        network=_NS_NODE if pod.get("hostNetwork") else _NS_POD,
        pid=_NS_NODE if pod.get("hostPID") else _NS_POD,
        ipc=_NS_NODE if pod.get("hostIPC") else _NS_POD,
    )
    privileged = bool(container["securityContext"]["privileged"])
    pod_config = pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=0),
        log_directory=str(log_dir),
        labels=manifest.daemonset["spec"]["template"]["metadata"]["labels"],
        linux=pb.LinuxPodSandboxConfig(
            cgroup_parent=f"{cri.cgroup_parent}/pod{uid}",
            security_context=pb.LinuxSandboxSecurityContext(namespace_options=host_ns, privileged=privileged),
        ),
    )
    pod_id = cri.call("RunPodSandbox", pb.RunPodSandboxRequest(config=pod_config)).pod_sandbox_id
    assert "command" not in container  # the image's entrypoint runs, as in the DaemonSet
    host = manifest.settings.engine.host_root
    metrics_port = _free_port()
    args = [
        *container["args"],
        # The simulated node's roots under the host's /, where a real node has the driver at /.
        "--driver-root", f"{host}{node.driver_root}",
        "--dev-root", f"{host}{node.dev_root}",
        "--proc-root", f"{host}{node.proc_root}",
        # hostNetwork: the config's port could be taken on this machine.
        "--metrics-address", f"127.0.0.1:{metrics_port}",
        "--log-level", "debug",
    ]  # ldconfig: engine.ldconfig's default /sbin/ldconfig is the image's own
    config = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=container["name"], attempt=0),
        image=pb.ImageSpec(image=IMAGE),
        args=args,
        log_path=f"{container['name']}_0.log",
        mounts=_mounts(bed, manifest, config_dir),
        linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
            namespace_options=host_ns, privileged=privileged)),
    )
    req = pb.CreateContainerRequest(pod_sandbox_id=pod_id, config=config, sandbox_config=pod_config)
    cid = cri.call("CreateContainer", req).container_id
    cri.start_container(cid)
    return PluginPod(str(pod_id), str(cid), cri, metrics_port)


def probe(manifest: Manifest, kind: str, port: int) -> int:
    """The HTTP status the DaemonSet's ``kind`` probe gets (at the test's metrics port)."""
    get = manifest.container[kind]["httpGet"]
    url = f"http://{get.get('host', '127.0.0.1')}:{port}{get['path']}"
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


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
    host = Manifest.load().settings.engine.host_root
    assert not [s for s in sources if s == host or s.startswith(host + "/")], sources
    assert any(s.startswith(f"{node.driver_root}/") for s in sources), sources
    device_paths = {d["path"] for d in spec["linux"].get("devices", [])}
    assert f"/dev/nvidia{g0.minor}" in device_paths

    cri.wait_for_log(plugin_pod.container_id, 'container "main" in pod "default/gpus-0-1": GPUs')
    # Registered: the DaemonSet's probes would pass.
    manifest = Manifest.load()
    for kind in ("readinessProbe", "livenessProbe"):
        assert probe(manifest, kind, plugin_pod.metrics_port) == 200, kind
