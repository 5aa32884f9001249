"""NVML's view of the node's MIG devices: their ``MIG-`` UUIDs and ``i:j`` indexes.

procfs names GPU and compute instances by placement (``gpu<M>/mig/gi<G>/ci<C>``)
but not by the two names users request them by: the ``MIG-<uuid>`` NVML prints
and NVML's raw index ``j`` of ``i:j``, which has gaps and no documented order, so
neither can be computed. Only NVML can tell, so it is asked, and only on a node
whose procfs shows MIG instances (``engine.discover``).

Like the CUDA probe (``engine.cudaversion``), the library is never loaded into
the long-running plugin: a short-lived child interpreter (isolated mode, no
site, an empty environment, ``/`` as its folder, a timeout, its own session so
a timeout kills whatever it started) loads the node's ``libnvidia-ml.so.1`` by
host path with ``ctypes`` and prints one JSON line. The probe makes only calls
whose arguments are scalars, pointers to scalars or a char buffer, so no struct
layout of ``nvml.h`` has to be copied: ``nvmlInit_v2``, ``nvmlDeviceGetCount_v2``,
``nvmlDeviceGetHandleByIndex_v2``, ``nvmlDeviceGetUUID``, ``nvmlDeviceGetMinorNumber``,
``nvmlDeviceGetMigMode``, ``nvmlDeviceGetMaxMigDeviceCount``,
``nvmlDeviceGetMigDeviceHandleByIndex`` (rc 6 NOT_FOUND and 2 INVALID_ARGUMENT
mean "no device at this index": skipped, the raw index kept, as go-nvlib does),
``nvmlDeviceGetGpuInstanceId``, ``nvmlDeviceGetComputeInstanceId``,
``nvmlShutdown`` and ``nvmlErrorString``.

Why not ``nvidia-ml-py`` (pynvml): it loads ``libnvidia-ml.so.1`` by soname from
the default search path, not the driver root's file we name (the GPU operator's
driver lives under ``/run/nvidia/driver``, and the plugin's own image has no
driver); and an isolated ``-I -S`` child has no site-packages to import it from.
It would be one more dependency for ten ctypes calls.

``parse_probe_output`` (the child's line -> ``NvmlSnapshot``) and
``check_against_procfs`` (drop what procfs does not confirm) are pure;
``read_nvml`` runs the child.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from nri_gpu.engine.drain import bounded_output
from nri_gpu.engine.errors import DiscoveryError
from nri_gpu.engine.model import Gpu, MigLayout, NvmlGpu, NvmlMigDevice, NvmlSnapshot

logger = logging.getLogger(__name__)

MAX_OUTPUT = 1 << 18  # bytes of the child's stdout: 32 GPUs x 64 MIG devices fit ten times over
MAX_GPUS = 32
MAX_MIG_DEVICES = 64  # per GPU; raw indexes j are below this too
DEFAULT_TIMEOUT = 5.0

_GPU_UUID = re.compile(r"GPU-[0-9a-fA-F-]{1,64}", re.ASCII)
# "MIG-<uuid>" since R470; "MIG-GPU-<uuid>/<gi>/<ci>" before.
_MIG_UUID = re.compile(r"MIG-(?:[0-9a-fA-F-]{1,64}|GPU-[0-9a-fA-F-]{1,64}/[0-9]{1,2}/[0-9]{1,2})", re.ASCII)


class NvmlError(DiscoveryError):
    """The NVML probe failed, or what it printed makes no sense (the field is named)."""


# The child. Argument: the library's host path. Output: one JSON line, either
# {"gpus": [{"index", "uuid", "minor", "mig": [current, pending] | null,
#            "mig_devices": [[j, uuid, gi, ci], ...]}, ...]}
# or {"error": {"call": name, "rc": n, "text": nvmlErrorString(n)}}.
_PROBE = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
lib.nvmlErrorString.restype = ctypes.c_char_p
U = ctypes.c_uint
class Failed(Exception):
    pass
def call(name, *args, ok=(0,)):
    rc = getattr(lib, name)(*args)
    if rc not in ok:
        text = lib.nvmlErrorString(rc) or b""
        raise Failed({"call": name, "rc": rc, "text": text.decode("ascii", "replace")})
    return rc
def uuid(handle):
    buf = ctypes.create_string_buffer(96)
    call("nvmlDeviceGetUUID", handle, buf, U(96))
    return buf.value.decode("ascii", "replace")
def gpu(i):
    h = ctypes.c_void_p()
    call("nvmlDeviceGetHandleByIndex_v2", U(i), ctypes.byref(h))
    minor, cur, pend = U(), U(), U()
    call("nvmlDeviceGetMinorNumber", h, ctypes.byref(minor))
    mig, devices = None, []
    if call("nvmlDeviceGetMigMode", h, ctypes.byref(cur), ctypes.byref(pend), ok=(0, 3)) == 0:
        mig = [cur.value, pend.value]
    if mig and mig[0] == 1:
        count = U()
        call("nvmlDeviceGetMaxMigDeviceCount", h, ctypes.byref(count))
        for j in range(min(count.value, 64)):
            m = ctypes.c_void_p()
            if call("nvmlDeviceGetMigDeviceHandleByIndex", h, U(j), ctypes.byref(m), ok=(0, 2, 6)) != 0:
                continue
            gi, ci = U(), U()
            call("nvmlDeviceGetGpuInstanceId", m, ctypes.byref(gi))
            call("nvmlDeviceGetComputeInstanceId", m, ctypes.byref(ci))
            devices.append([j, uuid(m), gi.value, ci.value])
    return {"index": i, "uuid": uuid(h), "minor": minor.value, "mig": mig, "mig_devices": devices}
try:
    call("nvmlInit_v2")
    try:
        count = U()
        call("nvmlDeviceGetCount_v2", ctypes.byref(count))
        if count.value > 32:
            raise Failed({"call": "nvmlDeviceGetCount_v2", "rc": 0, "text": "%d GPUs, more than 32" % count.value})
        out = {"gpus": [gpu(i) for i in range(count.value)]}
    finally:
        lib.nvmlShutdown()
except Failed as exc:
    out = {"error": exc.args[0]}
print(json.dumps(out, separators=(",", ":")))
"""


