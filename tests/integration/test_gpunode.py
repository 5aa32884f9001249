"""The simulated GPU node of the test bed (hack/testbed/gpunode.py) and the real
ld.so.cache files of hack/testbed/ldcaches.py.

The engine's tests trust these nodes to look like a host with driver 550.163.01 loaded,
so the node's own properties are checked here with the system's tools (glibc's
``ldconfig -p``, the ELF magic), never with the engine's parsers. Integration, not
unit: it builds nodes of NVIDIA's own files (downloaded once).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import time
from pathlib import Path

import pytest

from testbed import debs, gpunode, ldcaches
from testbed.gpunode import SimNode, build_node

LIB64 = "/usr/lib/x86_64-linux-gnu"
LIB32 = "/usr/lib/i386-linux-gnu"
VERSION = gpunode.DRIVER_VERSION


@pytest.fixture(scope="module", autouse=True)
def driver_tree() -> Path:
    """Fetch and assemble the driver once; skip (not fail) only when the mirror is
    unreachable and nothing is cached."""
    try:
        return gpunode.driver_tree()
    except debs.DebUnavailable as exc:
        pytest.skip(f"cannot download the NVIDIA driver packages from Debian: {exc}")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> SimNode:
    return build_node(tmp_path_factory.mktemp("node"), gpus=4)


def ld_cache(path: Path) -> list[tuple[str, str, str]]:
    """(soname, flags, path) as glibc's own reader prints them."""
    out = subprocess.run(
        [gpunode.ldconfig_binary(), "-p", "-C", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return [(m[1], m[2], m[3]) for m in re.finditer(r"^\t(\S+) \((.*)\) => (.*)$", out, re.M)]


def information(node: SimNode, bus_id: str) -> dict[str, str]:
    text = (node.proc_root / "driver/nvidia/gpus" / bus_id / "information").read_text()
    return dict((k, v.strip()) for k, _, v in (line.partition(":") for line in text.splitlines()))


# --------------------------------------------------------------------------- shape


def test_roots_and_flags(node: SimNode) -> None:
    assert node.driver_root == node.root and node.dev_root == node.root
    assert node.proc_root == node.root / "proc"
    assert node.driver_version == VERSION
    assert node.flags() == [
        "--driver-root",
        str(node.root),
        "--dev-root",
        str(node.root),
        "--proc-root",
        str(node.root / "proc"),
    ]


def test_gpus_are_indexed_in_bus_order_with_minors_out_of_order(node: SimNode) -> None:
    assert [g.index for g in node.gpus] == [0, 1, 2, 3]
    assert [g.bus_id for g in node.gpus] == sorted(g.bus_id for g in node.gpus)
    assert node.gpus[0].bus_id == "0000:07:00.0"
    assert sorted(g.minor for g in node.gpus) == [0, 1, 2, 3]
    assert all(g.minor != g.index for g in node.gpus), "default minors must differ from the bus order"
    assert all(
        re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", g.uuid) for g in node.gpus
    )
    assert len({g.uuid for g in node.gpus}) == 4


def test_uuids_are_stable_and_in_bus_order_option(tmp_path: Path, node: SimNode) -> None:
    again = build_node(tmp_path, gpus=8, in_bus_order=True)
    assert [g.minor for g in again.gpus] == list(range(8))
    assert [g.uuid for g in again.gpus[:4]] == [g.uuid for g in node.gpus]  # a hash of the bus id


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 16])
def test_minors_are_a_permutation(tmp_path: Path, count: int) -> None:
    sim = build_node(tmp_path, gpus=count)
    assert sorted(g.minor for g in sim.gpus) == list(range(count))
    assert [g.bus_id for g in sim.gpus] == sorted(g.bus_id for g in sim.gpus)
    if count > 1:
        assert [g.minor for g in sim.gpus] != list(range(count))


# --------------------------------------------------------------------------- procfs


def test_information_files_match_the_gpus(node: SimNode) -> None:
    for gpu in node.gpus:
        info = information(node, gpu.bus_id)
        assert list(info) == [
            "Model",
            "IRQ",
            "GPU UUID",
            "Video BIOS",
            "Bus Type",
            "DMA Size",
            "DMA Mask",
            "Bus Location",
            "Device Minor",
            "GPU Excluded",
        ]
        assert info["GPU UUID"] == gpu.uuid and info["Bus Location"] == gpu.bus_id
        assert info["Device Minor"] == str(gpu.minor) and info["GPU Excluded"] == "No"
        assert info["Model"] == "NVIDIA A100-SXM4-80GB"
    raw = (node.proc_root / "driver/nvidia/gpus" / node.gpus[0].bus_id / "information").read_text()
    assert raw.startswith("Model: \t\t NVIDIA") and "\nDevice Minor: \t 2\n" in raw  # the driver's own spacing


