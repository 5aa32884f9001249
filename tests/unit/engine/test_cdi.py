"""The CDI spec (engine.cdi) and the hook's parsing (engine.hook) on simulated nodes.

The spec must equal the engine's plan: a device's edits are its GPU node, the
spec-wide edits the plan's other nodes, mounts and env. A golden file keeps the
whole spec of a 2-GPU node (tests/integration/test_golden.py). The hook
itself runs under runc in tests/e2e/test_cdi.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.cdi import HOOK_ENV, HOOK_TIME_LIMIT, HOOK_TIMEOUT, cdi_spec, hook_command
from engine.config import EngineConfig
from engine.discover import discover
from engine.errors import DiscoveryError
from engine.hook import HookError, gpu_request, ipc_mounts, parse_state, rootfs
from engine.model import DEFAULT_CAPABILITIES, Capability, Inventory
from engine.plan import plan
from engine.request import ByIndex, GpuRequest, Selection
from tests.testbed.gpunode import FIXTURE_DRIVER, FIXTURE_NO_DRIVER, SimNode, build_node

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "cdi-2-gpu.json"
HOOK = hook_command("/usr/bin/nri-gpu", EngineConfig(), DEFAULT_CAPABILITIES)


def _cuda(path: str) -> tuple[str | None, str | None]:
    return "12.4", None


def _node(root: Path, *, real: bool = False, **kw: Any) -> tuple[SimNode, EngineConfig, Inventory]:
    """On the committed driver fixture unless ``real`` (NVIDIA's files: the golden spec)."""
    if not real:
        kw.setdefault("driver_files", FIXTURE_DRIVER if kw.get("driver", True) else FIXTURE_NO_DRIVER)
    sim = build_node(root, **kw)
    config = EngineConfig(driver_root=str(sim.driver_root), dev_root=str(sim.dev_root), proc_root=str(sim.proc_root))
    return sim, config, discover(config, cuda_version=_cuda)


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
    assert common["hooks"] == [
        {
            "hookName": "createContainer",
            "path": HOOK.path,
            "args": list(HOOK.args),
            "env": list(HOOK_ENV),
            "timeout": HOOK_TIMEOUT,
        }
    ]


def test_hook_imports_nothing_from_the_bundle_and_has_a_time_limit(
    four: tuple[SimNode, EngineConfig, Inventory],
) -> None:
    # runc starts the hook with its working directory in the container's bundle:
    # Python must not put that (or the script's folder, or ~/.local) on sys.path.
    _, config, inventory = four
    hook = cdi_spec(inventory, config, DEFAULT_CAPABILITIES, HOOK)["containerEdits"]["hooks"][0]
    assert {"PYTHONSAFEPATH=1", "PYTHONNOUSERSITE=1"} <= set(hook["env"])
    assert [e.split("=")[0] for e in hook["env"]] == ["PATH", "PYTHONSAFEPATH", "PYTHONNOUSERSITE"]
    # runc's kill comes after the hook's own limit, so a slow hook fails with its message.
    assert isinstance(hook["timeout"], int) and HOOK_TIME_LIMIT < hook["timeout"] <= 60


def test_hook_gets_host_paths_and_the_capabilities(tmp_path: Path) -> None:
    config = EngineConfig(
        driver_root="/host/run/nvidia/driver", dev_root="/host", proc_root="/host/proc", host_root="/host"
    )
    hook = hook_command("/usr/local/bin/nri-gpu", config, frozenset({Capability.UTILITY, Capability.COMPUTE}))
    assert hook.args == (
        "/usr/local/bin/nri-gpu", "hook", "start-container",
        "--driver-root", "/run/nvidia/driver", "--dev-root", "/", "--proc-root", "/proc",
        "--ld-cache", "merge", "--ldconfig", "/sbin/ldconfig", "--capabilities", "compute,utility",
    )  # fmt: skip
    with pytest.raises(ValueError, match="absolute path, not 'nri-gpu'"):
        hook_command("nri-gpu", config, DEFAULT_CAPABILITIES)


def test_a_node_without_gpus_has_no_spec(tmp_path: Path) -> None:
    _, config, inventory = _node(tmp_path / "none", driver=False)
    with pytest.raises(DiscoveryError, match="a CDI spec needs at least one device"):
        cdi_spec(inventory, config, DEFAULT_CAPABILITIES, HOOK)


# -- the hook's inputs ---------------------------------------------------------------


def test_gpus_come_from_the_bundles_device_list(four: tuple[SimNode, EngineConfig, Inventory]) -> None:
    sim, _, inventory = four
    g1, g3 = sim.gpus[1], sim.gpus[3]
    config = {
        "linux": {
            "devices": [
                {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
                {"path": f"/dev/nvidia{g3.minor}", "type": "c", "major": 195, "minor": g3.minor},
                {"path": f"/dev/nvidia{g1.minor}", "type": "c", "major": 195, "minor": g1.minor},
                {"path": "/dev/other", "type": "c", "major": 10, "minor": g1.minor},
                {"path": "/dev/blk", "type": "b", "major": 195, "minor": sim.gpus[0].minor},
                "garbage",
            ]
        }
    }
    request = gpu_request(config, inventory, DEFAULT_CAPABILITIES)
    assert request.selection is Selection.LIST and request.ids == (ByIndex(1), ByIndex(3))
    assert gpu_request({}, inventory, DEFAULT_CAPABILITIES).selection is Selection.NONE


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not json", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"bundle": "/b"}', "no container id"),
        (b'{"id": "c", "bundle": "relative"}', "bundle 'relative' is not an absolute path"),
        (b" " * (2 << 20), "over"),
    ],
)
def test_bad_state_is_named(data: bytes, message: str) -> None:
    with pytest.raises(HookError, match=message):
        parse_state(data)


def test_rootfs_is_relative_to_the_bundle() -> None:
    assert rootfs("/run/b", {"root": {"path": "rootfs"}}) == "/run/b/rootfs"
    assert rootfs("/run/b", {"root": {"path": "/var/lib/x/rootfs"}}) == "/var/lib/x/rootfs"
    with pytest.raises(HookError, match=r"no root\.path"):
        rootfs("/run/b", {"root": {}})


def test_the_hook_checks_the_ipc_endpoints_its_spec_bound() -> None:
    """What the spec named when it was written, whatever the hook's discovery finds
    now; a mount of another source at the same place is not ours to judge."""
    config = EngineConfig(driver_root="/run/nvidia/driver")
    bundle = {
        "mounts": [
            {"destination": "/tmp/nvidia-mps", "source": "/run/nvidia/driver/tmp/nvidia-mps", "type": "bind"},
            {
                "destination": "/run/nvidia-persistenced/socket",
                "source": "/run/nvidia/driver/run/nvidia-persistenced/socket",
            },
            {"destination": "/run/nvidia-fabricmanager/socket", "source": "/home/u/socket"},
            {"destination": "/usr/bin/nvidia-smi", "source": "/run/nvidia/driver/usr/bin/nvidia-smi"},
            "junk",
        ]
    }
    assert ipc_mounts(bundle, config) == ("/run/nvidia-persistenced/socket", "/tmp/nvidia-mps")
    assert ipc_mounts({"mounts": None}, config) == ()
