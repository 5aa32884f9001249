"""Parsers of the NVIDIA driver's procfs files, on real driver output.

The samples are what the driver's ``nv-procfs.c`` writes (its ``seq_printf``
formats: ``"Model: \\t\\t %s\\n"``, ``"GPU Excluded:\\t %s\\n"``, ...), taken from a
DGX A100 on the 550 driver; the UUIDs are altered.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_gpu.engine.errors import DiscoveryError
from nri_gpu.engine.procfs import (
    GpuInformation,
    canonical_bus_id,
    nvidia_major,
    params_with_device_modification_disabled,
    parse_driver_version,
    parse_gpu_information,
    parse_params,
    parse_proc_devices,
)

A100_INFORMATION = (
    "Model: \t\t NVIDIA A100-SXM4-40GB\n"
    "IRQ:   \t\t 183\n"
    "GPU UUID: \t GPU-6f1a8b0e-4c2d-5b3a-9e7f-1d2c3b4a5e6f\n"
    "Video BIOS: \t 92.00.36.00.02\n"
    "Bus Type: \t PCIe\n"
    "DMA Size: \t 47 bits\n"
    "DMA Mask: \t 0x7fffffffffff\n"
    "Bus Location: \t 0000:07:00.0\n"
    "Device Minor: \t 2\n"
    "GPU Firmware: \t 550.163.01\n"
    "GPU Excluded:\t No\n"
)

PROC_DEVICES = """\
Character devices:
  1 mem
  4 /dev/vc/0
  4 tty
  4 ttyS
  5 /dev/tty
  5 /dev/console
  5 /dev/ptmx
  7 vcs
 10 misc
 13 input
 21 sg
 29 fb
 89 i2c
128 ptm
136 pts
180 usb
189 usb_device
195 nvidia
195 nvidia-modeset
195 nvidiactl
202 cpu/msr
203 cpu/cpuid
226 drm
234 nvidia-nvswitch
235 nvidia-nvlink
236 nvidia-caps
237 nvidia-caps-imex-channels
238 ipmidev
239 nvme-generic
240 nvme
508 nvidia-uvm
511 aux

Block devices:
  7 loop
  8 sd
  9 md
 65 sd