def test_version_params_and_devices(node: SimNode) -> None:
    version = (node.proc_root / "driver/nvidia/version").read_text()
    assert re.match(rf"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {re.escape(VERSION)}  ", version)
    assert "\nGCC version:  " in version
    params = (node.proc_root / "driver/nvidia/params").read_text().splitlines()
    assert "ModifyDeviceFiles: 1" in params and 'ExcludedGpus: ""' in params and len(params) == 39
    devices = (node.proc_root / "devices").read_text()
    chars = devices.split("\nBlock devices:\n")[0].splitlines()[1:]
    majors = {name: int(major) for major, name in (line.split(None, 1) for line in chars)}
    assert majors["nvidia"] == majors["nvidiactl"] == 195
    assert majors["nvidia-uvm"] == gpunode.UVM_MAJOR and majors["nvidia-caps"] == gpunode.CAPS_MAJOR


def test_excluded_gpu(tmp_path: Path) -> None:
    sim = build_node(tmp_path, gpus=4, excluded=[1])
    assert [g.excluded for g in sim.gpus] == [False, True, False, False]
    assert information(sim, sim.gpus[1].bus_id)["GPU Excluded"] == "Yes"
    assert f'ExcludedGpus: "{sim.gpus[1].uuid}"' in (sim.proc_root / "driver/nvidia/params").read_text()
    with pytest.raises(ValueError):
        build_node(tmp_path / "bad", gpus=2, excluded=[2])


# --------------------------------------------------------------------------- /dev


def test_device_nodes(node: SimNode) -> None:
    dev = node.dev_root / "dev"
    expected = {
        "nvidiactl": (195, 255),
        "nvidia-modeset": (195, 254),
        "nvidia-uvm": (gpunode.UVM_MAJOR, 0),
        "nvidia-uvm-tools": (gpunode.UVM_MAJOR, 1),
    }
    expected |= {f"nvidia{g.minor}": (195, g.minor) for g in node.gpus}
    assert (dev / "nvidia-caps").is_dir()
    assert node.real_device_nodes == (os.geteuid() == 0)
    for name, (major, minor) in expected.items():
        st = (dev / name).lstat()
        if node.real_device_nodes:
            assert stat.S_ISCHR(st.st_mode), name
            assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (major, minor), name
        else:
            assert stat.S_ISREG(st.st_mode) and st.st_size == 0, name


def test_regular_files_when_asked(tmp_path: Path) -> None:
    sim = build_node(tmp_path, gpus=1, real_device_nodes=False)
    assert not sim.real_device_nodes
    assert stat.S_ISREG((tmp_path / "dev/nvidiactl").lstat().st_mode)


# --------------------------------------------------------------------------- driver files


def test_real_driver_files_at_installer_paths(node: SimNode) -> None:
    root = node.driver_root
    smi = root / "usr/bin/nvidia-smi"
    assert smi.read_bytes()[:4] == b"\x7fELF" and os.access(smi, os.X_OK)
    for binary in ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "nvidia-persistenced"):
        assert (root / "usr/bin" / binary).read_bytes()[:4] == b"\x7fELF", binary
    cuda = root / LIB64.lstrip("/") / "libcuda.so.1"
    assert os.readlink(cuda) == f"libcuda.so.{VERSION}"
    assert cuda.resolve().stat().st_size > 10_000_000  # the real library, not a stub
    assert os.readlink(root / LIB32.lstrip("/") / "libcuda.so.1") == f"libcuda.so.{VERSION}"
    firmware = sorted(p.name for p in (root / f"lib/firmware/nvidia/{VERSION}").iterdir())
    assert firmware == ["gsp_ga10x.bin", "gsp_tu10x.bin"]
    assert not list(root.rglob("current")), "Debian's nvidia/current layout must not leak through"


def test_elf_soname_reader_agrees_with_the_links(node: SimNode) -> None:
    lib64 = node.driver_root / LIB64.lstrip("/")
    assert gpunode.elf_soname(lib64 / f"libcuda.so.{VERSION}") == "libcuda.so.1"
    assert gpunode.elf_soname(lib64 / f"libnvidia-nvvm.so.{VERSION}") == "libnvidia-nvvm.so.4"
    assert gpunode.elf_soname(lib64 / f"libnvidia-glcore.so.{VERSION}") == f"libnvidia-glcore.so.{VERSION}"
    assert gpunode.elf_soname(node.driver_root / LIB32.lstrip("/") / f"libcuda.so.{VERSION}") == "libcuda.so.1"


