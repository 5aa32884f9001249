"""The golden files (tests/golden): what containers get on a node of NVIDIA's own
550.163.01 files, per scenario; ``NRI_GPU_UPDATE_GOLDEN=1`` rewrites them (then review
the diff). Integration, not unit: the node is the simulated one of the real driver tree
(downloaded once); the unit tests of the same code run on the committed fixture.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nri_gpu.engine.cdi import cdi_spec
from nri_gpu.engine.errors import EngineError
from nri_gpu.engine.model import DEFAULT_CAPABILITIES, Capability
from nri_gpu.engine.report import inventory_to_dict, plan_to_dict
from tests.unit.engine import golden
from tests.unit.engine.test_cdi import GOLDEN as CDI_GOLDEN
from tests.unit.engine.test_cdi import HOOK, _node, assert_the_hook_takes_its_work
from tests.unit.engine.test_plan import GOLDEN, Node, _normalize
from tests.unit.engine.test_plan_fabric import ALL_FEATURES

# -- plans -------------------------------------------------------------------------------

SCENARIOS: dict[str, dict[str, Any]] = {
    "1-gpu": {"gpus": 1},
    "4-gpu": {"gpus": 4},
    "8-gpu": {"gpus": 8},
    "gpu-operator": {"gpus": 2, "driver_subdir": "run/nvidia/driver"},
    "no-driver": {"driver": False},
}

REQUESTS: dict[str, dict[str, Any]] = {
    "annotation-0,1": {"annotations": {"nvidia.com/gpus": "0,1"}},
    "env-all-all-caps": {"env": {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "all"}},
    "env-last-utility": {"env": {"NVIDIA_VISIBLE_DEVICES": "LAST", "NVIDIA_DRIVER_CAPABILITIES": "utility"}},
    "env-none": {"env": {"NVIDIA_VISIBLE_DEVICES": "none"}},
    "container-annotation-wins": {
        "annotations": {"nvidia.com/gpus": "0", "nvidia.com/gpus.container.main": "LAST"},
    },
}


def _scenario_result(node: Node) -> dict[str, Any]:
    last = str(max(len(node.inventory.gpus) - 1, 0))
    result: dict[str, Any] = {"inventory": inventory_to_dict(node.inventory), "plans": {}}
    for name, request in REQUESTS.items():
        request = json.loads(json.dumps(request).replace("LAST", last))
        try:
            result["plans"][name] = plan_to_dict(node.plan(**request))
        except EngineError as exc:
            result["plans"][name] = {"error": f"{type(exc).__name__}: {exc}"}
    return _normalize(result, node.sim)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_plan_golden(scenario: str, tmp_path: Path) -> None:
    node = Node(tmp_path / "node", real=True, **SCENARIOS[scenario])
    result = _scenario_result(node)
    golden.check(GOLDEN / f"plan-{scenario}.json", result)


# -- fabric and I/O devices -----------------------------------------------------------

FABRIC_REQUESTS: dict[str, dict[str, Any]] = {
    "imex-0,5": {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_IMEX_CHANNELS": "0,5"},
    "all-features": {"NVIDIA_VISIBLE_DEVICES": "1", **ALL_FEATURES},
    "gds": {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_GDS": "enabled"},
    "none-with-gds": {"NVIDIA_VISIBLE_DEVICES": "none", "NVIDIA_GDS": "enabled"},
    "channel-2048": {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_IMEX_CHANNELS": "2048"},
}


@pytest.mark.parametrize("scenario", ["fabric", "fabric-absent"])
def test_fabric_golden(scenario: str, tmp_path: Path) -> None:
    node = Node(tmp_path / "node", gpus=2, fabric=scenario == "fabric", real=True)
    if not node.sim.real_device_nodes:
        pytest.skip("the golden file has real character devices (root)")
    plans: dict[str, Any] = {}
    for name, env in FABRIC_REQUESTS.items():
        try:
            plans[name] = plan_to_dict(node.plan(env))
        except EngineError as exc:
            plans[name] = {"error": f"{type(exc).__name__}: {exc}"}
    result = _normalize({"inventory_fabric": inventory_to_dict(node.inventory).get("fabric"), "plans": plans}, node.sim)
    golden.check(GOLDEN / f"plan-{scenario}.json", result)


# -- the CDI spec ------------------------------------------------------------------------


def test_cdi_golden_spec(tmp_path: Path) -> None:
    sim, config, inventory = _node(tmp_path / "node", gpus=2, real=True)
    text = json.dumps(cdi_spec(inventory, config, DEFAULT_CAPABILITIES, HOOK), indent=2, sort_keys=True)
    result = json.loads(text.replace(str(sim.root), "<ROOT>"))
    golden.check(CDI_GOLDEN, result)


def test_the_largest_spec_is_one_argument_the_compiled_hook_takes(tmp_path: Path) -> None:
    """NVIDIA's files for every capability on 8 GPUs with MIG instances: the hook's work
    (every library's link and cache entry) is one argument, which the kernel bounds
    at 128 KiB and the hook reads whole."""
    _, config, inventory = _node(tmp_path / "node", gpus=8, real=True, mig={0: [(1, [0, 1, 2]), (2, [0])]})
    spec = cdi_spec(inventory, config, frozenset(Capability), HOOK)
    work = spec["containerEdits"]["hooks"][0]["args"][-1]
    assert len(json.loads(work)["ld_cache_entries"]) > 40 and len(work.encode()) < 32 << 10
    assert_the_hook_takes_its_work(spec, tmp_path)