253 device-mapper
259 blkext
"""

PARAMS = """\
ResmanDebugLevel: 4294967295
RmLogonRC: 1
ModifyDeviceFiles: 1
DeviceFileUID: 0
DeviceFileGID: 0
DeviceFileMode: 438
InitializeSystemMemoryAllocations: 1
UsePageAttributeTable: 4294967295
EnableMSI: 1
EnablePCIeGen3: 0
MemoryPoolSize: 0
KMallocHeapMaxSize: 0
VMallocHeapMaxSize: 0
IgnoreMMIOCheck: 0
TCEBypassMode: 0
EnableStreamMemOPs: 0
EnableUserNUMAManagement: 1
NvLinkDisable: 0
RmProfilingAdminOnly: 1
PreserveVideoMemoryAllocations: 0
EnableS0ixPowerManagement: 0
S0ixPowerManagementVideoMemoryThreshold: 256
DynamicPowerManagement: 3
DynamicPowerManagementVideoMemoryThreshold: 200
RegisterPCIDriver: 1
EnablePCIERelaxedOrderingMode: 0
EnableResizableBar: 0
EnableGpuFirmware: 18
EnableGpuFirmwareLogs: 2
RmNvlinkBandwidthLinkCount: 0
EnableDbgBreakpoint: 0
OpenRmEnableUnsupportedGpus: 0
DmaRemapPeerMmio: 1
ImexChannelCount: 2048
CreateImexChannel0: 0
GrdmaPciTopoCheckOverride: 0
RegistryDwords: ""
RegistryDwordsPerDevice: ""
RmMsg: ""
GpuBlacklist: ""
TemporaryFilePath: ""
ExcludedGpus: ""
"""

# ---------------------------------------------------------------------------
# information


def test_a100_information() -> None:
    info = parse_gpu_information(A100_INFORMATION)
    assert info == GpuInformation(
        model="NVIDIA A100-SXM4-40GB",
        uuid="GPU-6f1a8b0e-4c2d-5b3a-9e7f-1d2c3b4a5e6f",
        bus_location="0000:07:00.0",  # split at the first colon only
        minor=2,
        excluded=False,
    )


@pytest.mark.parametrize(
    ("line", "excluded"),
    [
        ("GPU Excluded:\t Yes\n", True),
        ("GPU Excluded:\t No\n", False),
        ("Blacklisted:\t Yes\n", True),  # the key's name in older drivers
        ("", False),  # drivers before the key existed
    ],
    ids=["excluded", "not excluded", "blacklisted (old name)", "no such line"],
)
def test_excluded_gpus(line: str, excluded: bool) -> None:
    text = A100_INFORMATION.replace("GPU Excluded:\t No\n", line)
    assert parse_gpu_information(text).excluded is excluded


def test_excluded_with_an_unknown_value_is_an_error_not_a_guess() -> None:
    text = A100_INFORMATION.replace("GPU Excluded:\t No", "GPU Excluded:\t Maybe")
    with pytest.raises(DiscoveryError, match=r"gpus/0000:07:00.0/information: 'GPU Excluded' is 'Maybe'"):
        parse_gpu_information(text, source="gpus/0000:07:00.0/information")


@pytest.mark.parametrize("key", ["Model", "GPU UUID", "Bus Location", "Device Minor"])
def test_a_missing_required_key_names_the_file_and_the_key(key: str) -> None:
    text = "".join(line for line in A100_INFORMATION.splitlines(keepends=True) if not line.startswith(f"{key}:"))
    with pytest.raises(DiscoveryError, match=rf"^gpus/0000:07:00.0/information: no '{key}' line$"):
        parse_gpu_information(text, source="gpus/0000:07:00.0/information")


def test_an_empty_required_value_is_an_error() -> None:
    text = A100_INFORMATION.replace("GPU-6f1a8b0e-4c2d-5b3a-9e7f-1d2c3b4a5e6f", "")
    with pytest.raises(DiscoveryError, match=r"information: 'GPU UUID' is empty"):
        parse_gpu_information(text)


@pytest.mark.parametrize("minor", ["two", "-1", "+2", "2.0", "0x2", "\u0662", "2 3"])
def test_a_minor_that_is_not_a_decimal_number(minor: str) -> None:
    text = A100_INFORMATION.replace("Device Minor: \t 2", f"Device Minor: \t {minor}")
    with pytest.raises(DiscoveryError, match=r"'Device Minor' is .*, not a number"):
        parse_gpu_information(text)


def test_unknown_keys_lines_without_colon_and_crlf_are_tolerated() -> None:
    text = "Some Future Key:\t x:y\r\nno colon here\r\n" + A100_INFORMATION.replace("\n", "\r\n")
    assert parse_gpu_information(text).minor == 2


# ---------------------------------------------------------------------------
# version


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.163.01  Wed Jun 18 20:48:02 UTC 2025\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n",
            "550.163.01",
        ),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.163.01  Release Build  "
            "(dvs-builder@U16-I3-B03-4-3)  Wed Jun 18 20:33:28 UTC 2025\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n",
            "550.163.01",
        ),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.124.06  Release Build  (root@x)\n",
            "570.124.06",
        ),
        ("NVRM version: NVIDIA UNIX x86 Kernel Module  180.44  Mon Mar 23 14:59:10 PST 2009\n", "180.44"),
    ],
    ids=["proprietary", "open", "open aarch64", "two-part version"],
)
def test_driver_version(text: str, version: str) -> None:
    assert parse_driver_version(text) == version


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", r"no 'NVRM version:' line"),
        ("GCC version:  gcc version 12.2.0\n", r"no 'NVRM version:' line"),
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  \n", r"no driver version in"),
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550  Wed\n", r"no driver version in"),
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.163.01beta\n", r"no driver version in"),
    ],
    ids=["empty", "no NVRM line", "no version", "no dot", "trailing junk"],
)
def test_no_driver_version(text: str, message: str) -> None:
    with pytest.raises(DiscoveryError, match=message):
        parse_driver_version(text)


# ---------------------------------------------------------------------------
# /proc/devices


def test_proc_devices_character_section_only() -> None:
    majors = parse_proc_devices(PROC_DEVICES)
    assert majors["nvidia"] == 195 and majors["nvidiactl"] == 195
    assert majors["nvidia-uvm"] == 508
    assert majors["nvidia-caps"] == 236
    assert majors["nvidia-caps-imex-channels"] == 237
    assert majors["nvidia-nvswitch"] == 234
    assert majors["tty"] == 4 and majors["/dev/vc/0"] == 4
    assert "loop" not in majors and "device-mapper" not in majors  # block devices
    assert nvidia_major(majors) == 195


def test_nvidia_frontend_before_550_40() -> None:
    text = "Character devices:\n  1 mem\n195 nvidia-frontend\n195 nvidiactl\n510 nvidia-uvm\n\nBlock devices:\n"
    majors = parse_proc_devices(text)
    assert nvidia_major(majors) == 195
    assert nvidia_major({"mem": 1, "nvidia-uvm": 510}) is None


def test_a_name_listed_twice_keeps_its_first_major() -> None:
    assert parse_proc_devices("Character devices:\n 10 misc\n 11 misc\n") == {"misc": 10}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", r"does not start with 'Character devices:': None"),
        ("Block devices:\n  7 loop\n", r"does not start with 'Character devices:'"),
        ("  1 mem\n", r"does not start with 'Character devices:'"),
        ("Character devices:\nabc nvidia\n", r"malformed line 'abc nvidia'"),
        ("Character devices:\n195\n", r"malformed line '195'"),
        ("Character devices:\n195 nvidia extra\n", r"malformed line '195 nvidia extra'"),
        ("Character devices:\n1234567890 big\n", r"malformed line '1234567890 big'"),
    ],
    ids=["empty", "block first", "no header", "no major", "no name", "two names", "major too long"],
)
def test_malformed_proc_devices(text: str, message: str) -> None:
    with pytest.raises(DiscoveryError, match=message):
        parse_proc_devices(text)


def test_lines_after_block_devices_are_not_read() -> None:
    assert parse_proc_devices("Character devices:\n  1 mem\nBlock devices:\nnot a line\n") == {"mem": 1}


# ---------------------------------------------------------------------------
# params


def test_parse_params() -> None:
    params = parse_params(PARAMS)
    assert params["ModifyDeviceFiles"] == "1"
    assert params["DeviceFileMode"] == "438"
    assert params["RegistryDwords"] == '""'
    assert len(params) == len(PARAMS.splitlines())


def test_malformed_params_line() -> None:
    with pytest.raises(DiscoveryError, match=r"params: malformed line 'garbage'"):
        parse_params("RmLogonRC: 1\ngarbage\n")


def test_device_modification_disabled_keeps_every_other_byte() -> None:
    out = params_with_device_modification_disabled(PARAMS)
    assert out == PARAMS.replace("ModifyDeviceFiles: 1\n", "ModifyDeviceFiles: 0\n")
    assert parse_params(out)["ModifyDeviceFiles"] == "0"
    assert params_with_device_modification_disabled(out) == out  # idempotent


@pytest.mark.parametrize(
    ("text", "result"),
    [
        (
            "RmLogonRC: 1\r\nModifyDeviceFiles:\t 1\r\nEnableMSI: 1",
            "RmLogonRC: 1\r\nModifyDeviceFiles:\t 0\r\nEnableMSI: 1",
        ),
        ("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0"),
        ("ModifyDeviceFiles:", "ModifyDeviceFiles: 0"),
        ("ModifyDeviceFiles: 0\n", "ModifyDeviceFiles: 0\n"),
        ("RmLogonRC: 1\n", "RmLogonRC: 1\nModifyDeviceFiles: 0\n"),
        ("RmLogonRC: 1", "RmLogonRC: 1\nModifyDeviceFiles: 0\n"),
        ("", "ModifyDeviceFiles: 0\n"),
        ("NVreg_ModifyDeviceFiles: 1\n", "NVreg_ModifyDeviceFiles: 1\nModifyDeviceFiles: 0\n"),
    ],
    ids=[
        "crlf and tab kept",
        "no final newline",
        "empty value",
        "already 0",
        "missing",
        "missing, no newline",
        "empty file",
        "other key",
    ],
)
def test_device_modification_disabled_edge_cases(text: str, result: str) -> None:
    assert params_with_device_modification_disabled(text) == result


# ---------------------------------------------------------------------------
# bus ids


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("0000:07:00.0", "0000:07:00.0"),
        ("00000000:07:00.0", "0000:07:00.0"),  # NVML
        ("07:00.0", "0000:07:00.0"),  # no domain
        ("0000:B1:00.0", "0000:b1:00.0"),
        ("00000000:B1:1F.7", "0000:b1:1f.7"),
        ("0001:07:00.0", "0001:07:00.0"),
        ("00010000:01:00.0", "10000:01:00.0"),  # Intel VMD domain, as Linux prints it
        ("10000:01:00.0", "10000:01:00.0"),
    ],
)
def test_canonical_bus_id(text: str, canonical: str) -> None:
    assert canonical_bus_id(text) == canonical


@pytest.mark.parametrize(
    "text",
    [
        "",
        "7:00.0",  # one-digit bus
        "000:07:00.0",  # three-digit domain
        "000000000:07:00.0",  # nine-digit domain
        "0000:07:20.0",  # device above 0x1f
        "0000:07:00.8",  # function above 7
        "0000:07:00",
        "0000:07.00.0",
        "0000:g7:00.0",
        " 0000:07:00.0",
        "0000:07:00.0\n",
        "GPU-6f1a8b0e-4c2d-5b3a-9e7f-1d2c3b4a5e6f",
        "0",
        "0000:\uff10\uff17:00.0",  # fullwidth digits
    ],
)
def test_not_a_bus_id(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(text))):
        canonical_bus_id(text)


# ---------------------------------------------------------------------------
# fuzzing: arbitrary text raises only the parsers' own errors

texts = st.one_of(
    st.text(max_size=200),
    st.lists(
        st.one_of(
            st.sampled_from(A100_INFORMATION.splitlines() + PROC_DEVICES.splitlines()[:6]),
            st.sampled_from(
                ["Character devices:", "Block devices:", "NVRM version: ", "Device Minor: ", "GPU Excluded: "]
            ),
            st.text(max_size=30),
        ),
        max_size=20,
    ).map("\n".join),
)


@given(texts)
@settings(max_examples=1000)
def test_arbitrary_text_raises_only_discovery_error(text: str) -> None:
    for parse in (parse_gpu_information, parse_proc_devices, parse_driver_version, parse_params):
        try:
            parse(text)
        except DiscoveryError:
            pass


@given(st.text(max_size=30))
@settings(max_examples=500)
def test_bus_ids_raise_only_value_error(text: str) -> None:
    try:
        result = canonical_bus_id(text)
    except ValueError:
        return
    assert canonical_bus_id(result) == result


keys = st.one_of(
    st.just("ModifyDeviceFiles"),
    st.text(
        alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=":"), min_size=1, max_size=20
    ),
)
values = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=20)


@given(st.lists(st.tuples(keys, values), max_size=10), st.sampled_from(["\n", "\r\n"]))
@settings(max_examples=500)
def test_rewritten_params_differ_only_in_modify_device_files(pairs: list[tuple[str, str]], newline: str) -> None:
    text = "".join(f"{k}: {v}{newline}" for k, v in pairs)
    out = params_with_device_modification_disabled(text)
    before, after = text.splitlines(keepends=True), out.splitlines(keepends=True)
    assert parse_params(out)["ModifyDeviceFiles"] == "0"
    if "ModifyDeviceFiles" not in parse_params(text):
        assert after == [*before, "ModifyDeviceFiles: 0\n"]
        return
    assert len(after) == len(before)
    for old, new in zip(before, after, strict=True):
        assert new == old or (old.split(":")[0] == "ModifyDeviceFiles" and new.split(":")[1].strip() == "0")
