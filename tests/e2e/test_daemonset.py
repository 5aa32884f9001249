"""The plugin's own image, run as its DaemonSet would run it, serves GPU pods.

The image (``localhost/nri-gpu/nri-gpu:dev``, hack/testbed/plugin_image.py) runs as
a CRI pod and container on real containerd 1.7.24 and 2.1.9, as deploy/daemonset.yaml
describes it: that file's args after the image's entrypoint, its namespaces (the
host's PID; a network namespace of its own, set up by a CNI plugin as on a cluster),
its security context (privileges, read-only root) and volume mounts (the NRI socket's
directory read-only, the host's ``/`` recursively read-only at ``/host``), and
deploy/configmap.yaml's config.toml at the path the DaemonSet mounts it. Only what
the test bed must change is changed: the NRI socket's directory is containerd's work
dir, and flags point the roots at the simulated GPU node under ``/host``. A GPU pod
then gets what tests/e2e/test_gpu_pods.py asserts for the plugin run beside
containerd, and the DaemonSet's probes, sent where the kubelet sends them (the pod's
address), answer 200 while another process of the node holds the same port.

A runtime without recursive read-only mounts (containerd 1.7) gets the fallback
deploy/README.md documents for it (``recursiveReadOnly: IfPossible``: the top mount
read-only), as a kubelet would refuse the pod with ``Enabled`` there.

The CRI client creates pods and containers with a private PID namespace, so the
plugin's pod is requested here with the CRI messages built directly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
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

from nri_gpu.plugin.config import Settings, from_toml, parse_address
from testbed import debs, images
from testbed.bundle import MASKED_PATHS, READONLY_PATHS
from testbed.cri import CriClient, CriError
from testbed.gpunode import SimNode
from testbed.images import GLIBC
from testbed.plugin_image import IMAGE, plugin_image
from testbed.plugins import wait_until

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
        return cls(
            yaml.safe_load((DEPLOY / "daemonset.yaml").read_text()),
            yaml.safe_load((DEPLOY / "configmap.yaml").read_text()),
        )

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
    recursive_read_only: bool  # the runtime made the host's / read-only all the way down

    @property
    def address(self) -> str:
        """The pod's IP, where the kubelet sends its probes."""
        status, _ = self.cri.pod_status(self.pod_id)
        return str(status.network.ip)

    def logs(self) -> str:
        return self.cri.logs(self.container_id)


def _root_propagation(pb: object) -> int:
    """rslave when the host's / may propagate (shared or slave), else private: the
    runtime refuses rslave on a private mount."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            optional = fields[6 : fields.index("-")]
            if any(o.startswith(("shared:", "master:")) for o in optional):
                return int(pb.PROPAGATION_HOST_TO_CONTAINER)  # type: ignore[attr-defined]
    return int(pb.PROPAGATION_PRIVATE)  # type: ignore[attr-defined]


def _network_ready(cri: CriClient) -> bool:
    conditions = cri.status().status.conditions
    return any(c.type == "NetworkReady" and c.status for c in conditions)


def _pod_network(bed: Testbed) -> None:
    """A CNI network for pods with their own network namespace, as a cluster has: the
    Debian plugins' ptp (a veth pair, no bridge, no iptables) and host-local addresses
    from a /24 of this containerd's own, so test beds side by side do not collide. (ptp
    turns the machine's IPv4 forwarding on, as any CNI plugin that routes does.)"""
    cni = bed.workdir / "cni"
    conflist = cni / "net.d" / "10-e2e.conflist"
    if not conflist.exists():
        plugins = debs.extract("containernetworking-plugins", "bookworm") / "usr/lib/cni"
        for name in ("ptp", "host-local", "loopback"):
            shutil.copy2(plugins / name, cni / "bin" / name)
        tag = hashlib.sha256(str(bed.workdir).encode()).digest()
        subnet = f"10.{200 + tag[0] % 50}.{tag[1]}.0/24"
        ipam = {"type": "host-local", "ranges": [[{"subnet": subnet}]], "dataDir": str(cni / "ipam")}
        conf = {"cniVersion": "1.0.0", "name": "e2e", "plugins": [{"type": "ptp", "ipMasq": False, "ipam": ipam}]}
        conflist.write_text(json.dumps(conf))
    wait_until(lambda: _network_ready(bed.cri), 20, "containerd to load the CNI network")


def _recursive_read_only_supported(cri: CriClient) -> bool:
    """What the kubelet asks before it sends a recursive read-only mount."""
    handlers = getattr(cri.status(), "runtime_handlers", [])
    return any(h.name == "" and h.features.recursive_read_only_mounts for h in handlers)