def test_ld_so_cache_written_by_the_real_ldconfig(node: SimNode) -> None:
    entries = ld_cache(node.driver_root / "etc/ld.so.cache")
    by_name = {(soname, flags): path for soname, flags, path in entries}
    assert by_name["libcuda.so.1", "libc6,x86-64"] == f"{LIB64}/libcuda.so.1"
    assert by_name["libnvidia-ml.so.1", "libc6,x86-64"] == f"{LIB64}/libnvidia-ml.so.1"
    assert by_name["libcuda.so.1", "libc6"] == f"{LIB32}/libcuda.so.1"
    assert all(path.startswith((LIB64 + "/", LIB32 + "/")) for _, _, path in entries)
    # Each path names a file of the node, relative to the driver root.
    assert all((node.driver_root / path.lstrip("/")).exists() for _, _, path in entries)


def test_node_files_are_hard_links_to_the_cache_but_ld_cache_is_private(node: SimNode, driver_tree: Path) -> None:
    lib = f"{LIB64.lstrip('/')}/libcuda.so.{VERSION}"
    assert (node.driver_root / lib).stat().st_ino == (driver_tree / lib).stat().st_ino
    assert (node.driver_root / "etc/ld.so.cache").stat().st_ino != (driver_tree / "etc/ld.so.cache").stat().st_ino


# --------------------------------------------------------------------------- variants


def test_gpu_operator_layout(tmp_path: Path) -> None:
    sim = build_node(tmp_path, gpus=2, driver_subdir="run/nvidia/driver")
    assert sim.driver_root == tmp_path / "run/nvidia/driver"
    assert sim.dev_root == tmp_path and sim.proc_root == tmp_path / "proc"
    assert (sim.driver_root / LIB64.lstrip("/") / f"libcuda.so.{VERSION}").is_file()
    assert (sim.driver_root / "usr/bin/nvidia-smi").is_file()
    assert not (tmp_path / "usr").exists() and not (tmp_path / "etc").exists()
    assert (tmp_path / "dev/nvidiactl").exists() and (tmp_path / "proc/driver/nvidia/version").is_file()
    assert sim.flags()[1] == str(tmp_path / "run/nvidia/driver")
    assert ("libcuda.so.1", "libc6,x86-64", f"{LIB64}/libcuda.so.1") in ld_cache(sim.driver_root / "etc/ld.so.cache")


def test_node_without_driver(tmp_path: Path) -> None:
    sim = build_node(tmp_path, driver=False)
    assert sim.driver_version is None and sim.gpus == ()
    assert not (sim.proc_root / "driver/nvidia").exists()
    assert "nvidia" not in (sim.proc_root / "devices").read_text()
    assert not list((sim.dev_root / "dev").glob("nvidia*"))
    assert not list(sim.driver_root.rglob("*nvidia*")) and not list(sim.driver_root.rglob("libcuda*"))
    assert [soname for soname, _, _ in ld_cache(sim.driver_root / "etc/ld.so.cache")] == ["libz.so.1"]


def test_warm_build_time(tmp_path: Path) -> None:
    build_node(tmp_path / "warm-up", gpus=8)
    start = time.monotonic()
    build_node(tmp_path / "timed", gpus=8)
    elapsed = time.monotonic() - start
    print(f"warm build_node(gpus=8): {elapsed * 1000:.0f} ms")  # measured, not asserted: CI machines vary


# --------------------------------------------------------------------------- MIG


def _mig_minors(node: SimNode) -> dict[str, int]:
    text = (node.proc_root / "driver/nvidia-caps/mig-minors").read_text()
    return {name: int(minor) for name, minor in (line.split(" ") for line in text.splitlines())}


def _instance_folders(node: SimNode) -> list[str]:
    caps = node.proc_root / "driver/nvidia/capabilities"
    return sorted(str(p.relative_to(caps)) for p in caps.glob("gpu*/mig/gi*/**") if p.is_dir())


def test_default_node_has_no_per_gpu_capability_folders(node: SimNode) -> None:
    assert node.mig is None
    assert not list((node.proc_root / "driver/nvidia/capabilities").glob("gpu*"))
    assert sorted(p.name for p in (node.dev_root / "dev/nvidia-caps").iterdir()) == ["nvidia-cap1", "nvidia-cap2"]


