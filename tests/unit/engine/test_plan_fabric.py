"""Planning fabric and I/O devices on a simulated node with them (``build_node(fabric=True)``),
and on the default node without them; golden plans in tests/golden/plan-fabric*.json
(tests/integration/test_golden.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.errors import RequestError
from nri_gpu.engine.model import DeviceKind, Feature
from nri_gpu.engine.report import plan_text, plan_to_dict
from testbed.gpunode import FS_MAJOR, IMEX_MAJOR, NVSWITCH_MAJOR, UVERBS_MAJOR
from tests.unit.engine.test_plan import Node

ALL_FEATURES = {f.env: "enabled" for f in Feature}


@pytest.fixture(scope="module")
def fab(tmp_path_factory: pytest.TempPathFactory) -> Node:
    return Node(tmp_path_factory.mktemp("fabric"), gpus=2, fabric=True)


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Node:
    return Node(tmp_path_factory.mktemp("bare"), gpus=2)


def fabric_devices(plan: Any) -> list[tuple[str, int, int]]:
    fabric_kinds = {DeviceKind.IMEX_CHANNEL, DeviceKind.NVIDIA_FS, DeviceKind.INFINIBAND, DeviceKind.GDRDRV}
    fabric_kinds.add(DeviceKind.NVSWITCH)
    return [(d.path, d.major, d.minor) for d in plan.devices if d.kind in fabric_kinds]


def test_imex_channels_need_no_host_node(fab: Node) -> None:
    assert not (fab.sim.dev_root / "dev/nvidia-caps-imex-channels").exists()
    got = fab.plan({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_IMEX_CHANNELS": "5,0"})
    assert fabric_devices(got) == [
        ("/dev/nvidia-caps-imex-channels/channel0", IMEX_MAJOR, 0),
        ("/dev/nvidia-caps-imex-channels/channel5", IMEX_MAJOR, 5),
    ]
    assert got.imex_channels == (5, 0)


def test_every_feature_gives_its_nodes_with_the_hosts_numbers(fab: Node) -> None:
    if not fab.sim.real_device_nodes:
        pytest.skip("needs real character devices (root)")
    got = fab.plan({"NVIDIA_VISIBLE_DEVICES": "1", **ALL_FEATURES})
    devices = fabric_devices(got)
    assert [d for d in devices if d[0].startswith("/dev/nvidia-fs")][:2] == [
        ("/dev/nvidia-fs0", FS_MAJOR, 0),
        ("/dev/nvidia-fs1", FS_MAJOR, 1),
    ]
    assert len([d for d in devices if d[0].startswith("/dev/nvidia-fs")]) == 16
    assert ("/dev/infiniband/uverbs1", UVERBS_MAJOR, 193) in devices
    assert ("/dev/infiniband/rdma_cm", 10, 58) in devices
    assert ("/dev/nvidia-nvswitchctl", NVSWITCH_MAJOR, 255) in devices
    assert any(d[0] == "/dev/gdrdrv" for d in devices)
    assert got.features == tuple(Feature)
    gds = {m.destination: m for m in got.mounts if m.destination in ("/etc/cufile.json", "/run/udev/data")}
    assert gds["/etc/cufile.json"].source == str(fab.sim.driver_root / "etc/cufile.json")
    assert gds["/run/udev/data"].source == str(fab.sim.driver_root / "run/udev/data")
    assert all(m.options[0] == "ro" and "nosuid" in m.options for m in gds.values())
    assert not any(m.destination == "/run/udev" for m in got.mounts)  # udevd's control socket stays out
    assert len({d.path for d in got.devices}) == len(got.devices)


def test_mofed_alone_gives_no_gds_files(fab: Node) -> None:
    got = fab.plan({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_MOFED": "enabled"})
    assert not any(m.destination in ("/etc/cufile.json", "/run/udev/data") for m in got.mounts)
    assert {p for p, _, _ in fabric_devices(got)} == {
        "/dev/infiniband/rdma_cm",
        "/dev/infiniband/uverbs0",
        "/dev/infiniband/uverbs1",
    }


@pytest.mark.parametrize("feature", list(Feature), ids=lambda f: f.env)
def test_an_enabled_feature_on_a_node_without_it_is_refused(bare: Node, feature: Feature) -> None:
    with pytest.raises(RequestError, match=rf"^env {feature.env}=enabled: this node has no /dev/"):
        bare.plan({"NVIDIA_VISIBLE_DEVICES": "0", feature.env: "enabled"})


def test_a_channel_past_the_count_is_refused_naming_it(fab: Node) -> None:
    with pytest.raises(RequestError) as exc:
        fab.plan({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_IMEX_CHANNELS": "0,2048"})
    assert str(exc.value) == (
        "env NVIDIA_IMEX_CHANNELS asks for IMEX channel 2048, but this node has channels 0-2047 "
        "(ImexChannelCount 2048 in /proc/driver/nvidia/params)"
    )


def test_a_smaller_channel_count_from_params_is_honoured(tmp_path: Path) -> None:
    node = Node(tmp_path / "node", gpus=1)
    params = node.sim.proc_root / "driver/nvidia/params"
    params.chmod(0o644)
    params.write_text(params.read_text().replace("ImexChannelCount: 2048", "ImexChannelCount: 4"))
    again = Node.__new__(Node)
    again.sim, again.config = node.sim, node.config
    from nri_gpu.engine.discover import discover

    again.inventory = discover(node.config, cuda_version=lambda path: ("12.4", None))
    assert again.inventory.fabric.imex_channel_count == 4
    assert again.plan({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_IMEX_CHANNELS": "3"}).imex_channels == (3,)
    with pytest.raises(RequestError, match="channel 4, but this node has channels 0-3"):
        again.plan({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_IMEX_CHANNELS": "4"})


def test_none_gets_no_fabric_devices_and_a_note(fab: Node) -> None:
    got = fab.plan({"NVIDIA_VISIBLE_DEVICES": "none", "NVIDIA_GDS": "enabled", "NVIDIA_IMEX_CHANNELS": "1"})
    assert fabric_devices(got) == [] and got.features == () and got.imex_channels == ()
    assert any("ignored: they come only with GPUs" in n for n in got.notes)
    assert not any(m.destination == "/etc/cufile.json" for m in got.mounts)


def test_mig_devices_count_as_gpus(tmp_path: Path) -> None:
    node = Node(tmp_path / "node", gpus=2, mig={1: [(2, [0])]}, fabric=True)
    mig = f"MIG-{node.inventory.gpus[1].uuid}/2/0"
    got = node.plan({"NVIDIA_VISIBLE_DEVICES": mig, "NVIDIA_IMEX_CHANNELS": "7"})
    assert got.mig_devices and got.imex_channels == (7,)


def test_gds_sources_are_translated_like_every_mount(tmp_path: Path) -> None:
    node = Node(tmp_path / "host" / "node", gpus=1, fabric=True, driver_subdir="run/nvidia/driver")
    config = EngineConfig(
        driver_root=str(node.sim.driver_root),
        dev_root=str(node.sim.dev_root),
        proc_root=str(node.sim.proc_root),
        host_root=str(tmp_path / "host"),
    )
    node.config = config
    got = node.plan({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_GDS": "enabled"})
    sources = {m.destination: m.source for m in got.mounts}
    assert sources["/etc/cufile.json"] == "/node/run/nvidia/driver/etc/cufile.json"


def test_report_shows_them_only_when_present(fab: Node) -> None:
    plain = plan_to_dict(fab.plan({"NVIDIA_VISIBLE_DEVICES": "0"}))
    assert "imex_channels" not in plain and "features" not in plain
    got = fab.plan({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_IMEX_CHANNELS": "1", "NVIDIA_GDRCOPY": "enabled"})
    data = plan_to_dict(got)
    assert data["imex_channels"] == [1] and data["features"] == ["gdrcopy"]
    text = plan_text(got)
    assert "IMEX channels: 1\n" in text and "Features: NVIDIA_GDRCOPY=enabled\n" in text
    assert "/dev/nvidia-caps-imex-channels/channel1  c 235:1  0666" in text