def _shown(value: Any) -> str:
    """``value`` for a message, at most 100 characters: a number of thousands of
    digits (found by tests/fuzz) or a list holding one is not printed whole, and
    past 4300 digits Python refuses to print it at all."""
    if type(value) is int and value.bit_length() > 64:
        return f"a number of {value.bit_length()} bits"
    try:
        text = repr(value)
    except ValueError:
        return f"a {type(value).__name__} too large to show"
    return text if len(text) <= 100 else text[:97] + "..."


def _int(value: Any, what: str, maximum: int) -> int:
    if type(value) is not int or not 0 <= value <= maximum:
        raise NvmlError(f"NVML probe: {what} is {_shown(value)}, not a number 0..{maximum}")
    return value


def _str(value: Any, what: str, pattern: re.Pattern[str]) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise NvmlError(f"NVML probe: {what} is {_shown(value)}, not a UUID of that kind")
    return value


def _mig_mode(value: Any, what: str) -> tuple[bool | None, bool | None]:
    if value is None:
        return None, None  # NOT_SUPPORTED: a GPU without MIG
    if not isinstance(value, list) or len(value) != 2:
        raise NvmlError(f"NVML probe: {what} is {_shown(value)}, not [current, pending]")
    current, pending = (_int(v, what, 1) for v in value)
    return current == 1, pending == 1


def _mig_device(value: Any, what: str) -> NvmlMigDevice:
    if not isinstance(value, list) or len(value) != 4:
        raise NvmlError(f"NVML probe: {what} is {_shown(value)}, not [j, uuid, gi, ci]")
    j = _int(value[0], f"{what} index", MAX_MIG_DEVICES - 1)
    uuid = _str(value[1], f"{what} uuid", _MIG_UUID)
    return NvmlMigDevice(j, uuid, _int(value[2], f"{what} gi", 14), _int(value[3], f"{what} ci", 7))


