"""NVIDIA's own libnvidia-ml 550.163.01, from the simulated node's real driver tree:
what the probe makes of it without a kernel module, that the simulated library
replacing it exports nothing the real one lacks, and the test bed's ``--nvml real``.
Integration, not unit: these need NVIDIA's files (downloaded once); the probe and
discovery on the simulated library are unit tests (tests/unit/engine/test_nvml.py,
test_discover_nvml.py).
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from nri_gpu.engine import nvml
from nri_gpu.engine.discover import discover
from nri_gpu.engine.nvml import read_nvml
from testbed import nvmlsim
from testbed.gpunode import LIB64, SimNode, build_node, driver_tree
from tests.unit.engine.test_discover_nvml import config_for, no_cuda


def libnvml(node: SimNode) -> str:
    return str(node.driver_root / LIB64 / "libnvidia-ml.so.1")


def test_the_real_550_library_without_a_kernel_driver_is_a_clean_error() -> None:
    real = driver_tree() / LIB64 / "libnvidia-ml.so.1"
    assert real.resolve().name == "libnvidia-ml.so.550.163.01"
    snapshot, error = read_nvml(str(real))
    assert snapshot is None
    assert error == "NVML unavailable: nvmlInit_v2 returned 9 (Driver Not Loaded)"


def test_a_sim_node_asked_for_the_real_nvml_keeps_nvidias_library(tmp_path: Path) -> None:
    node = build_node(tmp_path, gpus=2, mig={0: [(2, [0])]}, nvml="real")
    assert node.nvml == "real"
    lib = node.driver_root / LIB64 / "libnvidia-ml.so.550.163.01"
    assert lib.stat().st_ino == (driver_tree() / LIB64 / lib.name).stat().st_ino
    assert read_nvml(libnvml(node)) == (None, "NVML unavailable: nvmlInit_v2 returned 9 (Driver Not Loaded)")


def test_the_simulated_library_replaces_a_hard_link_without_writing_into_the_cache(tmp_path: Path) -> None:
    sim = build_node(tmp_path, gpus=2, mig={0: [(2, [0])]})  # NVIDIA's files, hard-linked from the cache
    lib = sim.driver_root / LIB64 / "libnvidia-ml.so.550.163.01"
    cached = driver_tree() / LIB64 / lib.name
    assert lib.stat().st_ino != cached.stat().st_ino
    assert lib.read_bytes() == nvmlsim.library().read_bytes() != cached.read_bytes()
    assert read_nvml(str(cached))[1] == "NVML unavailable: nvmlInit_v2 returned 9 (Driver Not Loaded)"


def test_the_real_550_library_leaves_an_error_and_placements(tmp_path: Path) -> None:
    node = build_node(tmp_path, gpus=2, mig={0: [(2, [0])]}, nvml="real")
    inv = discover(config_for(node), cuda_version=no_cuda)
    assert inv.mig.nvml is None
    assert inv.mig.nvml_error == "NVML unavailable: nvmlInit_v2 returned 9 (Driver Not Loaded)"
    assert [g.gi for g in inv.mig.gpu_instances] == [2]  # procfs's layout stays
    assert inv.warnings == ()  # the error travels in nvml_error, not as an inventory warning


# -- the simulated library's exports are real NVML's ------------------------------------


def _dynamic_symbols(path: Path) -> set[str]:
    """Defined dynamic symbols: ``nm -D --defined-only`` when there, else the ELF itself."""
    if shutil.which("nm"):
        out = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True)
        return {
            fields[-1].split("@")[0] for fields in (ln.split() for ln in out.stdout.splitlines()) if len(fields) == 3
        }
    return _elf_dynsym(path.read_bytes())


def _elf_dynsym(data: bytes) -> set[str]:
    """Names of the defined symbols in .dynsym of a 64-bit little-endian ELF."""
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for _, sh_type, _, _, off, size, link, _, _, entsize in sections:
        if sh_type != 11:  # SHT_DYNSYM
            continue
        str_off = sections[link][4]
        for pos in range(off, off + size, entsize):
            name, _, _, shndx, _, _ = struct.unpack_from("<IBBHQQ", data, pos)
            if shndx != 0 and name:
                names.add(data[str_off + name : data.index(b"\0", str_off + name)].decode())
    return names


def test_every_symbol_the_simulated_library_exports_is_in_the_real_550_library() -> None:
    sim = _dynamic_symbols(nvmlsim.library())
    real = _dynamic_symbols(driver_tree() / LIB64 / "libnvidia-ml.so.550.163.01")
    assert _elf_dynsym(nvmlsim.library().read_bytes()) == sim  # both readers agree
    assert len(real) > 100
    assert "nvmlDeviceGetMigDeviceHandleByIndex" in sim
    assert sim - real == set()
    # And the probe calls nothing the simulated library lacks.
    called = {name for name in sim if f'"{name}"' in nvml._PROBE or f"lib.{name}" in nvml._PROBE}
    assert called == sim - {"nvmlInitWithFlags"}


def test_simulate_gpu_node_nvml_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from testbed import gpunode

    assert gpunode.main([str(tmp_path / "sim"), "--gpus", "2", "--mig", "0:2.0.1.2"]) == 0
    assert "NVML (sim): GPU 0: 0:0=gi2/ci0 0:2=gi2/ci1 0:3=gi2/ci2\n" in capsys.readouterr().out
    assert gpunode.main([str(tmp_path / "real"), "--gpus", "2", "--mig", "0:2.0", "--nvml", "real"]) == 0
    lib = tmp_path / "real" / LIB64 / "libnvidia-ml.so.550.163.01"
    assert lib.stat().st_ino == (gpunode.driver_tree() / LIB64 / lib.name).stat().st_ino
    assert not (tmp_path / "real" / LIB64 / "nvml-sim.txt").exists()
    with pytest.raises(SystemExit):
        gpunode.main([str(tmp_path / "bad"), "--mig", "0", "--nvml", "fake"])
