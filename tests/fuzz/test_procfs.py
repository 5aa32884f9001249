"""Fuzzing the parsers of the driver's procfs files (``engine.procfs``, ``engine.migfs``).

The files come from the kernel, but a container root, a test fixture or a
future driver may hold anything. Every parser returns plain values or raises
``DiscoveryError`` (``canonical_bus_id``: ``ValueError``, as documented);
``params_with_device_modification_disabled`` never fails and is idempotent.
"""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from nri_gpu.engine import migfs
from nri_gpu.engine.errors import DiscoveryError
from nri_gpu.engine.procfs import (
    canonical_bus_id,
    params_with_device_modification_disabled,
    parse_driver_version,
    parse_gpu_information,
    parse_params,
    parse_proc_devices,
)
from tests.fuzz.support import fuzz, mutated_text, typed

INFORMATION = (
    "Model: \t\t NVIDIA A100-SXM4-40GB\nIRQ:   \t\t 183\nGPU UUID: \t GPU-6f1a8b0e-4c2d-5b3a-9e7f-1d2c3b4a5e6f\n"
    "Video BIOS: \t 92.00.36.00.02\nBus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\n"
    "Bus Location: \t 0000:07:00.0\nDevice Minor: \t 2\nGPU Excluded:\t No\n"
)
VERSION = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.163.01  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Wed Jun 18 20:33:28 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)
DEVICES = (
    "Character devices:\n  1 mem\n  4 /dev/vc/0\n195 nvidia\n195 nvidiactl\n511 nvidia-uvm\n\n"
    "Block devices:\n  7 loop\n259 blkext\n"
)
PARAMS = 'ResmanDebugLevel: 4294967295\nRmLogonRC: 1\nModifyDeviceFiles: 1\nDeviceFileUID: 0\nRegistryDwords: ""\n'
SAMPLES = st.sampled_from([INFORMATION, VERSION, DEVICES, PARAMS, INFORMATION.replace("\n", "\r\n")])
TEXTS = st.one_of(mutated_text(SAMPLES, max_ops=4), st.text(max_size=64))


@fuzz(200)
@given(text=TEXTS)
# Found by this test: a Device Minor of over 4300 digits made int() raise ValueError.
@example(text=INFORMATION.replace("Device Minor: \t 2", "Device Minor: \t " + "1" * 4400))
@example(text=INFORMATION.replace("No", "Blacklisted"))
def test_gpu_information(text: str) -> None:
    got = typed(DiscoveryError, parse_gpu_information, text, source="gpus/0000:07:00.0/information")
    if not isinstance(got, DiscoveryError):
        assert got.model and got.uuid and got.bus_location and got.minor >= 0


@fuzz(200)
@given(text=TEXTS)
@example(text="NVRM version: Kernel Module " + "1." * 3000 + "x")
def test_driver_version(text: str) -> None:
    got = typed(DiscoveryError, parse_driver_version, text)
    assert isinstance(got, DiscoveryError) or got[0].isdigit()


@fuzz(200)
@given(text=TEXTS)
@example(text="Character devices:\n" + "1" * 5000 + " nvidia\n")
def test_proc_devices(text: str) -> None:
    got = typed(DiscoveryError, parse_proc_devices, text)
    assert isinstance(got, DiscoveryError) or all(0 <= major < 10**9 for major in got.values())


@fuzz(200)
@given(text=TEXTS)
# Found by the long run (seed 0x4e524947): str.splitlines broke the line at U+2028.
@example(text='RmLogonRC: 1\nModifyDeviceFiles:\u2028 1\nDeviceFileUID: 0\nRegistryDwords: ""\n')
# Found by the long run: a last line ending in "\r" got the key appended on the same line.
@example(text="RmLogonRC: 1\r")
def test_params_and_the_params_a_container_sees(text: str) -> None:
    typed(DiscoveryError, parse_params, text)
    shown = typed((), params_with_device_modification_disabled, text)
    assert "ModifyDeviceFiles" in shown
    assert params_with_device_modification_disabled(shown) == shown, "not idempotent"


@fuzz(200)
@given(
    text=st.one_of(
        st.from_regex(r"([0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9]", fullmatch=True), st.text(max_size=16)
    )
)
def test_canonical_bus_id(text: str) -> None:
    got = typed(ValueError, canonical_bus_id, text)
    if not isinstance(got, ValueError):
        assert canonical_bus_id(got) == got


ACCESS = "DeviceFileMinor: 291\nDeviceFileMode: 292\nDeviceFileModify: 1\n"


@fuzz(200)
@given(text=st.one_of(mutated_text(st.sampled_from([ACCESS, ACCESS.replace("\n", "\r\n")]), max_ops=4), TEXTS))
@example(text="DeviceFileMinor: " + "1" * 4400 + "\nDeviceFileMode: 292\n")
@example(text="DeviceFileMinor: \u0662\nDeviceFileMode: 292\n")  # an Arabic-Indic two: int() takes it
def test_mig_capability_file(text: str) -> None:
    got = typed(DiscoveryError, migfs.parse_cap_file, text, source="gpu2/mig/gi2/access")
    if not isinstance(got, DiscoveryError):
        assert 0 <= got.minor < 10**9 and 0 <= got.mode <= 0o777


@fuzz(200)
@given(name=st.one_of(st.from_regex(r"(gpu|gi|ci)[0-9]{1,3}", fullmatch=True), st.text(max_size=8)))
def test_mig_folder_names(name: str) -> None:
    for parse, prefix, top in (
        (migfs.gpu_dir_minor, "gpu", migfs.MAX_GPU_MINOR),
        (migfs.gpu_instance_id, "gi", migfs.MAX_GPU_INSTANCE),
        (migfs.compute_instance_id, "ci", migfs.MAX_COMPUTE_INSTANCE),
    ):
        got = parse(name)
        assert got is None or (0 <= got <= top and name == f"{prefix}{got}")
