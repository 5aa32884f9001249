"""Discovery on simulated nodes built from the real Debian driver files."""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nri_gpu.engine.config import EngineConfig
from nri_gpu.engine.discover import InventoryCache, discover, fingerprint
from nri_gpu.engine.model import Capability, DeviceKind, FileKind, Inventory
from testbed.gpunode import FIXTURE_DRIVER, FIXTURE_NO_DRIVER, SimNode, build_node


def config_for(node: SimNode) -> EngineConfig:
    return EngineConfig(driver_root=str(node.driver_root), dev_root=str(node.dev_root), proc_root=str(node.proc_root))


def no_cuda(path: str) -> tuple[str | None, str | None]:
    return "12.4", None


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> tuple[SimNode, Inventory]:
    node = build_node(tmp_path_factory.mktemp("four"), gpus=4, driver_files=FIXTURE_DRIVER)
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
    # egl-gbm and egl-wayland carry versions of their own (catalogue.OWN_VERSION_LIBRARIES).
    assert all(lib.path.endswith(".so.550.163.01") for lib in inv.libraries if "/libnvidia-egl-" not in lib.path)


def test_binaries_and_firmware(four: tuple[SimNode, Inventory]) -> None:
    _, inv = four
    binaries = {f.path for f in inv.files if f.kind is FileKind.BINARY}
    assert "/usr/bin/nvidia-smi" in binaries
    assert any(f.kind is FileKind.FIRMWARE and "/550.163.01/gsp" in f.path for f in inv.files)


def test_node_without_a_driver_has_no_gpus_and_a_warning(tmp_path: Path) -> None:
    node = build_node(tmp_path, driver=False, driver_files=FIXTURE_NO_DRIVER)
    inv = discover(config_for(node), cuda_version=no_cuda)
    assert not inv.has_driver and inv.gpus == () and inv.libraries == ()
    assert any("no NVIDIA driver" in w for w in inv.warnings)


def test_gpu_operator_layout_reads_the_driver_root(tmp_path: Path) -> None:
    node = build_node(tmp_path, gpus=2, driver_subdir="run/nvidia/driver", driver_files=FIXTURE_DRIVER)
    assert node.driver_root == tmp_path / "run/nvidia/driver"
    inv = discover(config_for(node), cuda_version=no_cuda)
    assert len(inv.gpus) == 2
    assert any(lib.soname == "libcuda.so.1" for lib in inv.libraries)


def test_excluded_gpu_is_not_offered(tmp_path: Path) -> None:
    node = build_node(tmp_path, gpus=4, excluded=[1], driver_files=FIXTURE_DRIVER)
    inv = discover(config_for(node), cuda_version=no_cuda)
    assert len(inv.gpus) == 3
    assert any("excluded" in w for w in inv.warnings)


def test_missing_optional_pieces_are_warnings(tmp_path: Path) -> None:
    node = build_node(tmp_path, gpus=2, driver_files=FIXTURE_DRIVER)
    (node.dev_root / "dev/nvidia-modeset").unlink()
    (node.driver_root / "etc/ld.so.cache").unlink()
    inv = discover(config_for(node), cuda_version=no_cuda)
    assert len(inv.gpus) == 2
    assert inv.libraries == ()
    assert any("nvidia-modeset" in w for w in inv.warnings)
    assert any("driver libraries unknown" in w for w in inv.warnings)


def test_malformed_gpu_information_skips_that_gpu(tmp_path: Path) -> None:
    node = build_node(tmp_path, gpus=2, driver_files=FIXTURE_DRIVER)
    bad = node.proc_root / "driver/nvidia/gpus" / node.gpus[0].bus_id / "information"
    bad.write_text("Model: broken\n")
    inv = discover(config_for(node), cuda_version=no_cuda)
    assert [g.bus_id for g in inv.gpus] == [node.gpus[1].bus_id]
    assert any(node.gpus[0].bus_id in w and "skipped" in w for w in inv.warnings)


def test_inventory_is_taken_again_when_the_driver_changes(tmp_path: Path) -> None:
    node = build_node(tmp_path, gpus=2, driver_files=FIXTURE_DRIVER)
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
    assert fingerprint(EngineConfig(proc_root=str(tmp_path), dev_root=str(tmp_path))) == ("", (), (), ())


