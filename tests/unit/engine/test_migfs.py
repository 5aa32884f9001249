"""The MIG capability file parser on the driver's exact text (nv-caps.c ``nv_cap_procfs_read``)."""

from __future__ import annotations

import doctest

import pytest

from nri_gpu.engine import migfs
from nri_gpu.engine.errors import DiscoveryError
from nri_gpu.engine.migfs import CapFile, parse_cap_file
from testbed.gpunode import cap_minor

# Byte for byte what the driver prints: "%s: %d\n" for each of the three keys.
GI_ACCESS = "DeviceFileMinor: 291\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
CONFIG = "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n"


def test_docstring_examples() -> None:
    failed, tried = doctest.testmod(migfs, report=True)
    assert tried >= 3 and failed == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GI_ACCESS, CapFile(291, 0o444)),
        (CONFIG, CapFile(1, 0o400)),
        ("DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 0\n", CapFile(2, 0o444)),  # root set Modify 0
        ("DeviceFileMinor: 22\nDeviceFileMode: 292\n", CapFile(22, 0o444)),  # Modify is not needed
        ("DeviceFileMode: 292\nDeviceFileMinor: 22\nFuture: x\n", CapFile(22, 0o444)),  # order, unknown keys
        ("DeviceFileMinor: 22\nDeviceFileMinor: 23\nDeviceFileMode: 292\n", CapFile(22, 0o444)),  # first wins
    ],
    ids=["gi-access", "config", "modify-0", "no-modify", "reordered", "repeated"],
)
def test_parse_cap_file(text: str, expected: CapFile) -> None:
    assert parse_cap_file(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("DeviceFileMode: 292\nDeviceFileModify: 1\n", "no 'DeviceFileMinor' line"),
        ("DeviceFileMinor: 291\n", "no 'DeviceFileMode' line"),
        ("DeviceFileMinor: 0x123\nDeviceFileMode: 292\n", "'DeviceFileMinor' is '0x123', not a decimal number"),
        ("DeviceFileMinor: -1\nDeviceFileMode: 292\n", "'DeviceFileMinor' is '-1'"),
        ("DeviceFileMinor: 1\nDeviceFileMode: 4095\n", "more than permission bits"),
        ("DeviceFileMinor: " + "9" * 5000 + "\nDeviceFileMode: 292\n", "not a decimal number"),
        ("", "no 'DeviceFileMinor' line"),
    ],
    ids=["no-minor", "no-mode", "hex-minor", "negative", "mode-too-big", "huge", "empty"],
)
def test_parse_cap_file_refuses(text: str, message: str) -> None:
    with pytest.raises(DiscoveryError, match="gpu2/mig/gi2/access") as info:
        parse_cap_file(text, source="/proc/driver/nvidia/capabilities/gpu2/mig/gi2/access")
    assert message in str(info.value)


def test_names_the_driver_cannot_make_are_not_instances() -> None:
    assert [migfs.gpu_instance_id(f"gi{g}") for g in range(16)] == [*range(15), None]
    assert [migfs.compute_instance_id(f"ci{c}") for c in range(9)] == [*range(8), None]
    assert [migfs.gpu_dir_minor(f"gpu{m}") for m in (0, 31, 32, 255)] == [0, 31, None, None]
    # "gi\uff11": int() takes a fullwidth digit; the driver never writes one.
    for name in ("gi", "gi-1", "gi 1", "gi1 ", "GI1", "gi\uff11", "ci", "gpu", "gpu+1", "access"):
        assert migfs.gpu_instance_id(name) is None and migfs.compute_instance_id(name) is None
        assert migfs.gpu_dir_minor(name) is None


@pytest.mark.parametrize(
    ("gpu", "gi", "ci", "minor"),
    # nvidia-container-cli listings of real nodes (singularity#6339, #471) and the sim's table.
    [
        (0, 2, None, 21),
        (0, 2, 0, 22),
        (0, 3, None, 30),
        (0, 4, 0, 40),
        (1, 2, None, 156),
        (1, 2, 0, 157),
        (2, 2, None, 291),
        (2, 10, 0, 364),
        (31, 14, 7, 4322),
    ],
)
def test_the_sim_gives_the_minors_of_real_listings(gpu: int, gi: int, ci: int | None, minor: int) -> None:
    """The simulated node writes the access files discovery tests read: its minors
    must be the ones real drivers hand out (discovery itself never computes one)."""
    assert cap_minor(gpu, gi, ci) == minor
