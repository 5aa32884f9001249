"""Discovery asks NVML (engine.nvml) for MIG UUIDs and i:j only on a node whose procfs
shows MIG instances, and `nri-gpu info`/`plan` reports show what it said."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.discover import InventoryCache, discover
from nri_gpu.engine.model import Inventory, MigDevice, NvmlGpu, NvmlMigDevice, NvmlSnapshot, Plan
from nri_gpu.engine.report import inventory_text, inventory_to_dict, plan_text, plan_to_dict
from testbed.gpunode import (
    FIXTURE_DRIVER,
    LIB64,
    MigSpec,
    SimNode,
    build_node,
    reconfigure_mig,
    set_nvml_behaviour,
)

SPEC: MigSpec = {0: [(2, [0, 1, 2]), (3, [0]), (9, [0])], 1: []}


def config_for(node: SimNode) -> EngineConfig:
    return EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root))


def no_cuda(path: str) -> tuple[str | None, str | None]:
    return "12.4", None  # the CUDA probe is test_discover's


def never(path: str) -> tuple[NvmlSnapshot | None, str | None]:
    raise AssertionError(f"NVML was probed ({path}) on a node without MIG instances")


@pytest.fixture
def sim(tmp_path: Path) -> SimNode:
    return build_node(tmp_path, gpus=4, model="NVIDIA A100-SXM4-40GB", mig=SPEC, driver_files=FIXTURE_DRIVER)


def expected_snapshot(node: SimNode) -> NvmlSnapshot:
    devices = node.mig_devices()
    mig_on = set(node.mig or {})
    return NvmlSnapshot(
        tuple(
            NvmlGpu(
                g.index,
                g.uuid,
                g.minor,
                g.index in mig_on,
                g.index in mig_on,
                tuple(NvmlMigDevice(d.index, d.uuid, d.gi, d.ci) for d in devices.get(g.index, ())),
            )
            for g in node.gpus
        )
    )


def test_discovery_of_a_mig_node_fills_in_nvmls_view(sim: SimNode) -> None:
    inv = discover(config_for(sim), cuda_version=no_cuda)
    assert inv.mig.nvml == expected_snapshot(sim)
    assert inv.mig.nvml_error is None
    assert [d.index for d in inv.mig.nvml.gpus[0].mig_devices] == [0, 2, 3, 4, 5]  # the sim's gap at j=1
    assert inv.warnings == ()


def test_the_reader_gets_the_host_path_of_the_64_bit_libnvidia_ml(sim: SimNode) -> None:
    paths: list[str] = []

    def reader(path: str) -> tuple[NvmlSnapshot | None, str | None]:
        paths.append(path)
        return NvmlSnapshot(), None

    discover(config_for(sim), cuda_version=no_cuda, nvml=reader)
    assert paths == [str(sim.driver_root / LIB64 / "libnvidia-ml.so.550.163.01")]


@pytest.mark.parametrize(
    "mig", [None, {}, {0: [], 1: []}], ids=["no-mig-folders", "mig-folders", "mig-on-no-instances"]
)
def test_a_node_without_mig_instances_never_runs_the_probe(tmp_path: Path, mig: MigSpec | None) -> None:
    node = build_node(tmp_path, gpus=2, mig=mig, driver_files=FIXTURE_DRIVER)
    inv = discover(config_for(node), cuda_version=no_cuda, nvml=never)
    assert inv.mig.nvml is None and inv.mig.nvml_error is None and inv.mig.gpu_instances == ()


def test_without_libnvidia_ml_the_error_says_so(sim: SimNode) -> None:
    cache = sim.driver_root / "etc/ld.so.cache"
    data = cache.read_bytes()
    cache.write_bytes(data.replace(b"libnvidia-ml.so.1\0", b"libnvidia-mX.so.1\0"))
    inv = discover(config_for(sim), cuda_version=no_cuda, nvml=never)
    assert inv.mig.nvml_error == "NVML unavailable: no 64-bit libnvidia-ml.so.1 among the driver libraries"


def test_what_procfs_contradicts_is_dropped_with_inventory_warnings(sim: SimNode) -> None:
    truth = expected_snapshot(sim)
    wrong_minor = dataclasses.replace(truth.gpus[1], minor=7)
    extra = NvmlMigDevice(6, "MIG-66666666-6666-6666-6666-666666666666", 4, 0)
    gpu0 = dataclasses.replace(truth.gpus[0], mig_devices=(*truth.gpus[0].mig_devices, extra))
    lying = NvmlSnapshot((gpu0, wrong_minor, *truth.gpus[2:]))
    inv = discover(config_for(sim), cuda_version=no_cuda, nvml=lambda path: (lying, None))
    assert inv.mig.nvml == NvmlSnapshot((truth.gpus[0], *truth.gpus[2:]))
    assert len(inv.warnings) == 2
    assert "NVML MIG device 0:6 (MIG-66666666-6666-6666-6666-666666666666) is gi 4 ci 0" in inv.warnings[0]
    assert f"NVML GPU 1 ({truth.gpus[1].uuid}, minor 7) has minor 3 in procfs" in inv.warnings[1]


def test_a_reconfiguration_takes_a_new_snapshot_with_the_inventory(sim: SimNode) -> None:
    config = config_for(sim)
    cache = InventoryCache(config, interval=1e9, take=lambda c: discover(c, cuda_version=no_cuda))
    before = cache.current.mig.nvml
    assert before is not None and [len(g.mig_devices) for g in before.gpus] == [5, 0, 0, 0]
    assert cache.refresh() is False and cache.current.mig.nvml is before  # nothing changed: no new probe
    node = reconfigure_mig(sim, {0: [(2, [0])], 1: [(1, [0, 1])]})
    assert cache.refresh() is True
    after = cache.current.mig.nvml
    assert after is not None and after == expected_snapshot(node)
    assert [[(d.index, d.gi, d.ci) for d in g.mig_devices] for g in after.gpus[:2]] == [
        [(0, 2, 0)],
        [(0, 1, 0), (1, 1, 1)],
    ]
    assert cache.current.warnings == ()


# -- reports ------------------------------------------------------------------------------


def test_info_text_shows_mig_uuids_indexes_and_modes(sim: SimNode) -> None:
    inv = discover(config_for(sim), cuda_version=no_cuda)
    text = inventory_text(inv)
    devices = sim.mig_devices()[0]
    assert (
        "  GPU 0 (minor 2): enabled (NVML)\n  GPU 1 (minor 3): enabled (NVML)\n  GPU 2 (minor 0): disabled (NVML)\n"
        in text
    )
    assert "MIG instances of GPU minor 2: gi2(ci0,ci1,ci2) gi3(ci0) gi9(ci0)\n" in text
    assert f"  gpu2/mig/gi2/ci1       0:2    {devices[1].uuid}  caps 291,293\n" in text
    assert f"  gpu2/mig/gi9/ci0       0:5    {devices[4].uuid}  caps 354,355\n" in text
    assert "NVML:" not in text


def _without_nvml(tmp_path: Path) -> SimNode:
    """A MIG node whose NVML fails as NVIDIA's 550 library does without its kernel
    module (that library itself: tests/integration/test_nvml_real.py)."""
    node = build_node(tmp_path, gpus=2, mig={0: [(2, [0])]}, driver_files=FIXTURE_DRIVER)
    set_nvml_behaviour(node, init_rc=9)
    return node


def test_info_text_without_nvml_shows_the_error_and_the_procfs_hint(tmp_path: Path) -> None:
    node = _without_nvml(tmp_path)
    text = inventory_text(discover(config_for(node), cuda_version=no_cuda))
    assert "  GPU 0 (minor 1): instances present (procfs)\n" in text
    assert "  GPU 1 (minor 0): unknown (no NVML); no instances in procfs\n" in text
    assert "  gpu1/mig/gi2/ci0       -      (no MIG UUID)  caps 156,157\n" in text
    assert "NVML: NVML unavailable: nvmlInit_v2 returned 9 (Driver Not Loaded)" in text


def test_info_text_of_a_pending_mode_change_and_an_unsupported_gpu(sim: SimNode) -> None:
    truth = expected_snapshot(sim)
    gpus = (
        truth.gpus[0],
        dataclasses.replace(truth.gpus[1], mig_pending=False),
        dataclasses.replace(truth.gpus[2], mig_current=None, mig_pending=None),
        truth.gpus[3],
    )
    inv = discover(config_for(sim), cuda_version=no_cuda, nvml=lambda path: (NvmlSnapshot(gpus), None))
    text = inventory_text(inv)
    assert "  GPU 1 (minor 3): enabled (NVML), disabled after the next GPU reset\n" in text
    assert "  GPU 2 (minor 0): not supported (NVML)\n" in text


def test_info_json_adds_nvml_fields_under_mig_only(sim: SimNode) -> None:
    inv = discover(config_for(sim), cuda_version=no_cuda)
    data = json.loads(json.dumps(inventory_to_dict(inv)))
    mig = data["mig"]
    devices = sim.mig_devices()[0]
    gi2 = mig["gpu_instances"][0]
    assert [(c["ci"], c["uuid"], c["index"]) for c in gi2["compute_instances"]] == [
        (0, devices[0].uuid, "0:0"),
        (1, devices[1].uuid, "0:2"),
        (2, devices[2].uuid, "0:3"),
    ]
    assert mig["nvml_error"] is None
    gpu0 = mig["nvml"]["gpus"][0]
    assert (gpu0["index"], gpu0["minor"], gpu0["mig_mode"]) == (0, 2, {"current": True, "pending": True})
    assert gpu0["mig_devices"][1] == {"index": "0:2", "uuid": devices[1].uuid, "gi": 2, "ci": 1}
    assert set(data) - {"mig"} == set(inventory_to_dict(dataclasses.replace(inv, mig=type(inv.mig)())))


def test_info_json_without_nvml(tmp_path: Path) -> None:
    node = _without_nvml(tmp_path)
    mig = inventory_to_dict(discover(config_for(node), cuda_version=no_cuda))["mig"]
    assert mig["nvml"] is None and "Driver Not Loaded" in mig["nvml_error"]
    assert mig["gpu_instances"][0]["compute_instances"][0]["uuid"] is None


def _mig_plan(inv: Inventory, *, uuid: bool) -> Plan:
    parent = inv.gpus[0]
    gi = inv.mig.instances_of(parent.minor)[0]
    nvml = inv.mig.nvml
    assert nvml is not None
    dev = nvml.gpus[0].mig_devices[1]
    granted = MigDevice(parent, gi, gi.compute_instances[1], dev.uuid if uuid else None, "0:2" if uuid else None)
    return Plan(mig_devices=(granted,), proc_caps=("gpu2/mig/gi2/access", "gpu2/mig/gi2/ci1/access"))


def test_plan_reports_list_mig_devices_and_the_capabilities_view(sim: SimNode) -> None:
    inv = discover(config_for(sim), cuda_version=no_cuda)
    plan = _mig_plan(inv, uuid=True)
    data = plan_to_dict(plan)
    uuid = sim.mig_devices()[0][1].uuid
    assert data["mig_devices"] == [
        {
            "name": uuid,
            "parent_index": 0,
            "parent_minor": 2,
            "gi": 2,
            "ci": 1,
            "index": "0:2",
            "cap_minors": [291, 293],
        }
    ]
    assert data["start"]["proc_caps"] == ["gpu2/mig/gi2/access", "gpu2/mig/gi2/ci1/access"]
    assert "proc_caps_all" not in data["start"]
    text = plan_text(plan)
    assert f"MIG device: {uuid}  GPU 0 (minor 2) gi2 ci1  0:2  caps 291,293\n" in text
    assert "  keep /proc/driver/nvidia/capabilities/: gpu2/mig/gi2/access gpu2/mig/gi2/ci1/access\n" in text

    by_placement = _mig_plan(inv, uuid=False)
    assert plan_to_dict(by_placement)["mig_devices"][0]["name"] == f"MIG-{sim.gpus[0].uuid}/2/1"
    assert plan_to_dict(by_placement)["mig_devices"][0]["index"] is None
    everything = plan_to_dict(dataclasses.replace(plan, proc_caps=(), proc_caps_all=True))
    assert everything["start"]["proc_caps_all"] is True and "proc_caps" not in everything["start"]
    assert "capabilities/: all of it" in plan_text(dataclasses.replace(plan, proc_caps=(), proc_caps_all=True))


def test_a_plan_without_mig_has_no_mig_fields() -> None:
    data = plan_to_dict(Plan())
    assert "mig_devices" not in data and set(data["start"]) == {
        "visible_bus_ids",
        "symlinks",
        "ldconfig_folders",
        "ld_cache_entries",
    }
    assert "MIG" not in plan_text(Plan()) and "capabilities" not in plan_text(Plan())


# -- hack/simulate-gpu-node --nvml ----------------------------------------------------------