def test_mig_node_is_laid_out_as_the_driver_writes_it(tmp_path: Path) -> None:
    sim = build_node(tmp_path, gpus=4, mig={0: [(2, [0, 1, 2]), (3, [0]), (9, [0]), (10, [0])], 1: []})
    caps = sim.proc_root / "driver/nvidia/capabilities"
    # Every GPU gets its mig folder (keyed by device minor); GPU 1 (minor 3) has no instances.
    assert sorted(p.name for p in caps.glob("gpu*")) == sorted(f"gpu{g.minor}" for g in sim.gpus)
    assert all((caps / f"gpu{g.minor}/mig").is_dir() for g in sim.gpus)
    assert sim.gpus[0].minor == 2 and not list((caps / "gpu3/mig").iterdir())
    minors = _mig_minors(sim)
    expected = {  # the reference table for an A100 of minor 2
        "gpu2/gi2/access": 291,
        "gpu2/gi2/ci0/access": 292,
        "gpu2/gi2/ci1/access": 293,
        "gpu2/gi2/ci2/access": 294,
        "gpu2/gi3/access": 300,
        "gpu2/gi3/ci0/access": 301,
        "gpu2/gi9/access": 354,
        "gpu2/gi9/ci0/access": 355,
        "gpu2/gi10/access": 363,
        "gpu2/gi10/ci0/access": 364,
    }
    for name, minor in expected.items():
        found = re.fullmatch(r"gpu(\d+)/gi(\d+)(?:/ci(\d+))?/access", name)
        assert found is not None
        ci = None if found[3] is None else int(found[3])
        assert minors[name] == minor == gpunode.cap_minor(int(found[1]), int(found[2]), ci)
        access = caps / name.replace("/", "/mig/", 1)
        assert access.read_bytes() == f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n".encode()
        if os.geteuid() == 0:
            assert stat.S_IMODE(access.stat().st_mode) == 0o444
            assert stat.S_IMODE(access.parent.stat().st_mode) == 0o555
        node_path = sim.dev_root / "dev/nvidia-caps" / f"nvidia-cap{minor}"
        st = node_path.lstat()
        assert stat.S_IMODE(st.st_mode) == 0o444
        if sim.real_device_nodes:
            assert stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == gpunode.CAPS_MAJOR
            assert os.minor(st.st_rdev) == minor
    assert len(list((sim.dev_root / "dev/nvidia-caps").iterdir())) == 2 + len(expected)


def test_reconfigure_mig_makes_instances_disappear_and_appear(tmp_path: Path) -> None:
    sim = build_node(tmp_path, gpus=2, mig={0: [(1, [0])]})  # GPU 0 has minor 1
    assert _instance_folders(sim) == ["gpu1/mig/gi1", "gpu1/mig/gi1/ci0"]
    sim = gpunode.reconfigure_mig(sim, {0: [(5, [0, 1])], 1: [(13, [])]})
    assert _instance_folders(sim) == ["gpu0/mig/gi13", "gpu1/mig/gi5", "gpu1/mig/gi5/ci0", "gpu1/mig/gi5/ci1"]
    caps_nodes = sorted(p.name for p in (sim.dev_root / "dev/nvidia-caps").iterdir())
    wanted = [gpunode.cap_minor(0, 13), gpunode.cap_minor(1, 5), gpunode.cap_minor(1, 5, 0), gpunode.cap_minor(1, 5, 1)]
    assert caps_nodes == sorted(["nvidia-cap1", "nvidia-cap2", *(f"nvidia-cap{m}" for m in wanted)])
    sim = gpunode.reconfigure_mig(sim, {})
    assert _instance_folders(sim) == [] and sim.mig == {}
    assert (sim.proc_root / "driver/nvidia/capabilities/gpu1/mig").is_dir()


@pytest.mark.parametrize(
    "spec",
    [{4: []}, {0: [(15, [])]}, {0: [(0, [8])]}, {0: [(1, []), (1, [0])]}, {0: [(1, [0, 0])]}],
    ids=["index", "gi", "ci", "gi-twice", "ci-twice"],
)
def test_mig_spec_is_checked(tmp_path: Path, spec: gpunode.MigSpec) -> None:
    with pytest.raises(ValueError):
        build_node(tmp_path, gpus=4, mig=spec)


def test_reconfigure_needs_a_mig_node(node: SimNode) -> None:
    with pytest.raises(ValueError, match="without MIG"):
        gpunode.reconfigure_mig(node, {})


