"""Discovery of the fabric and I/O devices: character devices only, bounded, no link followed;
the IMEX major and channel count; GDS's files; the fingerprint notices a module loaded later."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.discover import FABRIC_LIMIT, discover, fingerprint
from nri_gpu.engine.model import DeviceKind, Inventory
from testbed.gpunode import FABRIC_NODES, FIXTURE_DRIVER, FS_MAJOR, IMEX_MAJOR, SimNode, build_node


def config_for(node: SimNode) -> EngineConfig:
    return EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root))


def take(node: SimNode) -> Inventory:
    return discover(config_for(node), cuda_version=lambda path: ("12.4", None))


def needs_root(node: SimNode) -> None:
    if not node.real_device_nodes:
        pytest.skip("needs real character devices (root)")


def test_the_simulated_fabric_is_found_with_its_numbers(tmp_path: Path) -> None:
    node = build_node(tmp_path / "n", gpus=1, fabric=True, driver_files=FIXTURE_DRIVER)
    needs_root(node)
    fabric = take(node).fabric
    assert fabric.imex_major == IMEX_MAJOR and fabric.imex_channel_count == 2048
    expected = {(f"/dev/{rel}", major, minor, mode, kind) for rel, major, minor, mode, kind in FABRIC_NODES}
    assert {(n.path, n.major, n.minor, n.mode, n.kind.value) for n in fabric.nodes} == expected
    assert fabric.gds_files == (("/etc/cufile.json", "/etc/cufile.json"), ("/run/udev/data", "/run/udev/data"))


def test_the_default_node_has_no_fabric_nodes_and_no_gds_files(tmp_path: Path) -> None:
    node = build_node(tmp_path / "n", gpus=1, driver_files=FIXTURE_DRIVER)
    (node.driver_root / "etc/cufile.json").write_text("{}")  # no nvidia-fs: not looked for
    fabric = take(node).fabric
    assert fabric.nodes == () and fabric.gds_files == ()
    assert fabric.imex_major == IMEX_MAJOR  # every 550 driver registers the IMEX major


def test_links_and_regular_files_are_skipped_with_a_warning(tmp_path: Path) -> None:
    node = build_node(tmp_path / "n", gpus=1, fabric=True, driver_files=FIXTURE_DRIVER)
    needs_root(node)
    dev = node.dev_root / "dev"
    (dev / "nvidia-fs20").symlink_to("nvidia0")  # a link to a GPU node: never followed
    (dev / "gdrdrv").unlink()
    (dev / "gdrdrv").write_text("")  # a regular file where a node should be
    (dev / "infiniband/uverbs7").symlink_to("/dev/sda")  # leads out of the dev root
    inventory = take(node)
    paths = {n.path for n in inventory.fabric.nodes}
    assert "/dev/nvidia-fs20" not in paths and "/dev/gdrdrv" not in paths and "/dev/infiniband/uverbs7" not in paths
    assert all(n.major != 195 for n in inventory.fabric.nodes)
    for name in ("nvidia-fs20", "gdrdrv", "infiniband/uverbs7"):
        assert f"{dev / name}: not a character device; skipped" in inventory.warnings


def test_a_gds_file_that_is_a_link_resolves_inside_the_driver_root(tmp_path: Path) -> None:
    node = build_node(tmp_path / "n", gpus=1, fabric=True, driver_files=FIXTURE_DRIVER)
    needs_root(node)
    cufile = node.driver_root / "etc/cufile.json"
    (node.driver_root / "etc/gds").mkdir()
    cufile.rename(node.driver_root / "etc/gds/cufile.json")
    cufile.symlink_to("/etc/gds/cufile.json")  # absolute: inside the root, never the machine's /etc
    assert take(node).fabric.gds_files[0] == ("/etc/cufile.json", "/etc/gds/cufile.json")
    cufile.unlink()
    cufile.symlink_to("/../../../../etc/hostname")  # can only reach the root's own /etc/hostname
    assert [p for p, _ in take(node).fabric.gds_files] == ["/run/udev/data"]


def test_nodes_of_a_kind_are_bounded(tmp_path: Path) -> None:
    node = build_node(tmp_path / "n", gpus=1, fabric=True, driver_files=FIXTURE_DRIVER)
    needs_root(node)
    dev = node.dev_root / "dev"
    for n in range(16, FABRIC_LIMIT + 40):
        os.mknod(dev / f"nvidia-fs{n}", stat.S_IFCHR | 0o666, os.makedev(FS_MAJOR, n))
    inventory = take(node)
    fs = [n for n in inventory.fabric.nodes if n.kind is DeviceKind.NVIDIA_FS]
    assert len(fs) == FABRIC_LIMIT and fs[0].path == "/dev/nvidia-fs0" and fs[10].path == "/dev/nvidia-fs10"
    assert any(f"more than {FABRIC_LIMIT} nvidia-fs nodes" in w for w in inventory.warnings)


@pytest.mark.parametrize("value", ["-1", "lots", "99999999999", "1048577"])
def test_a_bad_channel_count_is_unknown_with_a_warning(tmp_path: Path, value: str) -> None:
    node = build_node(tmp_path / "n", gpus=1, driver_files=FIXTURE_DRIVER)
    params = node.proc_root / "driver/nvidia/params"
    params.chmod(0o644)
    params.write_text(params.read_text().replace("ImexChannelCount: 2048", f"ImexChannelCount: {value}"))
    inventory = take(node)
    assert inventory.fabric.imex_channel_count is None
    assert f"IMEX channel count unknown: ImexChannelCount is {value!r}" in inventory.warnings


def test_a_driver_without_the_count_has_the_default(tmp_path: Path) -> None:
    node = build_node(tmp_path / "n", gpus=1, driver_files=FIXTURE_DRIVER)
    params = node.proc_root / "driver/nvidia/params"
    params.chmod(0o644)
    params.write_text(params.read_text().replace("ImexChannelCount: 2048\n", ""))
    assert take(node).fabric.imex_channel_count == 2048


def test_the_fingerprint_changes_when_a_fabric_module_loads(tmp_path: Path) -> None:
    node = build_node(tmp_path / "n", gpus=1, drm=False, driver_files=FIXTURE_DRIVER)
    config = config_for(node)
    before = fingerprint(config)
    (node.dev_root / "dev/gdrdrv").write_text("")
    after = fingerprint(config)
    assert after != before and after[3] == ("/dev/gdrdrv",)


def test_the_fingerprint_changes_when_nvidia_drm_loads(tmp_path: Path) -> None:
    node = build_node(tmp_path / "n", gpus=1, drm=False, driver_files=FIXTURE_DRIVER)
    config = config_for(node)
    before = fingerprint(config)
    links = node.dev_root / "dev/dri/by-path"
    links.mkdir(parents=True)
    (links / f"pci-{node.gpus[0].bus_id}-card").symlink_to("../card1")
    after = fingerprint(config)
    assert after != before and after[3] == (f"/dev/dri/by-path/pci-{node.gpus[0].bus_id}-card",)