def test_an_unreadable_drm_folder_leaves_it_out_of_the_fingerprint(tmp_path: Path) -> None:
    """As discovery warns and goes on, so does the fingerprint: it is taken at the
    plugin's start and again every few seconds in CreateContainer."""
    (tmp_path / "dev/dri").mkdir(parents=True)
    (tmp_path / "dev/dri/by-path").symlink_to("by-path")  # a loop: ELOOP, not "missing"
    assert fingerprint(EngineConfig(proc_root=str(tmp_path), dev_root=str(tmp_path))) == ("", (), (), ())


# -- IPC endpoints: planted by whoever can write /tmp or /run on the node --------------
#
# The walk from the driver root must never follow a link and must accept only what only
# root can change later (runc binds the path again, following links, at every container
# start): the expected type, owned by root, every folder on the way root-owned and not
# writable by others (or sticky, like /tmp). These trees are real: real links, chown to
# uid 1000, real listening sockets, FIFOs and device nodes.

MPS, PERSISTENCED, FABRIC = "/tmp/nvidia-mps", "/run/nvidia-persistenced/socket", "/run/nvidia-fabricmanager/socket"


_SOCKETS: list[socket.socket] = []  # listening sockets a test made, closed after it


@pytest.fixture
def ipc_node(tmp_path: Path) -> Iterator[SimNode]:
    node = build_node(tmp_path / "node", gpus=1, driver_files=FIXTURE_DRIVER)
    root = node.driver_root
    (root / "tmp").mkdir(mode=0o755)
    os.chmod(root / "tmp", 0o1777)  # the real /tmp: sticky, world-writable, root's
    for sub in ("run", "run/nvidia-persistenced", "run/nvidia-fabricmanager", "elsewhere", "var/lib/nvidia"):
        (root / sub).mkdir(mode=0o755, parents=True, exist_ok=True)
    yield node
    while _SOCKETS:
        _SOCKETS.pop().close()


