"""Planning on simulated nodes: exact edits per request.

The golden files per scenario (tests/golden/) are checked by
tests/integration/test_golden.py, on NVIDIA's own files, with the ``Node`` and
``_normalize`` of this module; ``NRI_GPU_UPDATE_GOLDEN=1`` rewrites them (review the
diff before committing). Paths under the node are written as ``<ROOT>`` so the files
do not depend on where the test ran.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nri_gpu.engine.config import EngineConfig, Policy, from_tables
from nri_gpu.engine.discover import discover
from nri_gpu.engine.errors import EngineError, RequestError, RequirementError, UnknownDeviceError
from nri_gpu.engine.model import Capability, DriverFile, FileKind, Inventory
from nri_gpu.engine.plan import IPC_OPTIONS, plan
from nri_gpu.engine.report import plan_to_dict
from nri_gpu.engine.request import ContainerInfo, parse_request
from testbed.gpunode import FIXTURE_DRIVER, FIXTURE_NO_DRIVER, SimNode, build_node

GOLDEN = Path(__file__).resolve().parents[2] / "golden"


def cuda_12_4(path: str) -> tuple[str | None, str | None]:
    return "12.4", None


class Node:
    """A simulated node, its config and inventory. On the committed driver fixture
    unless ``real``: NVIDIA's own files (downloaded once), for the golden files,
    which show what a real driver's containers get."""

    def __init__(self, root: Path, *, real: bool = False, **kw: Any) -> None:
        if not real:
            kw.setdefault("driver_files", FIXTURE_DRIVER if kw.get("driver", True) else FIXTURE_NO_DRIVER)
        self.sim: SimNode = build_node(root, **kw)
        self.config = EngineConfig(
            driver_root=str(self.sim.driver_root), dev_root=str(self.sim.dev_root), proc_root=str(self.sim.proc_root)
        )
        # The CUDA probe is tested in test_discover; fixed here so goldens are stable.
        self.inventory: Inventory = discover(self.config, cuda_version=cuda_12_4)

    def plan(self, env: dict[str, str] | None = None, annotations: dict[str, str] | None = None, **kw: Any) -> Any:
        info = ContainerInfo(name=kw.pop("name", "main"), pod_annotations=annotations or {}, env=env or {}, **kw)
        outcome = parse_request(info, self.config.policy)
        assert outcome.request is not None, outcome
        return plan(outcome.request, self.inventory, self.config)


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> Node:
    return Node(tmp_path_factory.mktemp("four"), gpus=4)


def test_selected_gpus_get_their_minor_device_nodes(four: Node) -> None:
    p = four.plan(annotations={"nvidia.com/gpus": "0,1"})
    by_index = {g.index: g for g in four.inventory.gpus}
    assert [g.index for g in p.gpus] == [0, 1]
    gpu_nodes = [d for d in p.devices if d.path.startswith("/dev/nvidia") and d.path[11:].isdigit()]
    assert [(d.path, d.major, d.minor) for d in gpu_nodes] == [
        (f"/dev/nvidia{by_index[i].minor}", 195, by_index[i].minor) for i in (0, 1)
    ]
    assert by_index[0].minor != 0, "the scenario must have minors out of bus order"
    paths = [d.path for d in p.devices]
    assert paths[0] == "/dev/nvidiactl"
    assert "/dev/nvidia-uvm" in paths and "/dev/nvidia-uvm-tools" in paths  # compute is a default capability
    assert "/dev/nvidia-modeset" not in paths
    assert p.visible_bus_ids == tuple(sorted(by_index[i].bus_id for i in (0, 1)))
    assert dict(p.env)["NVIDIA_VISIBLE_DEVICES"] == f"{by_index[0].uuid},{by_index[1].uuid}"


def test_mounts_are_read_only_at_the_node_path_from_the_driver_root(four: Node) -> None:
    p = four.plan(annotations={"nvidia.com/gpus": "0"})
    root = str(four.sim.driver_root)
    cuda = next(m for m in p.mounts if m.destination.endswith("/libcuda.so.550.163.01"))
    assert cuda.source == root + cuda.destination
    for m in p.mounts:
        assert {"ro", "nosuid", "nodev"} <= set(m.options), m
        assert m.source.startswith(root + "/")
    destinations = [m.destination for m in p.mounts]
    assert len(destinations) == len(set(destinations))


