"""The CDI spec (engine.cdi) and the work it hands its compiled hook, on simulated nodes.

The spec must equal the engine's plan: a device's edits are its GPU node, the
spec-wide edits the plan's other nodes, mounts and env, and a hook whose one
``--work`` argument (``hook_work``) is the plan's spec-wide start work with the
roots as the host sees them and the node's devices as the spec names them. That
argument is read here by the compiled hook itself (``nri-gpu-hook``, which this
test run's venv holds): it must take what the spec writes. A golden file keeps the
whole spec of a 2-GPU node (tests/integration/test_golden.py). The hook's own
choices (which GPUs a container's devices select) are the hook crate's unit tests;
it runs under runc in tests/e2e/test_cdi.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from nri_gpu.engine.catalogue import IPC_TYPES
from nri_gpu.engine.cdi import (
    HOOK_ENV,
    HOOK_TIME_LIMIT,
    HOOK_TIMEOUT,
    HOOK_WORK_VERSION,
    cdi_spec,
    hook_command,
    hook_work,
)
from nri_gpu.engine.config import EngineConfig, LdCache, Policy
from nri_gpu.engine.discover import discover
from nri_gpu.engine.errors import DiscoveryError
from nri_gpu.engine.model import DEFAULT_CAPABILITIES, Capability, Inventory
from nri_gpu.engine.plan import plan
from nri_gpu.engine.request import ByIndex, GpuRequest, Selection
from nri_gpu.engine.start.work import start_work
from testbed.gpunode import CAPS_MAJOR, FIXTURE_DRIVER, FIXTURE_NO_DRIVER, SimNode, build_node
from testbed.plugins import NRI_GPU_HOOK

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "cdi-2-gpu.json"
HOOK = hook_command("/usr/bin/nri-gpu-hook")
WORK_KEYS = {
    "version", "symlinks", "ldconfig_folders", "ld_cache_entries", "ld_cache", "ldconfig", "proc_source",
    "ipc_root", "ipc", "cuda_compat", "driver_version", "graphics", "nvidia_major", "caps_major", "gpus",
    "gpu_instances", "monitor_minor", "config_minor",
}  # fmt: skip


def _cuda(path: str) -> tuple[str | None, str | None]:
    return "12.4", None


def _node(root: Path, *, real: bool = False, **kw: Any) -> tuple[SimNode, EngineConfig, Inventory]:
    """On the committed driver fixture unless ``real`` (NVIDIA's files: the golden spec)."""
    if not real:
        kw.setdefault("driver_files", FIXTURE_DRIVER if kw.get("driver", True) else FIXTURE_NO_DRIVER)
    sim = build_node(root, **kw)
    config = EngineConfig(driver_root=str(sim.driver_root), dev_root=str(sim.dev_root), proc_root=str(sim.proc_root))
    return sim, config, discover(config, cuda_version=_cuda)


def the_hook(spec: dict[str, Any]) -> dict[str, Any]:
    (hook,) = spec["containerEdits"]["hooks"]
    assert isinstance(hook, dict)
    return hook


def spec_work(spec: dict[str, Any]) -> dict[str, Any]:
    """The work description the spec's hook is given: its last argument, after ``--work``."""
    args = the_hook(spec)["args"]
    assert args[-2] == "--work", args[:-1]
    work = json.loads(args[-1])
    assert isinstance(work, dict)
    return work


def run_spec_hook(spec: dict[str, Any], state: bytes) -> subprocess.CompletedProcess[str]:
    """The spec's hook command line, run by this venv's compiled hook (the spec names
    /usr/bin/nri-gpu-hook), with ``state`` on stdin as the runtime gives it."""
    args = the_hook(spec)["args"]
    return subprocess.run(
        [NRI_GPU_HOOK, *args[1:]], input=state.decode(), capture_output=True, text=True, timeout=30, env={}, cwd="/"
    )


def assert_the_hook_takes_its_work(spec: dict[str, Any], tmp_path: Path) -> None:
    """The compiled hook reads the spec's ``--work`` (a description it refuses is a
    usage error, status 2, before stdin is read) and goes on to the container's
    bundle: here one without a config.json, where it stops, touching nothing."""
    bundle = tmp_path / "no-bundle"
    done = run_spec_hook(spec, json.dumps({"ociVersion": "1.0.2", "id": "c1", "bundle": str(bundle)}).encode())
    assert (done.returncode, done.stderr) == (1, f"nri-gpu hook: {bundle}/config.json: No such file or directory\n")


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> tuple[SimNode, EngineConfig, Inventory]:
    return _node(tmp_path_factory.mktemp("four"), gpus=4)


def test_every_gpu_by_index_and_uuid_with_its_own_node(four: tuple[SimNode, EngineConfig, Inventory]) -> None:
    sim, config, inventory = four
    spec = cdi_spec(inventory, config, DEFAULT_CAPABILITIES, HOOK)
    by_name = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert list(by_name) == [n for g in sim.gpus for n in (str(g.index), g.uuid)] + ["all"]
    for g in sim.gpus:
        node = {"path": f"/dev/nvidia{g.minor}", "type": "c", "major": 195, "minor": g.minor, "fileMode": 0o666}
        assert by_name[str(g.index)] == by_name[g.uuid] == {"deviceNodes": [node]}
    assert sorted(n["minor"] for n in by_name["all"]["deviceNodes"]) == sorted(g.minor for g in sim.gpus)


def test_common_edits_are_the_plan_less_the_gpu_nodes(four: tuple[SimNode, EngineConfig, Inventory]) -> None:
    _, config, inventory = four
    caps = frozenset({Capability.COMPUTE, Capability.UTILITY, Capability.VIDEO})
    spec = cdi_spec(inventory, config, caps, HOOK)
    two = plan(GpuRequest(Selection.LIST, (ByIndex(0), ByIndex(2)), caps, (), "test"), inventory, config)
    common = spec["containerEdits"]
    assert [(m["containerPath"], m["hostPath"], tuple(m["options"])) for m in common["mounts"]] == [
        (m.destination, m.source, m.options) for m in two.mounts
    ]
    assert all(m["type"] == "bind" for m in common["mounts"])
    per_gpu = {n["path"] for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])}
    assert {n["path"] for n in common["deviceNodes"]} == {d.path for d in two.devices} - per_gpu
    assert common["env"] == ["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_DRIVER_CAPABILITIES=compute,utility,video"]
    work = json.dumps(hook_work(inventory, config, caps), separators=(",", ":"))
    assert common["hooks"] == [
        {
            "hookName": "createContainer",
            "path": HOOK.path,
            "args": [*HOOK.args, "--work", work],
            "env": list(HOOK_ENV),
            "timeout": HOOK_TIMEOUT,
        }
    ]
    assert spec_work(spec) == hook_work(inventory, config, caps)


