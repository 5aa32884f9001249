"""Parsers of what the NVIDIA kernel driver writes under ``/proc``.  (pure)

Each takes the text of one file and returns plain values; reading the file is
the caller's business (``engine.root``). The formats are the driver's
``nv-procfs.c`` ``seq_printf`` lines, shown with a real sample in each
docstring. Malformed input is a ``DiscoveryError`` naming the file and the
offending key or line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from nri_gpu.engine.errors import DiscoveryError


@dataclass(frozen=True)
class GpuInformation:
    """The fields of ``/proc/driver/nvidia/gpus/<bus>/information`` that discovery uses."""

    model: str  # "NVIDIA A100-SXM4-40GB"
    uuid: str  # "GPU-6f1a8b0e-..."
    bus_location: str  # as the driver prints it: "0000:07:00.0"
    minor: int  # names /dev/nvidia<minor>
    excluded: bool  # NVreg_ExcludedGpus took it out of service


_REQUIRED = ("Model", "GPU UUID", "Bus Location", "Device Minor")
# "GPU Excluded" since 460-ish drivers; "Blacklisted" is its older name.
_EXCLUDED_KEYS = ("GPU Excluded", "Blacklisted")
_YES_NO = {"Yes": True, "No": False}
# At most 9 digits (a minor is 20 bits): a minor of over 4300 digits made int() raise
# ValueError instead of a DiscoveryError (found by tests/fuzz).
_DIGITS = re.compile(r"[0-9]{1,9}")


def parse_gpu_information(text: str, *, source: str = "information") -> GpuInformation:
    r"""Parse one GPU's information file: ``Key:<tabs and spaces>value`` lines.

    Sample input (an A100 on a 550 driver; ``\t`` is a tab, as the driver's
    ``seq_printf(s, "Model: \t\t %s\n", ...)`` writes it)::

        Model: \t\t NVIDIA A100-SXM4-40GB
        IRQ:   \t\t 183
        GPU UUID: \t GPU-6f1a8b0e-4c2d-5b3a-9e7f-1d2c3b4a5e6f
        Video BIOS: \t 92.00.36.00.02
        Bus Type: \t PCIe
        DMA Size: \t 47 bits
        DMA Mask: \t 0x7fffffffffff
        Bus Location: \t 0000:07:00.0
        Device Minor: \t 2
        GPU Excluded:\t No

    Each line is split at its first colon (bus ids and UUIDs contain more);
    unknown keys are ignored and the first of a repeated key wins.

    Raises ``DiscoveryError`` naming ``source`` and the key when a required key
    (Model, GPU UUID, Bus Location, Device Minor) is missing or empty, the
    minor is not a decimal number, or ``GPU Excluded`` is neither Yes nor No.
    """
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon:
            fields.setdefault(key.strip(), value.strip())
    for key in _REQUIRED:
        if not fields.get(key):
            raise DiscoveryError(f"{source}: no {key!r} line" if key not in fields else f"{source}: {key!r} is empty")
    minor = fields["Device Minor"]
    if not _DIGITS.fullmatch(minor):
        raise DiscoveryError(f"{source}: 'Device Minor' is {minor!r}, not a number")
    excluded = False
    for key in _EXCLUDED_KEYS:
        if key in fields:
            if fields[key] not in _YES_NO:
                raise DiscoveryError(f"{source}: {key!r} is {fields[key]!r}, expected 'Yes' or 'No'")
            excluded = _YES_NO[fields[key]]
            break
    return GpuInformation(
        model=fields["Model"],
        uuid=fields["GPU UUID"],
        bus_location=fields["Bus Location"],
        minor=int(minor),
        excluded=excluded,
    )


_VERSION_LINE = "NVRM version:"
# "... Kernel Module  550.163.01  ..." or "... Kernel Module for x86_64  550.163.01  ..."
_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+([0-9]+(?:\.[0-9]+)+)(?=\s|$)", re.ASCII)


def parse_driver_version(text: str) -> str:
    """The driver version from ``/proc/driver/nvidia/version``.

    Sample inputs, the proprietary and the open kernel module::

        NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.163.01  Wed Jun 18 20:48:02 UTC 2025
        GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)

        NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.163.01  Release Build  (dvs-builder@U16-I3-B03-4-3)  Wed Jun 18 20:33:28 UTC 2025
        GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)

    both give ``"550.163.01"``.

    Raises ``DiscoveryError`` when there is no ``NVRM version:`` line or it
    carries no version after ``Kernel Module``.
    """
    for line in text.splitlines():
        if line.startswith(_VERSION_LINE):
            found = _VERSION.search(line)
            if found is None:
                raise DiscoveryError(f"no driver version in {line.strip()!r}")
            return found.group(1)
    raise DiscoveryError(f"no {_VERSION_LINE!r} line in the driver's version file (starts {text[:60]!r})")


_CHARACTER = "Character devices:"
_BLOCK = "Block devices:"
_DEVICE_LINE = re.compile(r"\s*([0-9]{1,9}) (\S+)\s*", re.ASCII)


def parse_proc_devices(text: str) -> dict[str, int]:
    """Character device majors from ``/proc/devices``: name -> major.

    Sample input (a DGX A100 on a 550 driver; ``nvidia-uvm``'s major is
    dynamic, the others are not)::

        Character devices:
          1 mem
          4 /dev/vc/0
          4 tty
        195 nvidia
        195 nvidia-modeset
        195 nvidiactl
        226 drm
        234 nvidia-nvswitch
        235 nvidia-caps
        236 nvidia-caps-imex-channels
        511 nvidia-uvm

        Block devices:
          7 loop
        259 blkext

    The block section is not read. A name listed twice keeps its first major.

    Raises ``DiscoveryError`` when the text does not start with the
    ``Character devices:`` header or a line is not ``<major> <name>``.
    """
    lines = iter(text.splitlines())
    first = next((line for line in lines if line.strip()), None)
    if first is None or first.strip() != _CHARACTER:
        raise DiscoveryError(f"/proc/devices does not start with {_CHARACTER!r}: {first!r}")
    majors: dict[str, int] = {}
    for line in lines:
        if line.strip() == _BLOCK:
            break
        if not line.strip():
            continue
        found = _DEVICE_LINE.fullmatch(line)
        if found is None:
            raise DiscoveryError(f"/proc/devices: malformed line {line!r}, expected '<major> <name>'")
        majors.setdefault(found.group(2), int(found.group(1)))
    return majors


def nvidia_major(majors: Mapping[str, int]) -> int | None:
    """The GPU devices' major (195): ``nvidia``, or ``nvidia-frontend`` before driver 550.40.

    >>> nvidia_major({"nvidia-frontend": 195, "nvidia-uvm": 511}), nvidia_major({"mem": 1})
    (195, None)
    """
    for name in ("nvidia", "nvidia-frontend"):
        if name in majors:
            return majors[name]
    return None


_MODIFY = "ModifyDeviceFiles"


def parse_params(text: str) -> dict[str, str]:
    """The driver's module parameters from ``/proc/driver/nvidia/params``: key -> raw value.

    Sample input (the start of a 550 driver's file)::

        ResmanDebugLevel: 4294967295
        RmLogonRC: 1
        ModifyDeviceFiles: 1
        DeviceFileUID: 0
        DeviceFileGID: 0
        DeviceFileMode: 438
        ...
        RegistryDwords: ""
        ExcludedGpus: ""

    gives ``{"ResmanDebugLevel": "4294967295", ..., "RegistryDwords": '""', ...}``;
    values keep their quotes.

    Raises ``DiscoveryError`` naming a non-blank line without ``Key: value``.
    """
    params: dict[str, str] = {}
    for line in _kernel_lines(text):
        if not line.strip():
            continue
        key, colon, value = line.partition(":")
        if not colon or not key.strip():
            raise DiscoveryError(f"/proc/driver/nvidia/params: malformed line {line!r}, expected 'Key: value'")
        params.setdefault(key.strip(), value.strip())
    return params


IMEX_CHANNEL_COUNT = "ImexChannelCount"
_MAX_IMEX_CHANNELS = 1 << 20  # the minors of a char device are 20 bits


def imex_channel_count(params: Mapping[str, str], default: int) -> int | None:
    """``ImexChannelCount`` of the params (``NVreg_ImexChannelCount``): channels
    ``0..count-1`` exist. ``default`` when the driver does not print it; None when
    it is not a decimal number up to 2^20.

    >>> imex_channel_count({"ImexChannelCount": "2048"}, 2048), imex_channel_count({}, 2048)
    (2048, 2048)
    >>> imex_channel_count({"ImexChannelCount": "-1"}, 2048) is None
    True
    """
    value = params.get(IMEX_CHANNEL_COUNT)
    if value is None:
        return default
    if not _DIGITS.fullmatch(value) or int(value) > _MAX_IMEX_CHANNELS:
        return None
    return int(value)


def _kernel_lines(text: str, *, keepends: bool = False) -> list[str]:
    """Lines as the kernel ends them, at "\\n" only. ``str.splitlines`` also breaks at
    U+2028, form feeds and the like, which would cut a key from its value
    (``ModifyDeviceFiles:\\u2028 1``): rewritten, such a line came out different
    every time it went through again (found by the long fuzz run).

    >>> _kernel_lines("a: 1\\u2028 2\\nb: 3\\n", keepends=True)
    ['a: 1\\u2028 2\\n', 'b: 3\\n']
    """
    lines = text.split("\n")
    if keepends:
        lines = [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    return lines


def params_with_device_modification_disabled(text: str) -> str:
    """The params file to show a container: every ``ModifyDeviceFiles`` line set to 0.

    With ``ModifyDeviceFiles: 0`` the driver's user-space libraries do not try
    to create or chmod ``/dev/nvidia*`` inside the container. Everything else
    is kept byte for byte (line endings, spacing, order); a file without the
    key gets ``ModifyDeviceFiles: 0`` appended.

    >>> params_with_device_modification_disabled("RmLogonRC: 1\\nModifyDeviceFiles: 1\\nDeviceFileUID: 0\\n")
    'RmLogonRC: 1\\nModifyDeviceFiles: 0\\nDeviceFileUID: 0\\n'
    """
    out: list[str] = []
    found = False
    for line in _kernel_lines(text, keepends=True):
        body = line.rstrip("\r\n")
        key, colon, value = body.partition(":")
        if colon and key.strip() == _MODIFY:
            found = True
            stripped = value.strip()
            if stripped:  # keep the spacing around the value
                start = len(key) + 1 + value.index(stripped)
                body = body[:start] + "0" + body[start + len(stripped) :]
            else:
                body = body + " 0"
            line = body + line[len(line.rstrip("\r\n")) :]
        out.append(line)
    if not found:
        if out and not out[-1].endswith("\n"):  # lines end at "\n" only (``_kernel_lines``)
            out.append("\n")
        out.append(f"{_MODIFY}: 0\n")
    return "".join(out)


_BUS_ID = re.compile(
    r"(?:(?P<domain>[0-9a-f]{4,8}):)?(?P<bus>[0-9a-f]{2}):(?P<device>[0-9a-f]{2})\.(?P<function>[0-7])",
    re.IGNORECASE | re.ASCII,
)


def canonical_bus_id(text: str) -> str:
    """A PCI bus id in the form procfs names GPU folders: ``0000:07:00.0``.

    Accepts the procfs form, NVML's 8-digit domain and the short form without
    a domain, in either case:

    >>> [canonical_bus_id(s) for s in ("0000:07:00.0", "00000000:07:00.0", "07:00.0", "0000:B1:1F.7")]
    ['0000:07:00.0', '0000:07:00.0', '0000:07:00.0', '0000:b1:1f.7']

    Domains above 0xffff (Intel VMD) keep their digits, as Linux prints them:
    ``00010000:01:00.0`` -> ``10000:01:00.0``.

    Raises ``ValueError`` naming the value for anything else (a device number
    above 0x1f, a function above 7, missing or extra parts, spaces).
    """
    found = _BUS_ID.fullmatch(text)
    if found is None or int(found["device"], 16) > 0x1F:
        raise ValueError(f"{text!r} is not a PCI bus id like 0000:07:00.0")
    domain = int(found["domain"] or "0", 16)
    return f"{domain:04x}:{found['bus'].lower()}:{found['device'].lower()}.{found['function']}"
