"""The CDI hook's request (engine.hook.gpu_request) on a simulated MIG node.

The hook finds what the CDI devices gave the container by device numbers in the
bundle's ``linux.devices``: a MIG device is its parent's ``/dev/nvidia<M>`` with
its GPU and compute instances' ``nvidia-caps`` nodes, and must give the same plan
(the same procfs view) as asking for it by name through NRI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.config import EngineConfig
from engine.discover import discover
from engine.hook import gpu_request
from engine.model import DEFAULT_CAPABILITIES, Inventory, NvmlSnapshot
from engine.plan import plan
from engine.request import ByIndex, ByMigPlacement, ContainerInfo, Selection, parse_request
from tests.testbed.gpunode import CAPS_MAJOR, FIXTURE_DRIVER, SimNode, build_node, cap_minor

NVIDIA = 195


def _no_nvml(path: str) -> tuple[NvmlSnapshot | None, str | None]:
    return None, "NVML unavailable (test)"


@pytest.fixture(scope="module")
def mig(tmp_path_factory: pytest.TempPathFactory) -> tuple[SimNode, EngineConfig, Inventory]:
    sim = build_node(
        tmp_path_factory.mktemp("mig"), gpus=4, mig={2: [(2, [0, 1]), (3, [0])]}, driver_files=FIXTURE_DRIVER
    )
    config = EngineConfig(driver_root=str(sim.driver_root), dev_root=str(sim.dev_root), proc_root=str(sim.proc_root))
    return sim, config, discover(config, cuda_version=lambda path: ("12.4", None), nvml=_no_nvml)


def _bundle(*devices: tuple[int, int]) -> dict[str, Any]:
    return {"linux": {"devices": [{"path": "/dev/x", "type": "c", "major": ma, "minor": mi} for ma, mi in devices]}}


def _mig_nodes(sim: SimNode, gi: int, ci: int) -> list[tuple[int, int]]:
    m = sim.gpus[2].minor
    return [(NVIDIA, m), (CAPS_MAJOR, cap_minor(m, gi)), (CAPS_MAJOR, cap_minor(m, gi, ci))]


def test_a_mig_devices_nodes_are_its_placement_not_its_parent(mig: tuple[SimNode, EngineConfig, Inventory]) -> None:
    sim, _, inventory = mig
    request = gpu_request(_bundle((NVIDIA, 255), *_mig_nodes(sim, 2, 1)), inventory, DEFAULT_CAPABILITIES)
    assert request.selection is Selection.LIST
    assert request.ids == (ByMigPlacement("GPU-" + sim.gpus[2].uuid[4:].lower(), 2, 1),)
    assert (request.mig_monitor, request.mig_config) == (False, False)


def test_whole_gpus_and_mig_devices_together(mig: tuple[SimNode, EngineConfig, Inventory]) -> None:
    sim, _, inventory = mig
    config = _bundle(
        (NVIDIA, sim.gpus[3].minor), *_mig_nodes(sim, 3, 0), *_mig_nodes(sim, 2, 0), (NVIDIA, sim.gpus[0].minor)
    )
    request = gpu_request(config, inventory, DEFAULT_CAPABILITIES)
    uuid = "GPU-" + sim.gpus[2].uuid[4:].lower()
    assert request.ids == (ByIndex(0), ByIndex(3), ByMigPlacement(uuid, 2, 0), ByMigPlacement(uuid, 3, 0))


@pytest.mark.parametrize(
    ("which", "why"),
    [
        ("no gi", "a compute instance's node without its GPU instance's is no MIG device"),
        ("no ci", "a GPU instance's node alone is no MIG device"),
        ("no parent", "caps without the parent's node are no MIG device"),
        ("other major", "the numbers of another device are not caps"),
    ],
)
def test_half_a_mig_device_is_none(mig: tuple[SimNode, EngineConfig, Inventory], which: str, why: str) -> None:
    sim, _, inventory = mig
    parent, gi, ci = _mig_nodes(sim, 2, 0)
    devices = {
        "no gi": [parent, ci],
        "no ci": [parent, gi],
        "no parent": [gi, ci],
        "other major": [parent, (CAPS_MAJOR + 1, gi[1]), (CAPS_MAJOR + 1, ci[1])],
    }[which]
    request = gpu_request(_bundle(*devices), inventory, DEFAULT_CAPABILITIES)
    wanted = () if which == "no parent" else (ByIndex(2),)  # only the parent: the whole GPU, as before MIG
    assert request.ids == wanted, why


def test_monitor_and_config_nodes_are_the_grants(mig: tuple[SimNode, EngineConfig, Inventory]) -> None:
    _, _, inventory = mig
    assert inventory.mig.monitor is not None and inventory.mig.config is not None
    monitor, config = inventory.mig.monitor.minor, inventory.mig.config.minor
    request = gpu_request(_bundle((CAPS_MAJOR, monitor)), inventory, DEFAULT_CAPABILITIES)
    assert (request.selection, request.mig_monitor, request.mig_config) == (Selection.NONE, True, False)
    request = gpu_request(_bundle((CAPS_MAJOR, config), (CAPS_MAJOR, monitor)), inventory, DEFAULT_CAPABILITIES)
    assert (request.mig_monitor, request.mig_config) == (True, True)
    assert not gpu_request(_bundle((NVIDIA, monitor)), inventory, DEFAULT_CAPABILITIES).mig_monitor


def test_a_bool_or_string_number_is_no_device(mig: tuple[SimNode, EngineConfig, Inventory]) -> None:
    sim, _, inventory = mig
    config = {
        "linux": {
            "devices": [
                {"type": "c", "major": NVIDIA, "minor": True},
                {"type": "c", "major": NVIDIA, "minor": str(sim.gpus[0].minor)},
                {"type": "c", "major": float(NVIDIA), "minor": sim.gpus[1].minor},
            ]
        }
    }
    assert gpu_request(config, inventory, DEFAULT_CAPABILITIES).selection is Selection.NONE


def test_the_hooks_plan_shows_what_the_nri_path_shows(mig: tuple[SimNode, EngineConfig, Inventory]) -> None:
    sim, config, inventory = mig
    uuid = sim.gpus[2].uuid
    hooked = plan(gpu_request(_bundle(*_mig_nodes(sim, 2, 1)), inventory, DEFAULT_CAPABILITIES), inventory, config)
    info = ContainerInfo(name="main", pod_annotations={"nvidia.com/gpus": f"MIG-{uuid}/2/1"}, env={})
    asked = parse_request(info, config.policy).request
    assert asked is not None
    by_name = plan(asked, inventory, config)
    m = sim.gpus[2].minor
    assert hooked.proc_caps == by_name.proc_caps == (f"gpu{m}/mig/gi2/access", f"gpu{m}/mig/gi2/ci1/access")
    assert hooked.visible_bus_ids == by_name.visible_bus_ids == (sim.gpus[2].bus_id,)
    assert hooked.devices == by_name.devices
    assert not hooked.gpus


def test_a_node_without_mig_is_as_before(tmp_path: Path) -> None:
    sim = build_node(tmp_path, gpus=2, driver_files=FIXTURE_DRIVER)
    config = EngineConfig(driver_root=str(sim.driver_root), dev_root=str(sim.dev_root), proc_root=str(sim.proc_root))
    inventory = discover(config, cuda_version=lambda path: ("12.4", None), nvml=_no_nvml)
    request = gpu_request(_bundle((NVIDIA, sim.gpus[1].minor), (CAPS_MAJOR, 2)), inventory, DEFAULT_CAPABILITIES)
    assert request.ids == (ByIndex(1),)
    assert inventory.mig.monitor is not None and request.mig_monitor  # the node's monitor cap exists without MIG