def test_the_hook_gets_a_path_only_and_its_own_limit_comes_before_the_runtimes(
    four: tuple[SimNode, EngineConfig, Inventory],
) -> None:
    # The compiled hook reads nothing of its environment: a PATH, as any hook gets.
    _, config, inventory = four
    hook = the_hook(cdi_spec(inventory, config, DEFAULT_CAPABILITIES, HOOK))
    assert hook["env"] == ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    # runc's kill comes after the hook's own limit, so a slow hook fails with its message.
    limit = hook["args"][hook["args"].index("--time-limit") + 1]
    assert float(limit) == HOOK_TIME_LIMIT
    assert isinstance(hook["timeout"], int) and HOOK_TIME_LIMIT < hook["timeout"] <= 60


def test_the_hook_command_is_the_compiled_hooks_start_container() -> None:
    assert hook_command("/usr/local/lib/nri-gpu/venv/bin/nri-gpu-hook") == dataclasses.replace(
        HOOK,
        path="/usr/local/lib/nri-gpu/venv/bin/nri-gpu-hook",
        args=("/usr/local/lib/nri-gpu/venv/bin/nri-gpu-hook", "start-container", "--time-limit", "10"),
    )
    assert (HOOK.env, HOOK.timeout) == (HOOK_ENV, HOOK_TIMEOUT)
    with pytest.raises(ValueError, match="absolute path, not 'nri-gpu-hook'"):
        hook_command("nri-gpu-hook")


