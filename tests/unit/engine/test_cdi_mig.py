"""The CDI spec's MIG devices (engine.cdi) and its hook's work on a simulated MIG node.

GPU 2 has GPU instances 2 (compute instances 0 and 1) and 3 (compute instance 0).
NVML's snapshot is made by hand: it names the devices ``2:0``, ``2:1`` and ``2:3``
(a gap in j, as NVML may leave) with MIG UUIDs. The toolkit's names for them,
their nodes, ``all`` as jit-cdi makes it, what is left out without NVML, and the
numbers the hook's work holds to tell a MIG device from the nodes a container got.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from nri_gpu.engine.cdi import cdi_spec, hook_work, named_mig_devices, spec_warnings
from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.discover import discover
from nri_gpu.engine.model import (
    DEFAULT_CAPABILITIES,
    DeviceKind,
    Inventory,
    NvmlGpu,
    NvmlMigDevice,
    NvmlSnapshot,
)
from nri_gpu.engine.plan import plan
from nri_gpu.engine.request import ByMigPlacement, GpuRequest, Selection
from testbed.gpunode import CAPS_MAJOR, FIXTURE_DRIVER, SimNode, build_node, cap_minor
from tests.unit.engine.test_cdi import HOOK, assert_the_hook_takes_its_work, spec_work

UUIDS = {
    0: "MIG-11111111-2222-3333-4444-000000000000",
    1: "MIG-11111111-2222-3333-4444-000000000001",
    3: "MIG-11111111-2222-3333-4444-000000000003",
}
PLACES = {0: (2, 0), 1: (2, 1), 3: (3, 0)}  # NVML's j -> (gi, ci)


def _no_nvml(path: str) -> tuple[NvmlSnapshot | None, str | None]:
    return None, "NVML unavailable (9: Driver Not Loaded)"


def snapshot(
    sim: SimNode, devices: dict[int, tuple[str, int, int]] | None = None, mig_on: tuple[int, ...] = (2,)
) -> NvmlSnapshot:
    """NVML's view: every GPU, GPU 2's MIG devices (j -> (uuid, gi, ci))."""
    if devices is None:
        devices = {j: (UUIDS[j], *PLACES[j]) for j in PLACES}
    mine = tuple(NvmlMigDevice(j, uuid, gi, ci) for j, (uuid, gi, ci) in sorted(devices.items()))
    return NvmlSnapshot(
        tuple(
            NvmlGpu(g.index, g.uuid, g.minor, g.index in mig_on, g.index in mig_on, mine if g.index == 2 else ())
            for g in sim.gpus
        )
    )


def with_nvml(inventory: Inventory, nvml: NvmlSnapshot | None) -> Inventory:
    return dataclasses.replace(inventory, mig=dataclasses.replace(inventory.mig, nvml=nvml))


@pytest.fixture(scope="module")
def mig(tmp_path_factory: pytest.TempPathFactory) -> tuple[SimNode, EngineConfig, Inventory]:
    sim = build_node(
        tmp_path_factory.mktemp("mig"), gpus=4, mig={2: [(2, [0, 1]), (3, [0])]}, driver_files=FIXTURE_DRIVER
    )
    config = EngineConfig(driver_root=str(sim.driver_root), dev_root=str(sim.dev_root), proc_root=str(sim.proc_root))
    inventory = discover(config, cuda_version=lambda path: ("12.4", None), nvml=_no_nvml)
    return sim, config, inventory


def gpu_node(minor: int) -> dict[str, Any]:
    return {"path": f"/dev/nvidia{minor}", "type": "c", "major": 195, "minor": minor, "fileMode": 0o666}


def cap_node(minor: int) -> dict[str, Any]:
    return {"path": f"/dev/nvidia-caps/nvidia-cap{minor}", "type": "c", "major": CAPS_MAJOR, "minor": minor,
            "fileMode": 0o444}  # fmt: skip


def by_name(spec: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {d["name"]: d["containerEdits"].get("deviceNodes", []) for d in spec["devices"]}


def test_each_mig_device_by_the_toolkits_two_names(mig: tuple[SimNode, EngineConfig, Inventory]) -> None:
    sim, config, inventory = mig
    spec = cdi_spec(with_nvml(inventory, snapshot(sim)), config, DEFAULT_CAPABILITIES, HOOK)
    names = by_name(spec)
    whole = [n for g in sim.gpus for n in (str(g.index), g.uuid)]
    assert list(names) == [*whole, "2:0", UUIDS[0], "2:1", UUIDS[1], "2:3", UUIDS[3], "all"]
    m = sim.gpus[2].minor
    for j, (gi, ci) in PLACES.items():
        nodes = [gpu_node(m), cap_node(cap_minor(m, gi)), cap_node(cap_minor(m, gi, ci))]
        assert names[f"2:{j}"] == names[UUIDS[j]] == nodes
    assert names["2"] == [gpu_node(m)]  # the whole GPU is still there, as the toolkit lists it
    assert spec_warnings(with_nvml(inventory, snapshot(sim))) == ()


def test_all_is_the_gpus_without_mig_and_every_mig_device(mig: tuple[SimNode, EngineConfig, Inventory]) -> None:
    sim, config, inventory = mig
    spec = cdi_spec(with_nvml(inventory, snapshot(sim, mig_on=(1, 2))), config, DEFAULT_CAPABILITIES, HOOK)
    m = sim.gpus[2].minor
    gpus = sorted(g.minor for g in sim.gpus if g.index != 1)  # 1: MIG on, no instances; 2: only as a parent
    caps = sorted(
        {cap_minor(m, gi) for gi, _ in PLACES.values()} | {cap_minor(m, gi, ci) for gi, ci in PLACES.values()}
    )
    assert by_name(spec)["all"] == [gpu_node(minor) for minor in gpus] + [cap_node(c) for c in caps]


def test_the_spec_equals_the_plan_for_a_mig_device(mig: tuple[SimNode, EngineConfig, Inventory]) -> None:
    sim, config, inventory = mig
    named = with_nvml(inventory, snapshot(sim))
    spec = cdi_spec(named, config, DEFAULT_CAPABILITIES, HOOK)
    request = GpuRequest(Selection.LIST, (ByMigPlacement(sim.gpus[2].uuid, 2, 1),), DEFAULT_CAPABILITIES, (), "t")
    planned = plan(request, named, config)
    own = [n for n in planned.devices if n.kind in (DeviceKind.GPU, DeviceKind.MIG_CAP)]
    assert by_name(spec)["2:1"] == [
        {"path": n.path, "type": n.type, "major": n.major, "minor": n.minor, "fileMode": n.mode} for n in own
    ]
    assert [m.name for m in planned.mig_devices] == [UUIDS[1]]
    common = spec["containerEdits"]["deviceNodes"]
    assert {n["path"] for n in common} == {n.path for n in planned.devices} - {n.path for n in own}


def test_the_work_names_each_mig_device_by_the_numbers_of_its_nodes(
    mig: tuple[SimNode, EngineConfig, Inventory], tmp_path: Path
) -> None:
    """The hook tells a MIG device by its nodes in the container's ``linux.devices``:
    its parent's minor, its GPU and compute instances' cap minors. Each device the
    spec names carries exactly the numbers of one compute instance of the work."""
    sim, config, inventory = mig
    spec = cdi_spec(with_nvml(inventory, snapshot(sim)), config, DEFAULT_CAPABILITIES, HOOK)
    work = spec_work(spec)
    m = sim.gpus[2].minor
    assert work["caps_major"] == CAPS_MAJOR and work["nvidia_major"] == 195
    assert work["gpu_instances"] == [
        [m, 2, cap_minor(m, 2), [[0, cap_minor(m, 2, 0)], [1, cap_minor(m, 2, 1)]]],
        [m, 3, cap_minor(m, 3), [[0, cap_minor(m, 3, 0)]]],
    ]
    instances = {
        (gpu, gi_minor, ci_minor): (gi, ci) for gpu, gi, gi_minor, cis in work["gpu_instances"] for ci, ci_minor in cis
    }
    names = by_name(spec)
    for j, place in PLACES.items():
        parent, gi_node, ci_node = names[f"2:{j}"]
        assert [parent["major"], gi_node["major"], ci_node["major"]] == [195, CAPS_MAJOR, CAPS_MAJOR]
        assert instances[(parent["minor"], gi_node["minor"], ci_node["minor"])] == place
    assert [g[0] for g in work["gpus"]] == [g.minor for g in sim.gpus]  # the parent is a GPU of the work
    assert inventory.mig.monitor is not None and inventory.mig.config is not None
    assert (work["monitor_minor"], work["config_minor"]) == (inventory.mig.monitor.minor, inventory.mig.config.minor)
    assert_the_hook_takes_its_work(spec, tmp_path)


def test_the_work_does_not_depend_on_nvml(mig: tuple[SimNode, EngineConfig, Inventory]) -> None:
    """NVML only names MIG devices; the hook tells them by placement, which procfs
    gives, so a spec's hook never needs NVML (nor the time to ask it)."""
    sim, config, inventory = mig
    assert inventory.mig.nvml is None
    without = hook_work(inventory, config, DEFAULT_CAPABILITIES)
    assert without == hook_work(with_nvml(inventory, snapshot(sim)), config, DEFAULT_CAPABILITIES)
    assert len(without["gpu_instances"]) == 2