def test_cli_mig_argument() -> None:
    assert gpunode._parse_mig_args(["1", "0:2.0.1.2,3.0,9"]) == {1: [], 0: [(2, [0, 1, 2]), (3, [0]), (9, [])]}
    with pytest.raises(ValueError, match="--mig 'x'"):
        gpunode._parse_mig_args(["x"])


# --------------------------------------------------------------------------- ldcaches


@pytest.mark.parametrize(
    ("kind", "magic"),
    [
        ("new", b"glibc-ld.so.cache1.1"),
        ("new-hwcaps", b"glibc-ld.so.cache1.1"),
        ("old", b"ld.so-1.7.0\0"),
        ("compat", b"ld.so-1.7.0\0"),
    ],
)
def test_real_ld_caches(kind: str, magic: bytes) -> None:
    data = ldcaches.real_cache(kind)
    assert data.startswith(magic)
    assert (b"glibc-ld.so.cache1.1" in data) == (kind != "old")
    entries = ldcaches.print_cache(data)
    assert ldcaches.CacheEntry("libcuda.so.1", "libc6", f"{LIB32}/libcuda.so.1") in entries
    assert ldcaches.CacheEntry("libcuda.so.1", "libc6,x86-64", f"{LIB64}/libcuda.so.1") in entries
    hwcaps = [e for e in entries if "hwcap" in e.flags]
    assert bool(hwcaps) == (kind == "new-hwcaps")
    assert ldcaches.real_cache(kind) == data  # cached, and ldconfig is deterministic


def test_some_instances_can_lack_their_host_cap_nodes(tmp_path: Path) -> None:
    sim = build_node(tmp_path, gpus=2, mig={0: [(1, [0]), (5, [0])]}, without_cap_nodes=(5,))  # GPU 0: minor 1
    caps = sorted(p.name for p in (sim.dev_root / "dev/nvidia-caps").iterdir())
    present = [gpunode.cap_minor(1, 1), gpunode.cap_minor(1, 1, 0)]
    assert caps == sorted(["nvidia-cap1", "nvidia-cap2", *(f"nvidia-cap{m}" for m in present)])
    assert (sim.proc_root / "driver/nvidia/capabilities/gpu1/mig/gi5/ci0/access").is_file()
    sim = gpunode.reconfigure_mig(sim, {0: [(5, [1])]})
    assert sorted(p.name for p in (sim.dev_root / "dev/nvidia-caps").iterdir()) == ["nvidia-cap1", "nvidia-cap2"]


# --------------------------------------------------------------------------- fabric


def test_the_default_node_has_no_fabric_devices(node: SimNode) -> None:
    dev = node.dev_root / "dev"
    assert not node.fabric
    assert not any(dev.glob("nvidia-fs*")) and not (dev / "infiniband").exists() and not (dev / "gdrdrv").exists()
    assert not (node.driver_root / "etc/cufile.json").exists()
    devices = (node.proc_root / "devices").read_text()
    assert "nvidia-fs" not in devices and "gdrdrv" not in devices and "infiniband" not in devices


def test_a_fabric_node_has_the_nodes_and_majors_real_drivers_register(tmp_path: Path) -> None:
    built = build_node(tmp_path / "n", gpus=1, fabric=True)
    if not built.real_device_nodes:
        pytest.skip("needs real character devices (root)")
    dev = built.dev_root / "dev"
    for rel, major, minor, mode, _kind in gpunode.FABRIC_NODES:
        st = os.lstat(dev / rel)
        assert stat.S_ISCHR(st.st_mode) and stat.S_IMODE(st.st_mode) == mode, rel
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (major, minor), rel
    chars = (built.proc_root / "devices").read_text().split("\n\n")[0]
    for major, name in ((gpunode.FS_MAJOR, "nvidia-fs"), (231, "infiniband_verbs"), (gpunode.GDRDRV_MAJOR, "gdrdrv")):
        assert f"\n{major:3d} {name}\n" in chars
    assert f"\n{gpunode.NVSWITCH_MAJOR:3d} nvidia-nvswitch\n" in chars and "\n 10 misc\n" in chars
    majors = [int(line.split()[0]) for line in chars.splitlines()[1:]]
    assert majors == sorted(majors)  # the kernel lists by major
    assert not (dev / "nvidia-caps-imex-channels").exists()  # the driver makes no channel by default
    assert (built.driver_root / "etc/cufile.json").is_file() and (built.driver_root / "run/udev/data").is_dir()