def _gpu(value: Any, what: str) -> NvmlGpu:
    if not isinstance(value, dict):
        raise NvmlError(f"NVML probe: {what} is not an object")
    missing = {"index", "uuid", "minor", "mig", "mig_devices"} - value.keys()
    if missing:
        raise NvmlError(f"NVML probe: {what} has no {sorted(missing)[0]!r}")
    index = _int(value["index"], f"{what} index", MAX_GPUS - 1)
    uuid = _str(value["uuid"], f"{what} uuid", _GPU_UUID)
    minor = _int(value["minor"], f"{what} minor", (1 << 20) - 1)
    current, pending = _mig_mode(value["mig"], f"{what} mig")
    raw = value["mig_devices"]
    if not isinstance(raw, list) or len(raw) > MAX_MIG_DEVICES:
        raise NvmlError(f"NVML probe: {what} mig_devices is not a list of at most {MAX_MIG_DEVICES}")
    devices = tuple(_mig_device(d, f"{what} MIG device {k}") for k, d in enumerate(raw))
    columns: dict[str, list[object]] = {
        "index": [d.index for d in devices],
        "(gi, ci)": [(d.gi, d.ci) for d in devices],
    }
    for name, keys in columns.items():
        if len(set(keys)) != len(keys):
            raise NvmlError(f"NVML probe: {what} lists a MIG device {name} twice: {keys}")
    return NvmlGpu(index, uuid, minor, current, pending, devices)


def parse_probe_output(text: str) -> NvmlSnapshot:
    """The probe's JSON line -> ``NvmlSnapshot``; ``NvmlError`` naming the bad field.

    >>> line = '{"gpus":[{"index":0,"uuid":"GPU-1a","minor":2,"mig":[1,1],"mig_devices":[[0,"MIG-2b",2,0]]}]}'
    >>> parse_probe_output(line).gpus[0].mig_devices
    (NvmlMigDevice(index=0, uuid='MIG-2b', gi=2, ci=0),)
    >>> parse_probe_output('{"error":{"call":"nvmlInit_v2","rc":9,"text":"Driver Not Loaded"}}')
    Traceback (most recent call last):
    ...
    nri_gpu.engine.nvml.NvmlError: nvmlInit_v2 returned 9 (Driver Not Loaded)
    """
    if len(text) > MAX_OUTPUT:
        raise NvmlError(f"NVML probe: output of {len(text)} bytes, more than {MAX_OUTPUT}")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise NvmlError(f"NVML probe: output is not JSON ({exc}): {text[:100]!r}") from exc
    if not isinstance(data, dict):
        raise NvmlError("NVML probe: output is not an object")
    if "error" in data:
        error = data["error"]
        if not isinstance(error, dict):
            raise NvmlError("NVML probe: error is not an object")
        call, rc, why = (str(error.get(k))[:100] for k in ("call", "rc", "text"))
        raise NvmlError(f"{call} returned {rc} ({why})")
    gpus = data.get("gpus")
    if not isinstance(gpus, list) or len(gpus) > MAX_GPUS:
        raise NvmlError(f"NVML probe: gpus is not a list of at most {MAX_GPUS}")
    parsed = tuple(_gpu(g, f"GPU {k}") for k, g in enumerate(gpus))
    columns: dict[str, list[object]] = {
        "index": [g.index for g in parsed],
        "UUID": [g.uuid.lower() for g in parsed],
        "minor": [g.minor for g in parsed],
    }
    for name, keys in columns.items():
        if len(set(keys)) != len(keys):
            raise NvmlError(f"NVML probe: two GPUs share a {name}: {keys}")
    uuids = [d.uuid.lower() for g in parsed for d in g.mig_devices]
    if len(set(uuids)) != len(uuids):
        raise NvmlError("NVML probe: two MIG devices share a UUID")
    return NvmlSnapshot(parsed)


