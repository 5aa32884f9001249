"""Parsers of the MIG capability files the NVIDIA kernel driver writes under ``/proc``.  (pure)

The driver (``nv-caps.c``) makes one small file per capability:
``/proc/driver/nvidia/capabilities/mig/{config,monitor}`` for the whole node, and,
while a GPU instance or compute instance exists,
``capabilities/gpu<M>/mig/gi<G>/access`` and ``.../gi<G>/ci<C>/access``, where ``M``
is the GPU's device minor (``/dev/nvidia<M>``), not its index. Each file names the
minor and the mode of the ``nvidia-caps`` character device a process must open to
use the capability (``/dev/nvidia-caps/nvidia-cap<minor>``).

The minor is read from the file, never computed: ``3 + 135*M + 9*G [+ 1 + C]`` is
how today's drivers hand them out, but only the file is the driver's word.
``/proc/driver/nvidia-caps/mig-minors`` lists every *possible* capability, not
the existing ones, and the driver's own libraries never read it, so nothing here
parses it.

Reading the files is the caller's business (``engine.discover``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nri_gpu.engine.errors import DiscoveryError

# nv-caps.c sizes its tables for 32 GPUs, 15 GPU instances (swizzIds 0..14) and 8
# compute instances per GPU instance; no other name can have a capability file.
MAX_GPU_MINOR = 31
MAX_GPU_INSTANCE = 14
MAX_COMPUTE_INSTANCE = 7

_MAX_MODE = 0o777
# A minor is 20 bits; at most 9 digits keeps int() away from huge inputs.
_NUMBER = re.compile(r"[0-9]{1,9}", re.ASCII)


@dataclass(frozen=True)
class CapFile:
    """What one capability file says: the ``nvidia-caps`` device minor and its mode."""

    minor: int
    mode: int  # 0o444 or 0o400 on every driver seen


def parse_cap_file(text: str, *, source: str = "access") -> CapFile:
    """Parse one capability file: ``Key: <decimal>`` lines.

    Sample input, ``capabilities/gpu2/mig/gi2/access`` of an A100 whose device
    minor is 2 (``nv_cap_procfs_read`` prints ``%d`` for all three)::

        DeviceFileMinor: 291
        DeviceFileMode: 292
        DeviceFileModify: 1

    gives ``CapFile(minor=291, mode=0o444)``. ``DeviceFileModify`` (whether
    nvidia-modprobe may change the node) is not needed and not read; unknown
    lines are ignored and the first of a repeated key wins.

    Raises ``DiscoveryError`` naming ``source`` and the key when
    ``DeviceFileMinor`` or ``DeviceFileMode`` is missing or not a decimal
    number, or the mode has bits beyond 0777.
    """
    fields: dict[str, str] = {}
    for line in text.split("\n"):  # the kernel ends lines at "\n" only
        key, colon, value = line.partition(":")
        if colon:
            fields.setdefault(key.strip(), value.strip())
    numbers = {}
    for key in ("DeviceFileMinor", "DeviceFileMode"):
        if key not in fields:
            raise DiscoveryError(f"{source}: no {key!r} line")
        if not _NUMBER.fullmatch(fields[key]):
            raise DiscoveryError(f"{source}: {key!r} is {fields[key]!r}, not a decimal number")
        numbers[key] = int(fields[key])
    mode = numbers["DeviceFileMode"]
    if mode > _MAX_MODE:
        raise DiscoveryError(f"{source}: 'DeviceFileMode' is {mode} ({mode:o} octal), more than permission bits")
    return CapFile(minor=numbers["DeviceFileMinor"], mode=mode)


# A folder name: its prefix and a number without leading zeros (two digits at most).
_FOLDER = re.compile(r"(gpu|gi|ci)(0|[1-9][0-9]?)", re.ASCII)


def _folder_number(name: str, prefix: str, maximum: int) -> int | None:
    """The number of a ``<prefix><N>`` folder name when ``N`` is at most ``maximum``; else None."""
    found = _FOLDER.fullmatch(name)
    if found is None or found.group(1) != prefix or int(found.group(2)) > maximum:
        return None
    return int(found.group(2))


def gpu_dir_minor(name: str) -> int | None:
    """The device minor a ``capabilities/gpu<M>`` folder is for; None for any other name.

    >>> [gpu_dir_minor(n) for n in ("gpu0", "gpu31", "gpu32", "gpu01", "mig", "fabric-imex-mgmt")]
    [0, 31, None, None, None, None]
    """
    return _folder_number(name, "gpu", MAX_GPU_MINOR)


def gpu_instance_id(name: str) -> int | None:
    """The GPU instance id (swizzId) of a ``gi<G>`` folder; None for any other name.

    >>> [gpu_instance_id(n) for n in ("gi0", "gi14", "gi15", "gi02", "access", "ci0")]
    [0, 14, None, None, None, None]
    """
    return _folder_number(name, "gi", MAX_GPU_INSTANCE)


def compute_instance_id(name: str) -> int | None:
    """The compute instance id of a ``ci<C>`` folder; None for any other name.

    >>> [compute_instance_id(n) for n in ("ci0", "ci7", "ci8", "ci00", "ci10", "access")]
    [0, 7, None, None, None, None]
    """
    return _folder_number(name, "ci", MAX_COMPUTE_INSTANCE)