def _mounts(
    bed: Testbed,
    manifest: Manifest,
    container: dict[str, Any],
    config_dir: Path,
    rro: bool,
    nri_socket: Path,
    moved: dict[str, tuple[str, str]],
) -> list[object]:
    """``container``'s volume mounts as CRI mounts: the ConfigMap's files from
    ``config_dir``, the NRI socket's directory from ``nri_socket``'s, a volume named in
    ``moved`` from its (host path, mount path) there, the rest as written."""
    pb = bed.cri.pb
    socket_dir = manifest.settings.plugin.socket.rpartition("/")[0]
    assert nri_socket.name == manifest.settings.plugin.socket.rpartition("/")[2]
    volumes = {v["name"]: v for v in manifest.pod["volumes"]}
    mounts = []
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        container_path = mount["mountPath"]
        if mount["name"] in moved:
            host_path, container_path = moved[mount["name"]]
        elif "configMap" in volume:
            assert volume["configMap"]["name"] == manifest.configmap["metadata"]["name"]
            for key, text in manifest.configmap["data"].items():
                (config_dir / key).write_text(text)
            host_path = str(config_dir)
        elif volume["hostPath"]["path"] == socket_dir == mount["mountPath"]:
            host_path = str(nri_socket.parent)
        else:
            host_path = volume["hostPath"]["path"]
        propagation = int(pb.PROPAGATION_PRIVATE)  # "None"
        if mount.get("mountPropagation") == "HostToContainer":
            assert host_path == "/", mount  # _root_propagation looks at / only
            propagation = _root_propagation(pb)
        # Enabled where the runtime can; IfPossible (deploy/README.md's fallback) elsewhere.
        recursive = mount.get("recursiveReadOnly") in ("Enabled", "IfPossible") and rro
        mounts.append(
            pb.Mount(
                container_path=container_path,
                host_path=host_path,
                readonly=mount.get("readOnly", False),
                recursive_read_only=recursive,
                propagation=propagation,
            )
        )
    return mounts


def _profile(pb: Any, profile: dict[str, str] | None) -> Any:
    kinds = {"RuntimeDefault": pb.SecurityProfile.RuntimeDefault, "Unconfined": pb.SecurityProfile.Unconfined}
    return pb.SecurityProfile(profile_type=kinds[profile["type"]]) if profile else None


def _security_context(pb: Any, security: dict[str, Any], host_ns: Any) -> Any:
    """The container's securityContext as the kubelet sends it to the runtime."""
    privileged = bool(security.get("privileged", False))
    caps = security.get("capabilities", {})
    return pb.LinuxContainerSecurityContext(
        namespace_options=host_ns,
        privileged=privileged,
        capabilities=pb.Capability(add_capabilities=caps.get("add", []), drop_capabilities=caps.get("drop", [])),
        seccomp=_profile(pb, security.get("seccompProfile")),
        apparmor=_profile(pb, security.get("appArmorProfile")),
        readonly_rootfs=bool(security.get("readOnlyRootFilesystem", False)),
        masked_paths=[] if privileged else list(MASKED_PATHS),
        readonly_paths=[] if privileged else list(READONLY_PATHS),
    )


@dataclass
class Sandbox:
    """The DaemonSet's pod sandbox, as the kubelet runs it before its containers."""

    bed: Testbed
    manifest: Manifest
    pod_id: str
    config: Any  # the PodSandboxConfig
    host_ns: Any
    config_dir: Path  # the ConfigMap's files
    rro: bool  # the runtime makes recursive read-only mounts


def run_sandbox(bed: Testbed, manifest: Manifest) -> Sandbox:
    cri, pb = bed.cri, bed.cri.pb
    workdir = str(bed.workdir)
    if workdir not in _imported:
        images.import_image(bed.containerd, plugin_image())
        _imported.add(workdir)
    pod = manifest.pod
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
    privileged = bool(manifest.container["securityContext"].get("privileged", False))
    if not pod.get("hostNetwork"):
        _pod_network(bed)
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
    return Sandbox(bed, manifest, str(pod_id), pod_config, host_ns, config_dir, _recursive_read_only_supported(cri))


def start_container(
    sandbox: Sandbox,
    container: dict[str, Any],
    args: list[str],
    *,
    attempt: int = 0,
    nri_socket: Path | None = None,
    moved: dict[str, tuple[str, str]] | None = None,
) -> str:
    """``container`` of the manifest, with ``args``, started in the sandbox as the
    kubelet starts it (its command, security context and mounts as written)."""
    bed, pb = sandbox.bed, sandbox.bed.cri.pb
    config = pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=container["name"], attempt=attempt),
        image=pb.ImageSpec(image=IMAGE),
        command=container.get("command", []),
        args=args,
        log_path=f"{container['name']}_{attempt}.log",
        mounts=_mounts(
            bed,
            sandbox.manifest,
            container,
            sandbox.config_dir,
            sandbox.rro,
            nri_socket or Path(bed.containerd.nri_socket),
            moved or {},
        ),
        linux=pb.LinuxContainerConfig(
            security_context=_security_context(pb, container["securityContext"], sandbox.host_ns)
        ),
    )
    req = pb.CreateContainerRequest(pod_sandbox_id=sandbox.pod_id, config=config, sandbox_config=sandbox.config)
    cid = str(bed.cri.call("CreateContainer", req).container_id)
    bed.cri.start_container(cid)
    return cid