def _listen(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    _SOCKETS.append(s)
    s.bind(str(path))
    s.listen(1)


def _real_mps_dir(root: Path) -> None:
    (root / "tmp/nvidia-mps").mkdir(mode=0o755)
    os.chmod(root / "tmp/nvidia-mps", 0o755)


def _ipc(node: SimNode, **engine: Any) -> tuple[dict[str, str], list[str]]:
    config = dataclasses.replace(config_for(node), **engine)
    inv = discover(config, cuda_version=no_cuda)
    files = {f.path: f.source for f in inv.files if f.kind is FileKind.IPC}
    return files, [w for w in inv.warnings if w.startswith("IPC endpoint")]


def test_the_real_endpoints_are_found_without_links(ipc_node: SimNode) -> None:
    root = ipc_node.driver_root
    _real_mps_dir(root)
    _listen(root / "run/nvidia-persistenced/socket")
    _listen(root / "run/nvidia-fabricmanager/socket")
    files, warnings = _ipc(ipc_node, mps=True)
    assert files == {MPS: MPS, PERSISTENCED: PERSISTENCED, FABRIC: FABRIC}
    assert warnings == []


def test_the_mps_directory_is_opt_in(ipc_node: SimNode) -> None:
    """/tmp is every local account's: the folder is only handed out when the operator says so."""
    _real_mps_dir(ipc_node.driver_root)
    files, warnings = _ipc(ipc_node)
    assert MPS not in files and warnings == []


def _symlink_to_root(root: Path) -> None:
    os.symlink("/", root / "tmp/nvidia-mps")  # ln -s / /tmp/nvidia-mps by any local account


def _symlink_to_root_owned_dir(root: Path) -> None:
    os.symlink("/var/lib/nvidia", root / "tmp/nvidia-mps")


def _dir_owned_by_1000(root: Path) -> None:
    _real_mps_dir(root)
    os.chown(root / "tmp/nvidia-mps", 1000, 1000)


def _world_writable_dir(root: Path) -> None:
    _real_mps_dir(root)
    os.chmod(root / "tmp/nvidia-mps", 0o777)


def _under_non_sticky_world_writable_tmp(root: Path) -> None:
    _real_mps_dir(root)
    os.chmod(root / "tmp", 0o777)  # anyone may rename the root-owned folder away and put a link there


def _under_sticky_tmp_of_uid_1000(root: Path) -> None:
    _real_mps_dir(root)
    os.chown(root / "tmp", 1000, 1000)


def _tmp_is_a_link(root: Path) -> None:
    os.rmdir(root / "tmp")
    (root / "elsewhere/tmp/nvidia-mps").mkdir(mode=0o755, parents=True)
    os.chmod(root / "elsewhere/tmp", 0o1777)
    os.symlink("elsewhere/tmp", root / "tmp")


HOSTILE_MPS = {
    "symlink-to-root": (_symlink_to_root, "symbolic link"),
    "symlink-to-a-root-owned-dir": (_symlink_to_root_owned_dir, "symbolic link"),
    "dir-owned-by-uid-1000": (_dir_owned_by_1000, "owned by uid 1000"),
    "dir-writable-by-others": (_world_writable_dir, "writable by group or others"),
    "under-non-sticky-world-writable-tmp": (_under_non_sticky_world_writable_tmp, "writable by group or others"),
    "under-sticky-tmp-of-uid-1000": (_under_sticky_tmp_of_uid_1000, "owned by uid 1000"),
    "tmp-is-a-symlink": (_tmp_is_a_link, "symbolic link"),
}


def _fifo(root: Path) -> None:
    os.mkfifo(root / PERSISTENCED.lstrip("/"))


def _device_node(root: Path) -> None:
    os.mknod(root / PERSISTENCED.lstrip("/"), 0o666 | stat.S_IFCHR, os.makedev(1, 3))


def _directory(root: Path) -> None:
    (root / PERSISTENCED.lstrip("/")).mkdir()


def _link_to_a_host_dir(root: Path) -> None:
    os.symlink("/var/lib/nvidia", root / PERSISTENCED.lstrip("/"))


def _link_to_a_real_socket(root: Path) -> None:
    _listen(root / "elsewhere/socket")
    os.symlink("/elsewhere/socket", root / PERSISTENCED.lstrip("/"))


def _parent_is_a_link(root: Path) -> None:
    os.rmdir(root / "run/nvidia-persistenced")
    _listen(root / "elsewhere/socket")
    os.symlink("../elsewhere", root / "run/nvidia-persistenced")


def _socket_of_uid_1000(root: Path) -> None:
    _listen(root / PERSISTENCED.lstrip("/"))
    os.chown(root / PERSISTENCED.lstrip("/"), 1000, 1000)


def _in_a_folder_of_uid_1000(root: Path) -> None:
    _listen(root / PERSISTENCED.lstrip("/"))
    os.chown(root / "run/nvidia-persistenced", 1000, 1000)


HOSTILE_SOCKET = {
    "fifo": (_fifo, "is a FIFO, not a socket"),
    "device-node": (_device_node, "is a character device, not a socket"),
    "directory": (_directory, "is a directory, not a socket"),
    "symlink-to-a-host-dir": (_link_to_a_host_dir, "symbolic link"),
    "symlink-to-a-real-socket": (_link_to_a_real_socket, "symbolic link"),
    "parent-folder-is-a-symlink": (_parent_is_a_link, "symbolic link"),
    "socket-owned-by-uid-1000": (_socket_of_uid_1000, "owned by uid 1000"),
    "folder-owned-by-uid-1000": (_in_a_folder_of_uid_1000, "owned by uid 1000"),
}


HOSTILE_IPC = {
    **{f"mps-{case}": (MPS, "/tmp", plant, why) for case, (plant, why) in HOSTILE_MPS.items()},
    **{
        f"socket-{case}": (PERSISTENCED, "/run/nvidia-persistenced", plant, why)
        for case, (plant, why) in HOSTILE_SOCKET.items()
    },
}


@pytest.mark.parametrize("case", list(HOSTILE_IPC))
def test_a_planted_ipc_endpoint_is_skipped_with_a_warning(ipc_node: SimNode, case: str) -> None:
    endpoint, shown, plant, why = HOSTILE_IPC[case]
    plant(ipc_node.driver_root)
    files, warnings = _ipc(ipc_node, mps=True)
    assert endpoint not in files and "/" not in files.values()
    assert len(warnings) == 1, warnings
    assert ipc_node.driver_root.as_posix() + shown in warnings[0] and why in warnings[0], warnings


# -- InventoryCache, refreshed off the event loop (plugin.inventory) ---------------------------


def test_inventory_cache_current_reads_without_checking(tmp_path: Path) -> None:
    node = build_node(tmp_path, gpus=2, driver_files=FIXTURE_DRIVER)
    cache = InventoryCache(config_for(node), interval=0, take=lambda c: discover(c, cuda_version=no_cuda))
    shutil.rmtree(node.proc_root / "driver/nvidia/gpus" / node.gpus[1].bus_id)
    assert len(cache.current.gpus) == 2 and cache.interval == 0  # the loop's read: no procfs, no discovery
    assert len(cache.get().gpus) == 1


def test_a_discovery_that_failed_is_tried_again_at_the_next_check(tmp_path: Path) -> None:
    """The refresh runs in a thread, where a failure is logged and the old inventory
    kept; the change must not be forgotten with it (before: the new fingerprint was
    kept, so the next check saw no change and the old inventory served for good)."""
    node = build_node(tmp_path, gpus=2, driver_files=FIXTURE_DRIVER)
    failing = [False]

    def take(c: EngineConfig) -> Inventory:
        if failing[0]:
            raise OSError("the CUDA probe could not be started")
        return discover(c, cuda_version=no_cuda)

    cache = InventoryCache(config_for(node), interval=1e9, take=take)
    shutil.rmtree(node.proc_root / "driver/nvidia/gpus" / node.gpus[1].bus_id)
    failing[0] = True
    with pytest.raises(OSError):
        cache.refresh()
    assert len(cache.get().gpus) == 2
    failing[0] = False
    assert cache.refresh() is True
    assert len(cache.get().gpus) == 1


# -- MIG: the layout procfs shows (engine.migfs), on simulated MIG nodes ----------------
#
# GPU index 0 has device minor 2 (the sim's minors are not in bus order, so an index
# used where a minor belongs shows): three GPU instances of different sizes, the 3g one
# with three compute instances. GPU 1 (minor 3) is in MIG mode with no instances.

from nri_gpu.engine.errors import DiscoveryError  # noqa: E402
from nri_gpu.engine.model import MigCap, MigLayout  # noqa: E402
from nri_gpu.engine.root import Root  # noqa: E402
from testbed.gpunode import cap_minor, reconfigure_mig  # noqa: E402

MIG_SPEC: dict[int, list[tuple[int, list[int]]]] = {0: [(2, [0, 1, 2]), (3, [0]), (9, [0])], 1: []}
CAPS = "driver/nvidia/capabilities"


def no_nvml(path: str) -> tuple[None, str]:
    """For tests of procfs alone: a MIG layout changed behind the simulated NVML's back
    would make the NVML cross-check warn (engine.nvml; tests in test_discover_nvml.py)."""
    return None, "not asked in this test"


def mig_node(path: Path, spec: dict[int, list[tuple[int, list[int]]]] = MIG_SPEC) -> SimNode:
    return build_node(path, gpus=4, model="NVIDIA A100-SXM4-40GB", mig=spec, driver_files=FIXTURE_DRIVER)


def placements(layout: MigLayout) -> list[tuple[int, int, int | None, int]]:
    """(gpu minor, gi, ci or None, cap minor) of every instance."""
    out: list[tuple[int, int, int | None, int]] = []
    for g in layout.gpu_instances:
        out.append((g.gpu_minor, g.gi, None, g.access.minor))
        out += [(g.gpu_minor, g.gi, c.ci, c.access.minor) for c in g.compute_instances]
    return out


def test_mig_layout_of_a_node_with_instances(tmp_path: Path) -> None:
    node = mig_node(tmp_path)
    assert [g.minor for g in node.gpus[:2]] == [2, 3]
    inv = discover(config_for(node), cuda_version=no_cuda)
    assert inv.warnings == ()
    mig = inv.mig
    assert mig.caps_major == 236
    assert mig.config == MigCap("/proc/driver/nvidia/capabilities/mig/config", 1, 0o400)
    assert mig.monitor == MigCap("/proc/driver/nvidia/capabilities/mig/monitor", 2, 0o444)
    # The reference numbers for minor 2: gi2 291 (+ci 292-294), gi3 300/301, gi9 354/355.
    assert placements(mig) == [
        (2, 2, None, 291),
        (2, 2, 0, 292),
        (2, 2, 1, 293),
        (2, 2, 2, 294),
        (2, 3, None, 300),
        (2, 3, 0, 301),
        (2, 9, None, 354),
        (2, 9, 0, 355),
    ]
    gi2 = mig.instances_of(2)[0]
    assert gi2.access == MigCap("/proc/driver/nvidia/capabilities/gpu2/mig/gi2/access", 291, 0o444)
    assert gi2.compute_instances[1].access.path == "/proc/driver/nvidia/capabilities/gpu2/mig/gi2/ci1/access"
    # MIG on with nothing carved out reads as no instances: procfs cannot say more.
    assert mig.instances_of(3) == () and mig.instances_of(0) == ()


def test_a_node_without_mig_folders_has_no_instances_and_no_warning(four: tuple[SimNode, Inventory]) -> None:
    _, inv = four
    assert inv.mig.gpu_instances == () and inv.mig.caps_major == 236
    assert inv.mig.config is not None and inv.mig.config.minor == 1
    assert not [w for w in inv.warnings if "MIG" in w]


def test_no_capabilities_folder_at_all(tmp_path: Path) -> None:
    node = build_node(tmp_path, gpus=1, driver_files=FIXTURE_DRIVER)
    shutil.rmtree(node.proc_root / CAPS)
    inv = discover(config_for(node), cuda_version=no_cuda)
    assert inv.mig == MigLayout(caps_major=236) and inv.warnings == ()


def test_fingerprint_notices_instances_appearing_and_disappearing(tmp_path: Path) -> None:
    node = mig_node(tmp_path, {0: [], 1: []})
    config = config_for(node)
    takes: list[Inventory] = []

    def take(c: EngineConfig) -> Inventory:
        takes.append(discover(c, cuda_version=no_cuda))
        return takes[-1]

    cache = InventoryCache(config, interval=1e9, take=take)
    empty = fingerprint(config)
    assert empty[2] == () and cache.current.mig.gpu_instances == ()
    assert cache.refresh() is False

    node = reconfigure_mig(node, {1: [(1, [0, 1])]})  # GPU 1 has minor 3
    carved = fingerprint(config)
    assert carved[2] == ("gpu3/mig/gi1", "gpu3/mig/gi1/ci0", "gpu3/mig/gi1/ci1")
    assert cache.refresh() is True
    assert placements(cache.current.mig) == [(3, 1, None, 417), (3, 1, 0, 418), (3, 1, 1, 419)]

    node = reconfigure_mig(node, {1: [(1, [0])]})  # a compute instance destroyed
    assert fingerprint(config)[2] == ("gpu3/mig/gi1", "gpu3/mig/gi1/ci0")
    assert cache.refresh() is True and len(cache.current.mig.gpu_instances[0].compute_instances) == 1

    reconfigure_mig(node, {})
    assert fingerprint(config) == empty
    assert cache.refresh() is True and cache.current.mig.gpu_instances == ()
    assert len(takes) == 4


def _vanish_on_read(monkeypatch: pytest.MonkeyPatch, node: SimNode, doomed: str) -> list[str]:
    """Make ``doomed`` (a folder under capabilities) disappear right when discovery goes
    to read a file in it: listed, then gone, as when an operator destroys an instance."""
    reads: list[str] = []
    original = Root.read_text

    def read_text(self: Root, node_path: str, limit: int = 1 << 24) -> str:
        reads.append(node_path)
        target = node.proc_root / CAPS / doomed
        if node_path.startswith(f"/{CAPS}/{doomed}/") and target.exists():
            for p in [target, *target.rglob("*")]:
                if p.is_dir():
                    p.chmod(0o755)
            shutil.rmtree(target)
        return original(self, node_path, limit)

    monkeypatch.setattr(Root, "read_text", read_text)
    return reads


@pytest.mark.parametrize(
    ("doomed", "left"),
    [
        ("gpu2/mig/gi3", [(2, 2, None), (2, 2, 0), (2, 2, 1), (2, 2, 2), (2, 9, None), (2, 9, 0)]),
        ("gpu2/mig/gi2/ci1", [(2, 2, None), (2, 2, 0), (2, 2, 2), (2, 3, None), (2, 3, 0), (2, 9, None), (2, 9, 0)]),
        ("gpu2/mig/gi2", [(2, 3, None), (2, 3, 0), (2, 9, None), (2, 9, 0)]),
    ],
    ids=["gpu-instance", "compute-instance", "gpu-instance-with-its-cis"],
)
def test_instances_vanishing_between_listing_and_reading_are_left_out_quietly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, doomed: str, left: list[tuple[int, int, int | None]]
) -> None:
    node = mig_node(tmp_path)
    _vanish_on_read(monkeypatch, node, doomed)
    inv = discover(config_for(node), cuda_version=no_cuda, nvml=no_nvml)
    assert [p[:3] for p in placements(inv.mig)] == left
    assert inv.warnings == ()