def test_without_nvml_no_mig_devices_and_a_warning(mig: tuple[SimNode, EngineConfig, Inventory]) -> None:
    sim, config, inventory = mig
    assert inventory.mig.nvml is None
    names = by_name(cdi_spec(inventory, config, DEFAULT_CAPABILITIES, HOOK))
    assert list(names) == [n for g in sim.gpus for n in (str(g.index), g.uuid)] + ["all"]
    assert names["all"] == [gpu_node(m) for m in sorted(g.minor for g in sim.gpus if g.index != 2)]
    (warning,) = spec_warnings(inventory)
    assert "the spec has no MIG devices" in warning and "9: Driver Not Loaded" in warning
    assert f"gpu{sim.gpus[2].minor}/mig/gi2/ci0" in warning and "`all` leaves out the GPUs in MIG mode" in warning


def test_instances_nvml_did_not_name_are_left_out_and_said(mig: tuple[SimNode, EngineConfig, Inventory]) -> None:
    sim, config, inventory = mig
    partial = with_nvml(inventory, snapshot(sim, {0: (UUIDS[0], 2, 0)}))
    assert [m.index for m in named_mig_devices(partial)] == ["2:0"]
    assert [n for n in by_name(cdi_spec(partial, config, DEFAULT_CAPABILITIES, HOOK)) if ":" in n] == ["2:0"]
    (warning,) = spec_warnings(partial)
    m = sim.gpus[2].minor
    assert warning.endswith(f"did not name them (made since it was asked?): gpu{m}/mig/gi2/ci1, gpu{m}/mig/gi3/ci0")


