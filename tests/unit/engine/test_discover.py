"""Discovery on simulated nodes built from the real Debian driver files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.discover import InventoryCache, discover, fingerprint
from engine.model import Capability, DeviceKind, FileKind, Inventory
from tests.testbed.gpunode import SimNode, build_node


def config_for(node: SimNode) -> EngineConfig:
    return EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root))


def no_cuda(path: str) -> tuple[str | None, str | None]:
    return "12.4", None


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> tuple[SimNode, Inventory]:
    node = build_node(tmp_path_factory.mktemp("four"), gpus=4)
    return node, discover(config_for(node))  # the real CUDA probe, once


def test_gpus_are_indexed_in_bus_order_and_keep_their_minors(four: tuple[SimNode, Inventory]) -> None:
    node, inv = four
    assert [g.bus_id for g in inv.gpus] == sorted(g.bus_id for g in node.gpus)
    assert [g.index for g in inv.gpus] == [0, 1, 2, 3]
    expected = {g.bus_id: (g.minor, g.uuid) for g in node.gpus}
    assert {g.bus_id: (g.minor, g.uuid) for g in inv.gpus} == expected
    assert [g.minor for g in inv.gpus] != [0, 1, 2, 3], "the simulated node must not have minors in bus order"


def test_driver_cuda_and_majors(four: tuple[SimNode, Inventory]) -> None:
    _, inv = four
    assert inv.driver_version == "550.163.01"
    assert inv.cuda_version == "12.4"  # cuDriverGetVersion of the real libcuda, in a child process
    assert inv.nvidia_major == 195
    kinds = {d.kind: (d.path, d.major, d.minor) for d in inv.control_devices}
    assert kinds[DeviceKind.CONTROL] == ("/dev/nvidiactl", 195, 255)
    assert kinds[DeviceKind.MODESET] == ("/dev/nvidia-modeset", 195, 254)
    assert kinds[DeviceKind.UVM][1:] == (kinds[DeviceKind.UVM_TOOLS][1], 0)


def test_libraries_from_the_ld_cache_sorted_into_capabilities(four: tuple[SimNode, Inventory]) -> None:
    _, inv = four
    by_soname = {(lib.soname, lib.is_64bit): lib for lib in inv.libraries}
    cuda = by_soname[("libcuda.so.1", True)]
    assert cuda.path == "/usr/lib/x86_64-linux-gnu/libcuda.so.550.163.01"
    assert Capability.COMPUTE in cuda.capabilities
    assert Capability.UTILITY in by_soname[("libnvidia-ml.so.1", True)].capabilities
    assert all(lib.path.endswith(".so.550.163.01") for lib in inv.libraries)


def test_binaries_and_firmware(four: tuple[SimNode, Inventory]) -> None:
    _, inv = four
    binaries = {f.path for f in inv.files if f.kind is FileKind.BINARY}
    assert "/usr/bin/nvidia-smi" in binaries
    assert any(f.kind is FileKind.FIRMWARE and "/550.163.01/gsp" in f.path for f in inv.files)


def test_node_without_a_driver_has_no_gpus_and_a_warning(tmp_path: Path) -> None:
    node = build_node(tmp_path, driver=False)
    inv = discover(config_for(node), cuda_version=no_cuda)
    assert not inv.has_driver and inv.gpus == () and inv.libraries == ()
    assert any("no NVIDIA driver" in w for w in inv.warnings)


def test_gpu_operator_layout_reads_the_driver_root(tmp_path: Path) -> None:
    node = build_node(tmp_path, gpus=2, driver_subdir="run/nvidia/driver")
    assert node.driver_root == tmp_path / "run/nvidia/driver"
    inv = discover(config_for(node), cuda_version=no_cuda)
    assert len(inv.gpus) == 2
    assert any(lib.soname == "libcuda.so.1" for lib in inv.libraries)


def test_excluded_gpu_is_not_offered(tmp_path: Path) -> None:
    node = build_node(tmp_path, gpus=4, excluded=[1])
    inv = discover(config_for(node), cuda_version=no_cuda)
    assert len(inv.gpus) == 3
    assert any("excluded" in w for w in inv.warnings)


def test_missing_optional_pieces_are_warnings(tmp_path: Path) -> None:
    node = build_node(tmp_path, gpus=2)
    (node.dev_root / "dev/nvidia-modeset").unlink()
    (node.driver_root / "etc/ld.so.cache").unlink()
    inv = discover(config_for(node), cuda_version=no_cuda)
    assert len(inv.gpus) == 2
    assert inv.libraries == ()
    assert any("nvidia-modeset" in w for w in inv.warnings)
    assert any("driver libraries unknown" in w for w in inv.warnings)


def test_malformed_gpu_information_skips_that_gpu(tmp_path: Path) -> None:
    node = build_node(tmp_path, gpus=2)
    bad = node.proc_root / "driver/nvidia/gpus" / node.gpus[0].bus_id / "information"
    bad.write_text("Model: broken\n")
    inv = discover(config_for(node), cuda_version=no_cuda)
    assert [g.bus_id for g in inv.gpus] == [node.gpus[1].bus_id]
    assert any(node.gpus[0].bus_id in w and "skipped" in w for w in inv.warnings)


def test_inventory_is_taken_again_when_the_driver_changes(tmp_path: Path) -> None:
    node = build_node(tmp_path, gpus=2)
    config = config_for(node)
    now = [0.0]
    takes: list[int] = []

    def take(c: EngineConfig) -> Inventory:
        takes.append(1)
        return discover(c, cuda_version=no_cuda)

    cache = InventoryCache(config, interval=10, take=take, clock=lambda: now[0])
    assert len(cache.get().gpus) == 2 and len(takes) == 1
    now[0] = 20
    assert cache.get() is not None and len(takes) == 1  # nothing changed: no new discovery

    # A GPU disappears (hot unplug, or the driver unbinds it).
    shutil.rmtree(node.proc_root / "driver/nvidia/gpus" / node.gpus[1].bus_id)
    now[0] = 25
    assert len(cache.get().gpus) == 2  # not yet: inside the interval
    now[0] = 31
    assert len(cache.get().gpus) == 1 and len(takes) == 2

    # A new driver version is loaded.
    version = node.proc_root / "driver/nvidia/version"
    version.write_text(version.read_text().replace("550.163.01", "550.999.01"))
    assert cache.refresh() is True
    assert cache.get().driver_version == "550.999.01"
    assert cache.refresh() is False


def test_fingerprint_of_a_node_without_driver(tmp_path: Path) -> None:
    assert fingerprint(EngineConfig(proc_root=str(tmp_path))) == ("", ())
