"""Planning for MIG devices: the three id forms, ``all``, whole GPUs in MIG mode, monitor and config.

The node is simulated (procfs exactly as the 550 driver writes it); NVML's view is
given by hand here (its probe is tested in test_nvml), with a gap in ``j`` so that
``i:j`` cannot be taken for a position.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from nri_gpu.engine.config import EngineConfig, Policy
from nri_gpu.engine.discover import discover
from nri_gpu.engine.errors import RequestError, UnknownDeviceError
from nri_gpu.engine.model import DeviceKind, Gpu, Inventory, NvmlGpu, NvmlMigDevice, NvmlSnapshot, Plan
from nri_gpu.engine.plan import plan
from nri_gpu.engine.request import ContainerInfo, parse_request
from nri_gpu.engine.selection import UnknownMigDeviceError
from testbed.gpunode import CAPS_MAJOR, FIXTURE_DRIVER, SimNode, build_node, cap_minor

# GPU index -> (gi, (ci, ...)): GPU 1 in MIG mode with no instances; GPU 2 with a
# 3g GPU instance holding three compute instances and a 2g one with one.
MIG = {1: [], 2: [(2, [0, 1, 2]), (3, [0])]}


def _mig_uuid(n: int) -> str:
    return f"MIG-{n:08x}-aaaa-bbbb-cccc-{n:012x}"


class Node:
    def __init__(self, root: Path, policy: Policy | None = None) -> None:
        self.sim: SimNode = build_node(root, gpus=4, mig=MIG, driver_files=FIXTURE_DRIVER)
        self.config = EngineConfig(
            driver_root=str(self.sim.driver_root),
            dev_root=str(self.sim.dev_root),
            proc_root=str(self.sim.proc_root),
            policy=policy or Policy(),
        )
        self.bare: Inventory = discover(self.config, cuda_version=lambda path: ("12.4", None))
        self.bare = dataclasses.replace(self.bare, mig=dataclasses.replace(self.bare.mig, nvml=None, nvml_error="test"))
        gpus = self.bare.gpus
        # NVML: MIG devices of GPU 2 at j = 0, 2, 3 (j = 1 a gap), as go-nvlib keeps raw indexes.
        devices = ((0, 2, 0), (2, 2, 1), (3, 2, 2), (4, 3, 0))
        snapshot = NvmlSnapshot(
            tuple(
                NvmlGpu(
                    g.index,
                    g.uuid,
                    g.minor,
                    g.index in MIG,
                    g.index in MIG,
                    tuple(NvmlMigDevice(j, _mig_uuid(100 + j), gi, ci) for j, gi, ci in devices)
                    if g.index == 2
                    else (),
                )
                for g in gpus
            )
        )
        self.inventory = dataclasses.replace(
            self.bare, mig=dataclasses.replace(self.bare.mig, nvml=snapshot, nvml_error=None)
        )

    def gpu(self, index: int) -> Gpu:
        return self.inventory.gpus[index]

    def plan(self, devices: str, *, nvml: bool = True, env: dict[str, str] | None = None, **kw: Any) -> Plan:
        info = ContainerInfo(name="main", env={"NVIDIA_VISIBLE_DEVICES": devices, **(env or {})}, **kw)
        outcome = parse_request(info, self.config.policy)
        assert outcome.request is not None, outcome
        return plan(outcome.request, self.inventory if nvml else self.bare, self.config)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Node:
    return Node(tmp_path_factory.mktemp("mig"))


def _caps(p: Plan) -> list[tuple[str, int, int, int]]:
    return [(d.path, d.major, d.minor, d.mode) for d in p.devices if d.kind is DeviceKind.MIG_CAP]


def test_a_mig_device_by_placement_needs_no_nvml(node: Node) -> None:
    parent = node.gpu(2)
    m = parent.minor
    p = node.plan(f"MIG-{parent.uuid}/2/1", nvml=False)
    assert p.gpus == ()  # no whole GPU
    assert [(x.parent, x.gpu_instance.gi, x.compute_instance.ci) for x in p.mig_devices] == [(parent, 2, 1)]
    gpu_nodes = [d.path for d in p.devices if d.kind is DeviceKind.GPU]
    assert gpu_nodes == [f"/dev/nvidia{m}"]  # the parent's node, and only its
    assert _caps(p) == [
        (f"/dev/nvidia-caps/nvidia-cap{cap_minor(m, 2)}", CAPS_MAJOR, cap_minor(m, 2), 0o444),
        (f"/dev/nvidia-caps/nvidia-cap{cap_minor(m, 2, 1)}", CAPS_MAJOR, cap_minor(m, 2, 1), 0o444),
    ]
    assert p.proc_caps == (f"gpu{m}/mig/gi2/access", f"gpu{m}/mig/gi2/ci1/access")
    assert not p.proc_caps_all
    assert p.visible_bus_ids == (parent.bus_id,)
    # Named as asked: NVML's UUID is unknown, and the parent's UUID never appears.
    assert dict(p.env)["NVIDIA_VISIBLE_DEVICES"] == f"MIG-{parent.uuid}/2/1"


def test_a_mig_uuid_gets_nvml_s_name_never_the_parent_s(node: Node) -> None:
    p = node.plan(_mig_uuid(102).upper())
    (dev,) = p.mig_devices
    assert (dev.gpu_instance.gi, dev.compute_instance.ci, dev.index) == (2, 1, "2:2")
    assert dict(p.env)["NVIDIA_VISIBLE_DEVICES"] == _mig_uuid(102)
    assert node.gpu(2).uuid not in dict(p.env)["NVIDIA_VISIBLE_DEVICES"]
    assert p.device_names == (_mig_uuid(102),)


def test_i_j_is_nvml_s_index_not_a_position(node: Node) -> None:
    assert [(d.gpu_instance.gi, d.compute_instance.ci) for d in node.plan("2:3").mig_devices] == [(2, 2)]
    with pytest.raises(UnknownMigDeviceError) as exc:
        node.plan("2:1")  # the gap
    message = str(exc.value)
    assert "no MIG device 2:1" in message and f"2:0 ({_mig_uuid(100)})" in message, message


def test_mig_ids_needing_nvml_are_refused_with_its_reason_and_the_placement_form(node: Node) -> None:
    for device in (_mig_uuid(100), "2:0"):
        with pytest.raises(RequestError) as exc:
            node.plan(device, nvml=False)
        message = str(exc.value)
        assert not isinstance(exc.value, UnknownDeviceError), message
        assert "only be found through NVML" in message and "(test)" in message, message
        assert f"MIG-{node.gpu(2).uuid}/2/0" in message, message


def test_unknown_mig_devices_name_what_the_node_has(node: Node) -> None:
    with pytest.raises(UnknownDeviceError) as exc:
        node.plan(f"MIG-{node.gpu(2).uuid}/2/5")
    message = str(exc.value)
    assert "no GPU instance 2 with compute instance 5" in message and _mig_uuid(104) in message, message
    with pytest.raises(UnknownDeviceError, match=r"GPU 1 has no GPU instance 0 .*it has no MIG instances"):
        node.plan(f"MIG-{node.gpu(1).uuid}/0/0")
    with pytest.raises(UnknownDeviceError, match="no GPU with UUID GPU-00000000"):
        node.plan("MIG-GPU-00000000-0000-0000-0000-000000000000/2/0")
    with pytest.raises(UnknownMigDeviceError, match="no MIG device MIG-00000000"):
        node.plan(_mig_uuid(0))


def test_all_is_whole_gpus_out_of_mig_mode_and_every_mig_device(node: Node) -> None:
    p = node.plan("all")
    # GPU 1 (MIG on, no instances: NVML says so) and GPU 2 are not whole GPUs.
    assert [g.index for g in p.gpus] == [0, 3]
    assert [(d.gpu_instance.gi, d.compute_instance.ci) for d in p.mig_devices] == [(2, 0), (2, 1), (2, 2), (3, 0)]
    names = dict(p.env)["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert names == [node.gpu(0).uuid, node.gpu(3).uuid, *(_mig_uuid(100 + j) for j in (0, 2, 3, 4))]
    assert len(_caps(p)) == 2 + 4  # two GPU instances, four compute instances
    # Without NVML, GPU 1 looks like MIG off (procfs cannot tell) and is handed out whole.
    assert [g.index for g in node.plan("all", nvml=False).gpus] == [0, 1, 3]


def test_a_whole_gpu_in_mig_mode_gets_a_note_or_a_refusal(node: Node, tmp_path: Path) -> None:
    p = node.plan("2")
    assert [g.index for g in p.gpus] == [2] and not _caps(p)
    (note,) = [n for n in p.notes if "MIG mode" in n]
    assert "sees no CUDA device" in note and _mig_uuid(100) in note, note
    strict = Node(tmp_path, Policy(refuse_mig_mode_gpus=True))
    with pytest.raises(RequestError, match=r"GPU 2 .* is in MIG mode.*refuse_mig_mode_gpus"):
        strict.plan("0,2")
    assert strict.plan("0").gpus == (strict.gpu(0),)


def test_whole_gpus_and_mig_devices_mix(node: Node) -> None:
    p = node.plan(f"0,MIG-{node.gpu(2).uuid}/3/0,{_mig_uuid(100)}")
    assert [g.index for g in p.gpus] == [0]
    assert [d.index for d in p.mig_devices] == ["2:4", "2:0"]
    assert sorted(p.visible_bus_ids) == sorted((node.gpu(0).bus_id, node.gpu(2).bus_id))
    assert [d.path for d in p.devices if d.kind is DeviceKind.GPU] == [
        f"/dev/nvidia{node.gpu(0).minor}",
        f"/dev/nvidia{node.gpu(2).minor}",
    ]
    assert len(p.proc_caps) == 4


def test_monitor_adds_its_capability_and_file(node: Node) -> None:
    p = node.plan("all", env={"NVIDIA_MIG_MONITOR_DEVICES": "all"}, pod_namespace="kube-system")
    assert ("/dev/nvidia-caps/nvidia-cap2", CAPS_MAJOR, 2, 0o444) in _caps(p)
    assert "mig/monitor" in p.proc_caps and "mig/config" not in p.proc_caps and not p.proc_caps_all


def test_config_gets_every_instance_of_its_gpus_and_the_whole_folder(tmp_path: Path) -> None:
    node = Node(tmp_path, Policy(mig_config_namespaces=("mig",)))
    p = node.plan("2", env={"NVIDIA_MIG_CONFIG_DEVICES": "all"}, pod_namespace="mig")
    m = node.gpu(2).minor
    minors = sorted(d[2] for d in _caps(p))
    every = [cap_minor(m, 2), *(cap_minor(m, 2, c) for c in (0, 1, 2)), cap_minor(m, 3), cap_minor(m, 3, 0)]
    assert minors == sorted([1, *every])
    assert ("/dev/nvidia-caps/nvidia-cap1", CAPS_MAJOR, 1, 0o400) in _caps(p)  # DeviceFileMode 256
    assert p.proc_caps_all and "mig/config" in p.proc_caps


def test_mig_needs_the_nvidia_caps_major(node: Node) -> None:
    layout = dataclasses.replace(node.inventory.mig, caps_major=None)
    info = ContainerInfo(name="main", env={"NVIDIA_VISIBLE_DEVICES": _mig_uuid(100)})
    outcome = parse_request(info, node.config.policy)
    assert outcome.request is not None
    with pytest.raises(RequestError, match="nvidia-caps device major"):
        plan(outcome.request, dataclasses.replace(node.inventory, mig=layout), node.config)
    # A plain GPU on the same node does not need it.
    whole = parse_request(ContainerInfo(name="main", env={"NVIDIA_VISIBLE_DEVICES": "0"}), node.config.policy)
    assert whole.request is not None
    plan(whole.request, dataclasses.replace(node.inventory, mig=layout), node.config)


def _spec_nodes(node: Node, *placements: tuple[int, int]) -> tuple[tuple[int, int], ...]:
    """(major, minor) of what the device plugin's device specs put into a container for
    GPU 2's MIG devices at these (gi, ci): the parent node and both cap nodes."""
    m = node.gpu(2).minor
    nodes = {(195, m)}
    for gi, ci in placements:
        nodes |= {(CAPS_MAJOR, cap_minor(m, gi)), (CAPS_MAJOR, cap_minor(m, gi, ci))}
    return tuple(sorted(nodes))


