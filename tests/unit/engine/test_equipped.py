"""Containers that already have GPUs: what they have, who gave it, and when a request of ours conflicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nri_gpu.engine.config import EngineConfig, Policy, from_tables
from nri_gpu.engine.discover import discover
from nri_gpu.engine.equipped import Source, cdi_names, completion, conflict, equipped, nvidia_nri_annotation
from nri_gpu.engine.errors import EngineError
from nri_gpu.engine.model import Capability, Inventory, Plan
from nri_gpu.engine.plan import plan
from nri_gpu.engine.report import plan_to_dict
from nri_gpu.engine.request import ContainerInfo, parse_request
from testbed.gpunode import CAPS_MAJOR, FIXTURE_DRIVER, SimNode, build_node, cap_minor
from tests.unit.engine import golden

LIBCUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.163.01"


class Node:
    def __init__(self, root: Path) -> None:
        self.sim: SimNode = build_node(root, gpus=4, mig={2: [(2, [0, 1])]}, driver_files=FIXTURE_DRIVER)
        self.config = EngineConfig(
            driver_root=str(self.sim.driver_root), dev_root=str(self.sim.dev_root), proc_root=str(self.sim.proc_root)
        )
        self.inventory: Inventory = discover(self.config, cuda_version=lambda path: ("12.4", None))

    def nodes(self, *indexes: int) -> set[tuple[int, int]]:
        return {(195, self.inventory.gpus[i].minor) for i in indexes}

    def plan(self, devices: str) -> Plan:
        outcome = parse_request(ContainerInfo(name="c", env={"NVIDIA_VISIBLE_DEVICES": devices}), Policy())
        assert outcome.request is not None
        return plan(outcome.request, self.inventory, self.config)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Node:
    return Node(tmp_path_factory.mktemp("equipped"))


def test_cdi_names_are_nvidias_from_nri_and_the_cdi_annotations() -> None:
    annotations = {
        "cdi.k8s.io/nvidia-device-plugin_abc": "k8s.device-plugin.nvidia.com/gpu=MIG-1, vendor.com/nic=0",
        "cdi.k8s.io/x": "nvidia.com/gpu=0",
        "other": "nvidia.com/gpu=1",
    }
    names = cdi_names(annotations, ["k8s.gpu.nvidia.com/claim=uid-gpu-0", "intel.com/gpu=0"])
    assert names == ("k8s.gpu.nvidia.com/claim=uid-gpu-0", "k8s.device-plugin.nvidia.com/gpu=MIG-1", "nvidia.com/gpu=0")
    huge = cdi_names({"cdi.k8s.io/x": ",".join(["nvidia.com/gpu=0"] * 100000)})
    assert len(huge) == 256


def test_what_a_container_has_and_who_gave_it(node: Node) -> None:
    g1, g3 = node.inventory.gpus[1], node.inventory.gpus[3]
    assert equipped(set(), set(), (), node.inventory) is None
    assert equipped({(1, 3), (10, 200)}, set(), (), node.inventory) is None  # not NVIDIA's
    by_cdi = equipped(node.nodes(1, 3), set(), ("nvidia.com/gpu=1",), node.inventory)
    assert by_cdi is not None and by_cdi.gpus == (g1, g3) and by_cdi.source is Source.CDI
    assert "CDI devices nvidia.com/gpu=1" in by_cdi.evidence
    by_files = equipped(node.nodes(1), {"/etc/hosts", LIBCUDA}, (), node.inventory)
    assert by_files is not None and by_files.source is Source.CDI and "libcuda.so.550.163.01" in by_files.evidence
    specs = equipped(node.nodes(1), {"/etc/hosts"}, (), node.inventory)
    assert specs is not None and specs.source is Source.DEVICE_SPECS
    # A privileged container holds every host device, /dev/mem among them: no allocation to read.
    assert equipped(node.nodes(0, 1, 2, 3) | {(1, 1)}, {LIBCUDA}, (), node.inventory) is None


def test_a_mig_parent_is_not_a_whole_gpu(node: Node) -> None:
    parent = node.inventory.gpus[2]
    m = parent.minor
    nodes = node.nodes(2) | {(CAPS_MAJOR, cap_minor(m, 2)), (CAPS_MAJOR, cap_minor(m, 2, 1))}
    have = equipped(nodes, set(), ("nvidia.com/gpu=2:1",), node.inventory)
    assert have is not None and have.gpus == ()
    assert [(d.gpu_instance.gi, d.compute_instance.ci) for d in have.mig_devices] == [(2, 1)]
    assert conflict(have, node.plan(f"MIG-{parent.uuid}/2/1"), "env") is None
    why = conflict(have, node.plan("2"), 'annotation "nvidia.com/gpus"')
    assert why is not None and "MIG 2/2/1" in why and "GPU 2" in why


def test_a_request_for_other_gpus_than_it_has_names_both(node: Node) -> None:
    have = equipped(node.nodes(1), {LIBCUDA}, (), node.inventory)
    assert have is not None
    assert conflict(have, node.plan("1"), "env NVIDIA_VISIBLE_DEVICES") is None
    for asked, shown in (("0", "GPU 0"), ("0,1", "GPU 0, GPU 1"), ("none", "no GPU")):
        why = conflict(have, node.plan(asked), "env NVIDIA_VISIBLE_DEVICES")
        assert why is not None, asked
        assert why.startswith("it already has GPU 1 (driver files already mounted (libcuda.so.550.163.01))"), why
        assert f"env NVIDIA_VISIBLE_DEVICES asks for {shown}:" in why, why


def test_completion_adds_only_the_view_and_the_cache_entries_of_mounted_libraries(node: Node) -> None:
    have = equipped(node.nodes(1), {LIBCUDA}, ("nvidia.com/gpu=1",), node.inventory)
    assert have is not None
    caps = frozenset({Capability.COMPUTE, Capability.UTILITY})
    done = completion(have, node.inventory, node.config, caps, {LIBCUDA})
    assert done.devices == () and done.mounts == () and done.env == ()
    assert {(s.path.rsplit("/", 1)[1], s.target) for s in done.symlinks} == {
        ("libcuda.so.1", "libcuda.so.550.163.01"),
        ("libcuda.so", "libcuda.so.1"),
    }
    assert done.visible_bus_ids == (node.inventory.gpus[1].bus_id,)
    assert {e.name for e in done.ld_cache_entries} == {"libcuda.so.1", "libcuda.so"}
    assert done.ldconfig_folders == ("/usr/lib/x86_64-linux-gnu",)
    assert done.gpus == (node.inventory.gpus[1],)
    assert any("only the procfs view, library links and ld.so.cache added" in n for n in done.notes)


def test_nvidia_nri_annotations_and_the_policy_switch() -> None:
    assert nvidia_nri_annotation({"nvidia.cdi.k8s.io/container.main": "nvidia.com/gpu=0", "x": "y"}) is not None
    assert nvidia_nri_annotation({"cdi.k8s.io/x": "nvidia.com/gpu=0"}) is None
    assert from_tables({}, {"equipped_containers": "complete"}).policy.equipped_containers == "complete"
    with pytest.raises(
        EngineError, match=r"policy\.equipped_containers: 'aside' is not one of 'stand-aside', 'complete'"
    ):
        from_tables({}, {"equipped_containers": "aside"})


GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "plan-equipped-complete.json"


def test_golden_completion_plan(node: Node) -> None:
    """What ``"complete"`` gives a CDI-equipped container holding GPU 1 and a MIG device,
    mounting libcuda and libnvidia-ml: the view and those libraries' links and entries only."""
    parent = node.inventory.gpus[2]
    m = parent.minor
    nodes = node.nodes(1, 2) | {(CAPS_MAJOR, cap_minor(m, 2)), (CAPS_MAJOR, cap_minor(m, 2, 1))}
    ml = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.163.01"
    have = equipped(nodes, {LIBCUDA, ml}, ("k8s.gpu.nvidia.com/claim=uid-0",), node.inventory)
    assert have is not None
    caps = frozenset({Capability.COMPUTE, Capability.UTILITY})
    done = completion(have, node.inventory, node.config, caps, {LIBCUDA, ml})
    result = json.loads(json.dumps(plan_to_dict(done), sort_keys=True).replace(str(node.sim.root), "<ROOT>"))
    golden.check(GOLDEN, result)