def check_against_procfs(
    snapshot: NvmlSnapshot, gpus: Sequence[Gpu], layout: MigLayout
) -> tuple[NvmlSnapshot, tuple[str, ...]]:
    """Keep what procfs confirms, with a warning for everything dropped or missing.

    An NVML GPU must be a procfs GPU with the same UUID and device minor; each of
    its MIG devices must have its GPU instance and compute instance folders in
    ``layout`` (under that minor). A compute instance procfs shows and NVML does
    not list is a warning too: it can be requested by placement only.
    """
    by_uuid = {g.uuid.lower(): g for g in gpus}
    warnings: list[str] = []
    kept: list[NvmlGpu] = []
    for ngpu in snapshot.gpus:
        found = by_uuid.get(ngpu.uuid.lower())
        if found is None or found.minor != ngpu.minor:
            seen = "not in procfs" if found is None else f"has minor {found.minor} in procfs"
            warnings.append(
                f"NVML GPU {ngpu.index} ({ngpu.uuid}, minor {ngpu.minor}) {seen}; its MIG devices are ignored"
            )
            continue
        devices = []
        for dev in ngpu.mig_devices:
            gi = layout.instance(ngpu.minor, dev.gi)
            if gi is None or all(c.ci != dev.ci for c in gi.compute_instances):
                warnings.append(
                    f"NVML MIG device {ngpu.index}:{dev.index} ({dev.uuid}) is gi {dev.gi} ci {dev.ci} of "
                    f"GPU minor {ngpu.minor}, which procfs does not show; ignored"
                )
                continue
            devices.append(dev)
        kept.append(dataclasses.replace(ngpu, mig_devices=tuple(devices)))
    listed = {(g.minor, d.gi, d.ci) for g in kept for d in g.mig_devices}
    for gi in layout.gpu_instances:
        for ci in gi.compute_instances:
            if (gi.gpu_minor, gi.gi, ci.ci) not in listed:
                warnings.append(
                    f"MIG device gpu{gi.gpu_minor}/mig/gi{gi.gi}/ci{ci.ci} is not listed by NVML: "
                    "it has no MIG UUID or i:j here, only its placement"
                )
    return NvmlSnapshot(tuple(kept)), tuple(warnings)


def _run(libnvml: str, timeout: float) -> str:
    """The child's stdout; NvmlError if it could not run, timed out or failed."""
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _PROBE, libnvml],
            env={},
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a timeout kills its whole group
        )
    except OSError as exc:
        raise NvmlError(f"cannot run the NVML probe on {libnvml}: {exc}") from exc
    try:
        out, err = bounded_output(proc, timeout, MAX_OUTPUT)
    except subprocess.TimeoutExpired:
        raise NvmlError(f"NVML probe of {libnvml} did not answer within {timeout:g} s; killed") from None
    if len(out) > MAX_OUTPUT:
        raise NvmlError(f"NVML probe of {libnvml} wrote more than {MAX_OUTPUT} bytes; killed")
    if proc.returncode != 0:
        detail = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise NvmlError(f"NVML probe of {libnvml} failed (exit {proc.returncode}): {detail[:200]}")
    return out[: MAX_OUTPUT + 1].decode(errors="replace")


def read_nvml(libnvml: str, timeout: float = DEFAULT_TIMEOUT) -> tuple[NvmlSnapshot | None, str | None]:
    """(snapshot, None) or (None, why not) for the libnvidia-ml at host path ``libnvml``.

    The snapshot is NVML's word, not yet checked against procfs (``check_against_procfs``).
    """
    start = time.monotonic()
    try:
        snapshot = parse_probe_output(_run(libnvml, timeout))
    except NvmlError as exc:
        logger.debug("NVML probe of %s failed after %.1f ms", libnvml, (time.monotonic() - start) * 1000)
        return None, f"NVML unavailable: {exc}"
    logger.debug("NVML probe of %s took %.1f ms", libnvml, (time.monotonic() - start) * 1000)
    return snapshot, None