def _plan_with_devices(node: Node, devices: str, nodes: tuple[tuple[int, int], ...]) -> Plan:
    info = ContainerInfo(name="main", env={"NVIDIA_VISIBLE_DEVICES": devices}, devices=nodes)
    outcome = parse_request(info, node.config.policy)
    assert outcome.request is not None
    return plan(outcome.request, node.bare, node.config)


def test_without_nvml_a_mig_uuid_is_the_device_whose_nodes_the_device_plugin_passed(node: Node) -> None:
    """The GPU operator's device plugin passes each MIG device's nodes (passDeviceSpecs)
    in the same answer that names its UUID: without NVML (the plugin's pod has no GPU
    nodes of its own), those nodes say which instance the UUID is."""
    p = _plan_with_devices(node, _mig_uuid(102), _spec_nodes(node, (2, 1)))
    (dev,) = p.mig_devices
    assert (dev.gpu_instance.gi, dev.compute_instance.ci) == (2, 1)
    assert dict(p.env)["NVIDIA_VISIBLE_DEVICES"] == _mig_uuid(102)  # one name, one device: kept
    assert any("NVML is not available (test)" in n and "nodes the container already has" in n for n in p.notes)
    two = _plan_with_devices(node, f"{_mig_uuid(102)},2:4", _spec_nodes(node, (2, 1), (3, 0)))
    assert sorted((d.gpu_instance.gi, d.compute_instance.ci) for d in two.mig_devices) == [(2, 1), (3, 0)]
    # Two names, two devices: which is which is not known, so they are named by placement.
    assert dict(two.env)["NVIDIA_VISIBLE_DEVICES"] == ",".join(d.name for d in two.mig_devices)
    assert all(d.name.startswith(f"MIG-{node.gpu(2).uuid}/") for d in two.mig_devices)