def test_a_malformed_access_file_is_a_warning_and_only_its_instance_is_left_out(tmp_path: Path) -> None:
    node = mig_node(tmp_path)
    gi3 = node.proc_root / CAPS / "gpu2/mig/gi3/access"
    gi3.write_text("DeviceFileMinor: 3OO\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    ci = node.proc_root / CAPS / "gpu2/mig/gi2/ci2/access"
    ci.write_text("DeviceFileMode: 292\n")
    inv = discover(config_for(node), cuda_version=no_cuda, nvml=no_nvml)
    assert [p[:3] for p in placements(inv.mig)] == [(2, 2, None), (2, 2, 0), (2, 2, 1), (2, 9, None), (2, 9, 0)]
    assert len(inv.warnings) == 2
    assert "gpu2/mig/gi2/ci2/access: no 'DeviceFileMinor' line" in inv.warnings[0]  # listing order
    assert "gpu2/mig/gi3/access: 'DeviceFileMinor' is '3OO'" in inv.warnings[1]


def test_a_compute_instance_without_its_gpu_instance_access_file_is_left_out(tmp_path: Path) -> None:
    node = mig_node(tmp_path)
    (node.proc_root / CAPS / "gpu2/mig/gi9/access").unlink()
    inv = discover(config_for(node), cuda_version=no_cuda)
    assert (2, 9, None) not in [p[:3] for p in placements(inv.mig)]
    assert (2, 9, 0) not in [p[:3] for p in placements(inv.mig)]


def test_only_names_the_driver_can_make_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = mig_node(tmp_path)
    caps = node.proc_root / CAPS
    junk = ["gpu2/mig/gi15", "gpu2/mig/gi2/ci8", "gpu2/mig/gi02", "gpu2/mig/giX", "gpu32/mig/gi0", "gpu7/mig/gi0"]
    for folder in junk:  # gpu7: no GPU of the inventory has minor 7
        (caps / folder).mkdir(parents=True, exist_ok=True)
        (caps / folder / "access").write_text(f"DeviceFileMinor: {cap_minor(2, 0)}\nDeviceFileMode: 292\n")
    reads = _vanish_on_read(monkeypatch, node, "none")
    inv = discover(config_for(node), cuda_version=no_cuda)
    assert len(placements(inv.mig)) == 8 and inv.warnings == ()
    assert not [r for r in reads if any(j in r for j in junk)]
    # The fingerprint lists every gpu<M> the driver can make (minor 7 too), nothing beyond.
    assert "gpu7/mig/gi0" in fingerprint(config_for(node))[2]
    assert not [p for p in fingerprint(config_for(node))[2] if "gi15" in p or "ci8" in p or "gpu32" in p]


def test_a_folder_that_cannot_be_listed_is_a_warning_not_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = mig_node(tmp_path)
    original = Root.listdir

    def listdir(self: Root, node_path: str) -> list[str]:
        if node_path.endswith("/gpu2/mig/gi2") or node_path.endswith("/capabilities"):
            raise DiscoveryError(f"cannot list {node_path} under {self.path}: Permission denied")
        return original(self, node_path)

    monkeypatch.setattr(Root, "listdir", listdir)
    inv = discover(config_for(node), cuda_version=no_cuda, nvml=no_nvml)
    assert [p[:3] for p in placements(inv.mig)][:2] == [(2, 2, None), (2, 3, None)]  # gi2 without its CIs
    assert inv.warnings == (
        f"MIG folder skipped: cannot list /{CAPS}/gpu2/mig/gi2 under {node.proc_root}: Permission denied",
    )
    assert fingerprint(config_for(node))[2] == ()  # the capabilities folder itself: nothing listed, no error


def test_instances_without_a_caps_major_are_a_warning(tmp_path: Path) -> None:
    node = mig_node(tmp_path)
    devices = node.proc_root / "devices"
    devices.write_text(devices.read_text().replace(" nvidia-caps\n", " nvidia-capz\n"))
    inv = discover(config_for(node), cuda_version=no_cuda)
    assert inv.mig.caps_major is None and len(inv.mig.gpu_instances) == 3
    assert inv.warnings == ("MIG instances exist but /proc/devices has no nvidia-caps major",)


def test_inventory_made_without_a_mig_layout_has_an_empty_one() -> None:
    assert Inventory(None, None, (), (), None, (), ()).mig == MigLayout()