def run_plugin_pod(
    bed: Testbed,
    node: SimNode,
    *,
    ld_cache: str = "",
    without: str = "",
    nri_socket: Path | None = None,
    sandbox: Sandbox | None = None,
) -> PluginPod:
    """The DaemonSet's pod, as deploy/daemonset.yaml and deploy/configmap.yaml make it;
    with ``ld_cache`` set in the config file, or ``without`` one of its capabilities;
    connected to ``nri_socket`` (default: the test bed's); in ``sandbox`` when its init
    container ran there first."""
    manifest = sandbox.manifest if sandbox is not None else Manifest.load()
    if ld_cache:
        text = manifest.configmap["data"]["config.toml"].replace("[engine]\n", f'[engine]\nld_cache = "{ld_cache}"\n')
        manifest.configmap["data"]["config.toml"] = text
        assert manifest.settings.engine.ld_cache == ld_cache
    container = manifest.container
    if without:
        container["securityContext"]["capabilities"]["add"].remove(without)
    if sandbox is None:
        sandbox = run_sandbox(bed, manifest)
    assert "command" not in container  # the image's entrypoint runs, as in the DaemonSet
    host = manifest.settings.engine.host_root
    args = [
        *container["args"],
        # The simulated node's roots under the host's /, where a real node has the driver at /.
        "--driver-root",
        f"{host}{node.driver_root}",
        "--dev-root",
        f"{host}{node.dev_root}",
        "--proc-root",
        f"{host}{node.proc_root}",
        "--log-level",
        "debug",
    ]  # ldconfig: engine.ldconfig's default /sbin/ldconfig is the image's own
    cid = start_container(sandbox, container, args, nri_socket=nri_socket)
    return PluginPod(sandbox.pod_id, cid, bed.cri, sandbox.rro)


def probe(manifest: Manifest, kind: str, pod: PluginPod) -> int:
    """The HTTP status the DaemonSet's ``kind`` probe gets, sent as the kubelet sends
    it: to the pod's address unless the probe names a host."""
    get = manifest.container[kind]["httpGet"]
    url = f"http://{get.get('host', pod.address)}:{get['port']}{get['path']}"
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _squat(port: int) -> socket.socket | None:
    """Bind ``port`` on every address of the node, as any local user could; None when
    something of the node holds it already (then that is the squatter)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("0.0.0.0", port))
        sock.listen(1)
    except OSError:
        sock.close()
        return None
    return sock


@contextlib.contextmanager
def plugin_pod_running(testbed: Testbed, node: SimNode, **variant: str) -> Iterator[PluginPod]:
    """The DaemonSet's pod (``variant``: run_plugin_pod's), registered; stopped cleanly after."""
    # A local user takes the probe port on the node first; the pod has a port of its own.
    squatter = _squat(parse_address(Manifest.load().settings.plugin.metrics_address)[1])
    try:
        pod = run_plugin_pod(testbed, node, **variant)

        def registered() -> bool:
            state = testbed.cri.container_status(pod.container_id).state
            assert state == "CONTAINER_RUNNING", f"the plugin's container is {state}:\n{pod.logs()}"
            return "registered with" in pod.logs()

        try:
            wait_until(registered, 20, "the containerized plugin to register")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; its log:\n{pod.logs()}") from None
        yield pod
    finally:
        if squatter is not None:
            squatter.close()
    # The DaemonSet's pod goes away with SIGTERM and a grace period: a clean exit.
    testbed.cri.stop_container(pod.container_id, timeout=10)
    status = testbed.cri.container_status(pod.container_id).status
    assert status.exit_code == 0, pod.logs()
    assert "nri-gpu stopped" in pod.logs()


@pytest.fixture
def plugin_pod(testbed: Testbed, node: SimNode, request: pytest.FixtureRequest) -> Iterator[PluginPod]:
    with plugin_pod_running(testbed, node, **getattr(request, "param", {})) as pod:
        yield pod


def sh(cri: CriClient, cid: str, script: str) -> str:
    code, out, err = cri.exec_sync(cid, ["sh", "-c", script])
    assert code == 0, f"{script!r} failed ({code}): {err}"
    return out


@pytest.mark.parametrize("plugin_pod", [{}, {"ld_cache": "rebuild"}], indirect=True, ids=["merge", "rebuild"])
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
    # Registered: the DaemonSet's probes pass, at the pod's address, whoever holds the
    # node's port.
    manifest = Manifest.load()
    assert plugin_pod.address and not plugin_pod.address.startswith("127."), plugin_pod.address
    for kind in ("readinessProbe", "livenessProbe"):
        assert probe(manifest, kind, plugin_pod) == 200, kind
    # The memory limit leaves room: the plugin's peak (start workers included) is well below.
    peak = _memory_peak(cri, plugin_pod.container_id)
    limit = _bytes(manifest.container["resources"]["limits"]["memory"])
    if peak is not None:
        print(f"plugin memory peak {peak / 2**20:.1f} MiB of a {limit / 2**20:.0f} MiB limit")
        assert peak < limit / 2, (peak, limit)


def _bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    return int(quantity[:-2]) * units[quantity[-2:]] if quantity[-2:] in units else int(quantity)


def _memory_peak(cri: CriClient, cid: str) -> int | None:
    """The container's peak memory from its cgroup (v1 or v2), None where unreadable."""
    cgroup = cri.container_status(cid, verbose=True).spec["linux"]["cgroupsPath"]
    for path in (
        Path("/sys/fs/cgroup/memory") / cgroup.lstrip("/") / "memory.max_usage_in_bytes",
        Path("/sys/fs/cgroup") / cgroup.lstrip("/") / "memory.peak",
    ):
        if path.is_file():
            return int(path.read_text())
    return None