@pytest.mark.parametrize(
    "nodes",
    [
        (),  # no device specs
        "two",  # more devices than names: which one is meant?
        "half",  # a compute instance's node without its GPU instance's
        "no parent",
    ],
)
def test_without_nvml_device_specs_that_do_not_match_the_names_are_refused(node: Node, nodes: Any) -> None:
    m = node.gpu(2).minor
    given = {
        (): (),
        "two": _spec_nodes(node, (2, 1), (3, 0)),
        "half": ((195, m), (CAPS_MAJOR, cap_minor(m, 2, 1))),
        "no parent": ((CAPS_MAJOR, cap_minor(m, 2)), (CAPS_MAJOR, cap_minor(m, 2, 1))),
    }[nodes]
    with pytest.raises(RequestError) as exc:
        _plan_with_devices(node, _mig_uuid(102), given)
    message = str(exc.value)
    assert "can only be found through NVML" in message and "(test)" in message, message
    assert not isinstance(exc.value, UnknownDeviceError)


def test_device_specs_never_widen_a_request_nvml_resolved(node: Node) -> None:
    # With NVML, the UUID decides; nodes the container happens to have add nothing.
    info = ContainerInfo(
        name="main", env={"NVIDIA_VISIBLE_DEVICES": _mig_uuid(102)}, devices=_spec_nodes(node, (2, 1), (3, 0))
    )
    outcome = parse_request(info, node.config.policy)
    assert outcome.request is not None
    p = plan(outcome.request, node.inventory, node.config)
    assert [(d.gpu_instance.gi, d.compute_instance.ci) for d in p.mig_devices] == [(2, 1)]