def test_a_name_cdi_cannot_carry_is_left_out_and_said(mig: tuple[SimNode, EngineConfig, Inventory]) -> None:
    sim, config, inventory = mig
    legacy = f"MIG-{sim.gpus[2].uuid}/2/0"  # what R450 drivers print: a "/" is no CDI name
    odd = with_nvml(inventory, snapshot(sim, {0: (legacy, 2, 0), 1: (UUIDS[1], 2, 1), 3: (UUIDS[3], 3, 0)}))
    names = by_name(cdi_spec(odd, config, DEFAULT_CAPABILITIES, HOOK))
    assert legacy not in names and "2:0" not in names and "2:1" in names
    assert any("not a CDI device name" in w and legacy in w for w in spec_warnings(odd))


def test_nvml_devices_procfs_does_not_show_are_not_named(mig: tuple[SimNode, EngineConfig, Inventory]) -> None:
    sim, _, inventory = mig
    ghost = with_nvml(inventory, snapshot(sim, {0: (UUIDS[0], 2, 0), 5: (UUIDS[3], 9, 0), 6: (UUIDS[1], 2, 7)}))
    assert [m.index for m in named_mig_devices(ghost)] == ["2:0"]
    wrong_minor = NvmlSnapshot(tuple(dataclasses.replace(g, minor=g.minor + 1) for g in snapshot(sim).gpus))
    assert named_mig_devices(with_nvml(inventory, wrong_minor)) == ()


def test_a_node_without_mig_has_no_warning(tmp_path: Path) -> None:
    sim = build_node(tmp_path, gpus=2, mig={}, driver_files=FIXTURE_DRIVER)
    config = EngineConfig(driver_root=str(sim.driver_root), dev_root=str(sim.dev_root), proc_root=str(sim.proc_root))
    inventory = discover(config, cuda_version=lambda path: ("12.4", None), nvml=_no_nvml)
    assert spec_warnings(inventory) == ()
    assert list(by_name(cdi_spec(inventory, config, DEFAULT_CAPABILITIES, HOOK))) == [
        n for g in sim.gpus for n in (str(g.index), g.uuid)
    ] + ["all"]