def _mount_options(cri: CriClient, cid: str) -> dict[str, set[str]]:
    """Mount point -> its per-mount options, from the container's own mountinfo."""
    found = {}
    for line in sh(cri, cid, "cat /proc/self/mountinfo").splitlines():
        fields = line.split()
        found[fields[4]] = set(fields[5].split(","))
    return found


def test_the_daemonset_pod_holds_no_writable_host_mount(cri: CriClient, plugin_pod: PluginPod) -> None:
    """What the plugin works with (the test above) and nothing writable of the host:
    its own root, the NRI socket's directory and the host's / are read-only, and where
    the runtime supports it every mount under the host's / is too (/host/dev, /host/proc,
    /host/run where it is a mount)."""
    mounts = _mount_options(cri, plugin_pod.container_id)
    manifest = Manifest.load()
    socket_dir = manifest.settings.plugin.socket.rpartition("/")[0]
    host = manifest.settings.engine.host_root
    for point in ("/", socket_dir, host, "/etc/nri-gpu"):
        assert "ro" in mounts[point], (point, mounts[point])
    under_host = {p: o for p, o in mounts.items() if p.startswith(host + "/")}
    assert {f"{host}/proc", f"{host}/dev"} <= set(under_host), sorted(under_host)  # on every Linux node
    writable = sorted(p for p, o in under_host.items() if "ro" not in o)
    if plugin_pod.recursive_read_only:
        assert writable == [], writable
    else:  # containerd 1.7: the documented fallback leaves the host's submounts as they are
        assert writable, "expected the fallback's writable submounts; does the runtime do rro now?"


# Each capability the DaemonSet adds, and what fails without it. KILL is not here: it
# is for an ldconfig (another uid) that overruns its time, which this node cannot make
# happen on demand.
_CAPABILITY_USES = {
    "SYS_ADMIN": "merge",
    "SYS_CHROOT": "merge",
    "SYS_PTRACE": "merge",
    "DAC_OVERRIDE": "merge",
    "SETUID": "rebuild",
    "SETGID": "rebuild",
    "SETPCAP": "rebuild",
}


def test_every_capability_the_daemonset_adds_is_accounted_for() -> None:
    added = set(Manifest.load().container["securityContext"]["capabilities"]["add"])
    assert added == {*_CAPABILITY_USES, "KILL"}


@pytest.mark.parametrize("capability", sorted(_CAPABILITY_USES))
def test_without_a_capability_gpu_pods_fail(testbed: Testbed, cri: CriClient, node: SimNode, capability: str) -> None:
    """Least privilege, checked from the other side: the DaemonSet's pod without any
    one of its capabilities cannot give a GPU pod its GPUs (and says so)."""
    with plugin_pod_running(testbed, node, without=capability, ld_cache=_CAPABILITY_USES[capability]) as plugin:
        pod = cri.run_pod(f"without-{capability.lower().replace('_', '-')}", annotations={"nvidia.com/gpus": "0"})
        try:
            cri.run_container(pod, "main", SLEEP, image=GLIBC)
        except CriError as exc:
            assert "nri-gpu" in exc.details, exc.details
        else:
            raise AssertionError(f"a GPU pod started without {capability}: it is not needed;\n{plugin.logs()}")