def test_the_work_holds_the_node_as_the_spec_names_it(four: tuple[SimNode, EngineConfig, Inventory]) -> None:
    """The numbers the hook matches the container's ``linux.devices`` against are the
    ones the spec's devices carry: each GPU's minor (by index) with its bus id, the
    majors, the MIG grants' minors."""
    sim, config, inventory = four
    spec = cdi_spec(inventory, config, DEFAULT_CAPABILITIES, HOOK)
    work = spec_work(spec)
    assert set(work) == WORK_KEYS and work["version"] == HOOK_WORK_VERSION == 1
    assert work["gpus"] == [[g.minor, g.bus_id] for g in sim.gpus]
    by_name = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    assert [[by_name[str(i)][0]["minor"], bus] for i, (_, bus) in enumerate(work["gpus"])] == work["gpus"]
    assert work["nvidia_major"] == by_name["0"][0]["major"] == 195
    assert work["caps_major"] == CAPS_MAJOR
    assert inventory.mig.monitor is not None and inventory.mig.config is not None
    assert (work["monitor_minor"], work["config_minor"]) == (inventory.mig.monitor.minor, inventory.mig.config.minor)
    assert work["gpu_instances"] == []
    assert (work["driver_version"], work["cuda_compat"], work["graphics"]) == ("550.163.01", True, False)


def test_the_work_is_the_start_work_the_nri_path_plans(four: tuple[SimNode, EngineConfig, Inventory]) -> None:
    """The spec-wide part of the start work is what the NRI path gives a container of
    the same capabilities at StartContainer (any GPUs: it does not depend on them)."""
    _, config, inventory = four
    caps = frozenset({Capability.COMPUTE, Capability.UTILITY})
    work = hook_work(inventory, config, caps)
    two = plan(GpuRequest(Selection.LIST, (ByIndex(0), ByIndex(2)), caps, (), "test"), inventory, config)
    nri = start_work(
        two,
        "c",
        config.proc_root,
        config.ld_cache,
        driver_root=config.driver_root,
        cuda_compat=config.policy.cuda_compat,
        driver_version=inventory.driver_version or "",
    )
    assert nri.symlinks and nri.ld_cache_entries  # something to compare
    assert work["symlinks"] == [[s.path, s.target] for s in nri.symlinks]
    assert work["ldconfig_folders"] == list(nri.ldconfig_folders)
    assert work["ld_cache_entries"] == [
        [e.name, e.path, e.flags, e.is_64bit, e.hwcap, e.osversion] for e in nri.ld_cache_entries
    ]
    assert (work["ld_cache"], work["ldconfig"]) == (nri.ld_cache.value, config.ldconfig)
    assert (work["proc_source"], work["ipc_root"]) == (nri.proc_source, nri.ipc_root)
    assert (work["cuda_compat"], work["driver_version"]) == (nri.cuda_compat, nri.driver_version)
    # The IPC endpoints the hook may find bound: every one of the catalogue, with
    # the source a spec's mount of it has.
    assert [(path, kind) for path, kind, _ in work["ipc"]] == sorted((p, k.value) for p, k in IPC_TYPES.items())
    assert [source for _, _, source in work["ipc"]] == [config.driver_root + p for p, _, _ in work["ipc"]]


@pytest.mark.parametrize(
    ("caps", "graphics"),
    [
        ({Capability.COMPUTE, Capability.UTILITY}, False),
        ({Capability.COMPUTE, Capability.VIDEO, Capability.COMPAT32, Capability.NGX}, False),
        ({Capability.GRAPHICS}, True),
        ({Capability.DISPLAY, Capability.UTILITY}, True),
    ],
    ids=["compute", "no-graphics", "graphics", "display"],
)
def test_the_work_says_whether_the_application_profile_applies(
    four: tuple[SimNode, EngineConfig, Inventory], caps: set[Capability], graphics: bool
) -> None:
    _, config, inventory = four
    assert hook_work(inventory, config, frozenset(caps))["graphics"] is graphics


def test_every_root_is_given_as_the_host_sees_it(tmp_path: Path) -> None:
    """The DaemonSet with the GPU operator's driver: the plugin reads the host under
    /host, the driver under /host/run/nvidia/driver; the hook runs on the host."""
    host = tmp_path / "host"
    sim = build_node(host, gpus=2, driver_subdir="run/nvidia/driver", driver_files=FIXTURE_DRIVER)
    assert sim.proc_root == host / "proc"
    config = EngineConfig(
        driver_root=str(sim.driver_root), dev_root=str(sim.dev_root), proc_root=str(sim.proc_root), host_root=str(host)
    )
    inventory = discover(config, cuda_version=_cuda)
    spec = cdi_spec(inventory, config, DEFAULT_CAPABILITIES, HOOK)
    work = spec_work(spec)
    assert work["proc_source"] is None  # the host's own /proc: read in place
    assert work["ipc_root"] == "/run/nvidia/driver"
    assert work["ipc"] == [
        ["/run/nvidia-fabricmanager/socket", "socket", "/run/nvidia/driver/run/nvidia-fabricmanager/socket"],
        ["/run/nvidia-persistenced/socket", "socket", "/run/nvidia/driver/run/nvidia-persistenced/socket"],
        ["/tmp/nvidia-mps", "directory", "/run/nvidia/driver/tmp/nvidia-mps"],
    ]
    # Container paths are not translated: the links and the cache entries are the image's.
    assert work["symlinks"] and all(not path.startswith(str(tmp_path)) for path, _ in work["symlinks"])
    assert work["ld_cache_entries"] and all(not e[1].startswith(str(tmp_path)) for e in work["ld_cache_entries"])
    assert str(tmp_path) not in json.dumps(spec)