def test_capabilities_decide_which_files(four: Node) -> None:
    utility = four.plan(env={"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "utility"})
    names = {m.destination.rsplit("/", 1)[1] for m in utility.mounts}
    assert "libnvidia-ml.so.550.163.01" in names and "nvidia-smi" in names
    assert "libcuda.so.550.163.01" not in names
    assert not any(d.path.startswith("/dev/nvidia-uvm") for d in utility.devices)

    display = four.plan(env={"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "display"})
    assert any(d.path == "/dev/nvidia-modeset" for d in display.devices)

    compat = four.plan(env={"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "compute,compat32"})
    compat_default = four.plan(env={"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "compute"})
    has_32 = any(not lib.is_64bit for lib in four.inventory.libraries)
    assert (len(compat.mounts) > len(compat_default.mounts)) == has_32
    if has_32:
        assert "/usr/lib/i386-linux-gnu" in compat.ldconfig_folders


def test_symlinks_chain_dev_name_to_soname_to_file(four: Node) -> None:
    p = four.plan(annotations={"nvidia.com/gpus": "0"})
    links = {s.path: s.target for s in p.symlinks}
    folder = "/usr/lib/x86_64-linux-gnu"
    assert links[f"{folder}/libcuda.so.1"] == "libcuda.so.550.163.01"
    assert links[f"{folder}/libcuda.so"] == "libcuda.so.1"
    assert links[f"{folder}/libnvidia-ml.so.1"] == "libnvidia-ml.so.550.163.01"
    assert folder in p.ldconfig_folders


def test_none_gives_driver_files_but_no_gpu(four: Node) -> None:
    p = four.plan(env={"NVIDIA_VISIBLE_DEVICES": "none"})
    assert p.gpus == () and p.visible_bus_ids == ()
    assert [d.path for d in p.devices if d.path[11:].isdigit()] == []
    assert "/dev/nvidiactl" in [d.path for d in p.devices]
    assert p.mounts and dict(p.env)["NVIDIA_VISIBLE_DEVICES"] == "none"


@pytest.mark.parametrize(
    ("env", "annotations", "error", "message"),
    [
        ({}, {"nvidia.com/gpus": "7"}, UnknownDeviceError, "GPU 7 does not exist; this node has 4 GPUs (indexes 0-3)"),
        ({}, {"nvidia.com/gpus": "0,9"}, UnknownDeviceError, "GPU 9 does not exist"),
        (
            {"NVIDIA_VISIBLE_DEVICES": "GPU-00000000-0000-0000-0000-000000000000"},
            {},
            UnknownDeviceError,
            "no GPU with UUID GPU-00000000-0000-0000-0000-000000000000",
        ),
        ({"NVIDIA_VISIBLE_DEVICES": "0000:ff:00.0"}, {}, UnknownDeviceError, "no GPU at PCI bus id 0000:ff:00.0"),
        ({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=12.8"}, {}, RequirementError, "cuda>=12.8"),
        ({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_DRIVER": "driver>=560"}, {}, RequirementError, "driver>=560"),
    ],
    ids=["index-out-of-range", "one-bad-of-two", "unknown-uuid", "unknown-bus-id", "cuda-too-new", "driver-too-old"],
)
def test_refusals_name_the_bad_value_and_plan_nothing(
    four: Node, env: dict[str, str], annotations: dict[str, str], error: type[EngineError], message: str
) -> None:
    with pytest.raises(error) as exc:
        four.plan(env=env, annotations=annotations)
    assert message in str(exc.value)


def test_gpu_by_uuid_any_case_and_by_bus_id(four: Node) -> None:
    g = four.inventory.gpus[2]
    assert four.plan(env={"NVIDIA_VISIBLE_DEVICES": g.uuid.upper().replace("GPU-", "gpu-")}).gpus == (g,)
    assert four.plan(env={"NVIDIA_VISIBLE_DEVICES": g.bus_id}).gpus == (g,)
    assert four.plan(env={"NVIDIA_VISIBLE_DEVICES": "00000000" + g.bus_id[4:]}).gpus == (g,)


def test_met_requirement_passes(four: Node) -> None:
    p = four.plan(env={"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=12.0 brand=tesla,driver>=470"})
    assert len(p.gpus) == 1


def test_a_node_without_driver_refuses_gpu_requests(tmp_path: Path) -> None:
    node = Node(tmp_path, driver=False)
    with pytest.raises(RequestError, match="this node has no NVIDIA driver"):
        node.plan(annotations={"nvidia.com/gpus": "0"})


def test_planning_is_deterministic(four: Node) -> None:
    a = plan_to_dict(four.plan(env={"NVIDIA_VISIBLE_DEVICES": "3,1", "NVIDIA_DRIVER_CAPABILITIES": "all"}))
    b = plan_to_dict(four.plan(env={"NVIDIA_VISIBLE_DEVICES": "3,1", "NVIDIA_DRIVER_CAPABILITIES": "all"}))
    assert json.dumps(a) == json.dumps(b)


def test_capability_bound_caps_the_plan(tmp_path: Path) -> None:
    node = Node(tmp_path, gpus=1)
    policy = Policy(capabilities=frozenset({Capability.UTILITY}))
    info = ContainerInfo(name="main", env={"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "all"})
    outcome = parse_request(info, policy)
    assert outcome.request is not None
    assert outcome.request.capabilities == frozenset({Capability.UTILITY})
    p = plan(outcome.request, node.inventory, node.config)
    assert not any("libcuda" in m.destination for m in p.mounts)


def _normalize(value: Any, node: SimNode) -> Any:
    """``value`` as a golden file has it: the node's root written ``<ROOT>``."""
    text = json.dumps(value, indent=2, sort_keys=True)
    return json.loads(text.replace(str(node.root), "<ROOT>"))


def test_mount_sources_are_translated_to_host_paths_when_the_host_is_mounted_elsewhere(tmp_path: Path) -> None:
    """The DaemonSet case: we read the node under host_root; runc binds from the host's own paths."""
    node = Node(tmp_path / "host" / "node", gpus=1)
    config = EngineConfig(
        driver_root=str(node.sim.driver_root),
        dev_root=str(node.sim.dev_root),
        proc_root=str(node.sim.proc_root),
        host_root=str(tmp_path / "host"),
    )
    info = ContainerInfo(name="main", env={"NVIDIA_VISIBLE_DEVICES": "0"})
    outcome = parse_request(info, config.policy)
    assert outcome.request is not None
    p = plan(outcome.request, node.inventory, config)
    cuda = next(m for m in p.mounts if m.destination.endswith("/libcuda.so.550.163.01"))
    assert cuda.source == "/node/usr/lib/x86_64-linux-gnu/libcuda.so.550.163.01"
    assert all(m.source.startswith("/node/") for m in p.mounts)


@pytest.mark.parametrize(
    ("host_root", "path", "expected"),
    [
        ("/", "/run/nvidia/driver/lib", "/run/nvidia/driver/lib"),
        ("/host", "/host/run/nvidia/driver/lib", "/run/nvidia/driver/lib"),
        ("/host/", "/host/usr/lib", "/usr/lib"),
        ("/host", "/host", "/"),
    ],
)
def test_to_host_path(host_root: str, path: str, expected: str) -> None:
    assert EngineConfig(host_root=host_root).to_host_path(path) == expected


def test_a_path_outside_the_host_root_is_refused() -> None:
    with pytest.raises(EngineError, match=r"'/hostile/lib' is outside engine\.host_root /host"):
        EngineConfig(host_root="/host").to_host_path("/hostile/lib")


# The IPC mounts exactly as the runtime makes them (util-linux mount does what runc does
# for a bind: bind, then remount with the flags), in a private mount namespace.
_IPC_CLIENT = r"""
import json, os, socket, subprocess, sys
options, sock, sock_dst, mps, mps_dst = sys.argv[1:6]
subprocess.run(["mount", "-t", "tmpfs", "tmpfs", mps + "/submount"], check=True)
open(mps + "/submount/file", "w").close()
for src, dst in ((sock, sock_dst), (mps, mps_dst)):
    subprocess.run(["mount", "-o", options, src, dst], check=True)
out = {}
def attempt(name, action):
    try:
        action()
        out[name] = "ok"
    except OSError as exc:
        out[name] = os.strerror(exc.errno)
def connect():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.connect(sock_dst)
        c.sendall(b"hello")
def write_pipe():
    fd = os.open(mps_dst + "/control", os.O_WRONLY | os.O_NONBLOCK)
    os.write(fd, b"pipe")
    os.close(fd)
attempt("connect", connect)
attempt("chmod socket", lambda: os.chmod(sock_dst, 0o600))
attempt("write pipe", write_pipe)
attempt("create in mps dir", lambda: open(mps_dst + "/planted", "w").close())
attempt("chmod mps dir", lambda: os.chmod(mps_dst, 0o777))
out["submount visible"] = os.path.exists(mps_dst + "/submount/file")
print(json.dumps(out))
"""


def test_ipc_endpoints_are_read_only_plain_binds_that_clients_still_use(tmp_path: Path) -> None:
    """connect(2) needs write permission on the socket's inode, not a writable mount, and
    a FIFO opens for writing on a read-only mount: so the endpoints go in read-only, and a
    container (root in it, or not) can neither chmod the host's socket nor plant files in
    the host's MPS folder. A plain bind: nothing mounted under the folder comes along."""
    sock, mps = tmp_path / "socket", tmp_path / "nvidia-mps"
    (mps / "submount").mkdir(parents=True)
    os.mkfifo(mps / "control")
    (tmp_path / "socket-dst").touch()
    (tmp_path / "mps-dst").mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(sock))
        server.listen(1)
        reader = os.open(mps / "control", os.O_RDONLY | os.O_NONBLOCK)
        try:
            options = ",".join(o for o in IPC_OPTIONS if o != "rprivate")  # propagation is no -o flag
            done = subprocess.run(
                ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", _IPC_CLIENT, options,
                 str(sock), str(tmp_path / "socket-dst"), str(mps), str(tmp_path / "mps-dst")],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            conn, _ = server.accept()
            with conn:
                assert conn.recv(16) == b"hello"
            assert os.read(reader, 16) == b"pipe"
        finally:
            os.close(reader)
    assert json.loads(done.stdout) == {
        "connect": "ok",
        "chmod socket": "Read-only file system",
        "write pipe": "ok",
        "create in mps dir": "Read-only file system",
        "chmod mps dir": "Read-only file system",
        "submount visible": False,
    }
    assert not (mps / "planted").exists()


@pytest.mark.parametrize(
    ("host_root", "path"),
    [
        ("/host", "/host/../etc/shadow"),  # a string prefix match, but the host's /etc
        ("/host", "/host/run/../../etc/shadow"),
        ("/host", "/host/./run/nvidia"),
        ("/host", "/host//run/nvidia"),
        ("/host", "host/run/nvidia"),
        ("/", "/run/nvidia/driver/missing/../../../../etc/shadow"),
        ("/", "run/nvidia/driver"),
        ("/", "/run/nvidia/driver/."),
    ],
)
def test_a_mount_source_that_is_not_a_clean_absolute_path_is_refused(host_root: str, path: str) -> None:
    """runc resolves ``..`` in a mount source itself (through links, too): what we checked
    and what it binds would differ. The message names the path."""
    with pytest.raises(EngineError, match=re.escape(repr(path))):
        EngineConfig(host_root=host_root).to_host_path(path)


def test_a_planned_mount_source_with_dotdot_is_refused_not_emitted(four: Node) -> None:
    """Defence in depth: an inventory path that climbs out of the driver root never
    reaches the runtime, whatever discovery let through."""
    hostile = DriverFile("/usr/bin/nvidia-smi", "/missing/../../../../etc/shadow", FileKind.BINARY, frozenset())
    inventory = dataclasses.replace(four.inventory, files=(hostile,))
    info = ContainerInfo(name="main", env={"NVIDIA_VISIBLE_DEVICES": "0"})
    outcome = parse_request(info, four.config.policy)
    assert outcome.request is not None
    with pytest.raises(EngineError, match=re.escape("/missing/../../../../etc/shadow")):
        plan(outcome.request, inventory, four.config)


def test_roots_are_normalised_and_dotdot_in_a_root_is_refused() -> None:
    config = EngineConfig(driver_root="/host/run/nvidia/driver/", host_root="/host/")
    assert (config.driver_root, config.host_root) == ("/host/run/nvidia/driver", "/host")
    with pytest.raises(EngineError, match=r"engine\.driver_root: '/host/run/\.\./etc'"):
        EngineConfig(driver_root="/host/run/../etc")


def test_engine_mps_is_a_boolean_and_off_by_default() -> None:
    assert EngineConfig().mps is False
    assert from_tables({"mps": True}, {}).mps is True
    with pytest.raises(EngineError, match=r"engine\.mps: expected true or false, got 'yes'"):
        from_tables({"mps": "yes"}, {})