def test_a_procfs_elsewhere_is_the_hooks_proc_source(tmp_path: Path) -> None:
    # A node under /host/node: its procfs is /node/proc as the host sees it.
    sim = build_node(tmp_path / "host" / "node", gpus=1, driver_files=FIXTURE_DRIVER)
    config = EngineConfig(
        driver_root=str(sim.driver_root),
        dev_root=str(sim.dev_root),
        proc_root=str(sim.proc_root) + "/",
        host_root=str(tmp_path / "host"),
    )
    work = hook_work(discover(config, cuda_version=_cuda), config, DEFAULT_CAPABILITIES)
    assert (work["proc_source"], work["ipc_root"]) == ("/node/proc/driver/nvidia", "/node")
    assert work["ipc"][1] == ["/run/nvidia-persistenced/socket", "socket", "/node/run/nvidia-persistenced/socket"]


def test_an_ipc_endpoint_the_spec_binds_is_the_hooks_candidate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hook checks an endpoint where the bundle has a mount at its path from its
    source: the spec's mount of it must name that very source."""
    sim = build_node(tmp_path / "node", gpus=1, driver_files=FIXTURE_DRIVER)
    folder = sim.driver_root / "run" / "nvidia-persistenced"
    folder.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(folder)  # a socket's path is short: bound by a relative name
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind("socket")
        os.chmod("socket", 0o666)
        config = EngineConfig(
            driver_root=str(sim.driver_root), dev_root=str(sim.dev_root), proc_root=str(sim.proc_root)
        )
        inventory = discover(config, cuda_version=_cuda)
        spec = cdi_spec(inventory, config, DEFAULT_CAPABILITIES, HOOK)
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    candidates = {path: source for path, _, source in spec_work(spec)["ipc"]}
    assert mounts["/run/nvidia-persistenced/socket"] == candidates["/run/nvidia-persistenced/socket"]
    assert candidates["/run/nvidia-persistenced/socket"] == str(folder / "socket")


def test_the_work_follows_the_ld_cache_mode_and_ldconfig(four: tuple[SimNode, EngineConfig, Inventory]) -> None:
    _, config, inventory = four
    rebuild = dataclasses.replace(config, ld_cache=LdCache.REBUILD, ldconfig="/usr/sbin/ldconfig.real")
    work = hook_work(inventory, rebuild, DEFAULT_CAPABILITIES)
    assert (work["ld_cache"], work["ldconfig"]) == ("rebuild", "/usr/sbin/ldconfig.real")
    assert hook_work(inventory, config, DEFAULT_CAPABILITIES)["ld_cache"] == "merge"


@pytest.mark.parametrize(
    "variant",
    ["default", "all-capabilities", "rebuild", "no-cuda-compat"],
)
def test_the_compiled_hook_takes_the_work_the_spec_writes(
    four: tuple[SimNode, EngineConfig, Inventory], tmp_path: Path, variant: str
) -> None:
    _, config, inventory = four
    caps = DEFAULT_CAPABILITIES
    if variant == "all-capabilities":
        caps = frozenset(Capability)
    elif variant == "rebuild":
        config = dataclasses.replace(config, ld_cache=LdCache.REBUILD)
    elif variant == "no-cuda-compat":
        config = dataclasses.replace(config, policy=Policy(cuda_compat=False))
    assert_the_hook_takes_its_work(cdi_spec(inventory, config, caps, HOOK), tmp_path)


def test_a_node_without_gpus_has_no_spec(tmp_path: Path) -> None:
    _, config, inventory = _node(tmp_path / "none", driver=False)
    with pytest.raises(DiscoveryError, match="a CDI spec needs at least one device"):
        cdi_spec(inventory, config, DEFAULT_CAPABILITIES, HOOK)
