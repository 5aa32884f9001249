"""What a container asks for: which GPUs, which driver capabilities, which requirements.  (pure)

Theory of operation: ``parse_request`` looks for a device list in a fixed order
and the first place that has one decides, even when it says ``void``:

1. the pod annotation ``nvidia.com/gpus.container.<container name>``;
2. the pod annotation ``nvidia.com/gpus``;
3. with ``policy.accept_volume_mounts``, the device plugin's ``/dev/null``
   markers mounted under ``/var/run/nvidia-container-devices/<id>``;
4. the env ``NVIDIA_VISIBLE_DEVICES`` (refused for unprivileged containers
   unless ``policy.accept_env_unprivileged``);
5. with ``policy.legacy_image_all_gpus``, every GPU for a legacy CUDA image
   (``CUDA_VERSION`` set, ``NVIDIA_REQUIRE_CUDA`` unset) that names none.

With a device list that is not void, the fabric and I/O devices are read too
(``engine.fabric``): the IMEX channels (the ``imex/<id>`` markers under
``policy.accept_volume_mounts``, else ``NVIDIA_IMEX_CHANNELS`` under the env's
privilege policy) and ``NVIDIA_GDS``/``_MOFED``/``_GDRCOPY``/``_NVSWITCH``; an
``imex/<id>`` marker never counts as a GPU marker.

A container that has none of these costs a few dict lookups and gets
``RequestOutcome(None)``. A source found is first held against the pod's
namespace (``policy.namespaces``, and ``policy.annotation_namespaces`` for
annotations): a deliberate ask (annotation, volume markers) from a namespace
not allowed is refused, the env (which the image may have baked in) is ignored
with a note. Otherwise the device list is parsed (grammar only: whether GPU 3
exists is for ``selection``), then ``NVIDIA_DRIVER_CAPABILITIES`` (capped by
``policy.capabilities``) and the ``NVIDIA_REQUIRE_*`` expressions are collected
as text for ``requirements.check``.

Every input is hostile and bounded before it is parsed: each value read is at
most ``MAX_VALUE_LENGTH`` characters, each list at most ``MAX_LIST_ENTRIES``
entries, at most ``MAX_VARIABLES`` ``NVIDIA_REQUIRE_*`` variables, whose names
must be ``[A-Z0-9_]``. That keeps the work, and every message, small: this runs
on the plugin's event loop, under the runtime's 2 s deadline.

Every error is a ``RequestError`` that names the bad entry and where it came
from, e.g. ``env NVIDIA_VISIBLE_DEVICES="0,x": unknown device "x" (...)``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

from nri_gpu.engine.config import Policy
from nri_gpu.engine.errors import RequestError, quoted
from nri_gpu.engine.fabric import IMEX_MARKER_PREFIX, FabricRequest, parse_fabric
from nri_gpu.engine.model import ALL_CAPABILITIES, DEFAULT_CAPABILITIES, Capability
from nri_gpu.engine.procfs import canonical_bus_id
from nri_gpu.engine.requirements import MAX_VARIABLES

POD_ANNOTATION = "nvidia.com/gpus"
CONTAINER_ANNOTATION_PREFIX = "nvidia.com/gpus.container."
VOLUME_MARKER_DIR = "/var/run/nvidia-container-devices"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
DRIVER_CAPABILITIES = "NVIDIA_DRIVER_CAPABILITIES"
DISABLE_REQUIRE = "NVIDIA_DISABLE_REQUIRE"
REQUIRE_PREFIX = "NVIDIA_REQUIRE_"
IGNORED_REQUIREMENTS = frozenset({"NVIDIA_REQUIRE_JETPACK"})
MAX_DEVICES = 1024  # no node has more GPUs; bounds what one list may expand to
# Bounds on what a container may hand us. A real request is far inside each: a
# CUDA image's NVIDIA_REQUIRE_CUDA is 1-3 KiB, a device list names a few GPUs.
MAX_VALUE_LENGTH = 16384  # characters of any env or annotation value we read
MAX_LIST_ENTRIES = 256  # entries of a device list, capability list, or volume markers
# ``NVIDIA_*``/``CUDA_VERSION`` env entries of one container that a request reads; a
# real image has a dozen. The rest of the env is only scanned, never copied (an NRI
# message is at most 4 MiB, so even 800k entries scan in ~60 ms).
MAX_REQUEST_ENV = 1024
# Character devices of a container read for MIG device specs; a privileged container has
# every host device (hundreds), and past this none are read.
MAX_DEVICE_NODES = 1024


@dataclass(frozen=True)
class ContainerInfo:
    """What the engine is told about one container (the plugin builds it from NRI's messages)."""

    name: str
    pod_name: str = ""
    pod_namespace: str = ""
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    # The merged container env; the plugin passes only the NVIDIA_* and CUDA_VERSION entries.
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[tuple[str, str], ...] = ()  # (source, destination)
    privileged: bool = False
    # (major, minor) of the character devices already in the container's spec: the
    # device plugin's device specs, which name a MIG device's nodes when NVML cannot
    # name its UUID here (``selection``). Empty when there are more than MAX_DEVICE_NODES.
    devices: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class ByIndex:
    index: int


@dataclass(frozen=True)
class ByUuid:
    uuid: str  # "GPU-" + lower-case hex


@dataclass(frozen=True)
class ByBusId:
    bus_id: str  # canonical "0000:07:00.0"


@dataclass(frozen=True)
class ByMigUuid:
    uuid: str  # "MIG-" + lower-case hex, as NVML prints it from R470 on: needs NVML to resolve


@dataclass(frozen=True)
class ByMigIndex:
    gpu: int  # i: NVML's GPU index
    mig: int  # j: NVML's MIG device index on that GPU: needs NVML to resolve


@dataclass(frozen=True)
class ByMigPlacement:
    """The legacy ``MIG-GPU-<gpu uuid>/<gi>/<ci>``: resolvable from procfs alone."""

    gpu_uuid: str  # "GPU-" + lower-case hex
    gi: int  # 0..14
    ci: int  # 0..7


MigId: TypeAlias = ByMigUuid | ByMigIndex | ByMigPlacement
DeviceId: TypeAlias = ByIndex | ByUuid | ByBusId | MigId


class Selection(enum.Enum):
    ALL = "all"
    NONE = "none"  # the driver, but no GPU
    LIST = "list"


@dataclass(frozen=True)
class GpuRequest:
    selection: Selection
    ids: tuple[DeviceId, ...]  # only for LIST: deduplicated, in request order
    capabilities: frozenset[Capability]
    requirements: tuple[tuple[str, str], ...]  # (variable, expression) sorted by variable; () when disabled
    source: str  # 'annotation "nvidia.com/gpus"', 'env NVIDIA_VISIBLE_DEVICES', 'volume mounts', ...
    # NVIDIA_MIG_MONITOR_DEVICES=all / NVIDIA_MIG_CONFIG_DEVICES=all, allowed by policy
    mig_monitor: bool = False
    mig_config: bool = False
    devices: tuple[tuple[int, int], ...] = ()  # ContainerInfo.devices
    fabric: FabricRequest = field(default_factory=FabricRequest)  # IMEX channels and NVIDIA_GDS etc. (engine.fabric)


@dataclass(frozen=True)
class RequestOutcome:
    """The request (None: the container gets nothing) and the decisions worth a log line."""

    request: GpuRequest | None
    notes: tuple[str, ...] = ()


_NOTHING = RequestOutcome(None)

# ASCII only: \d and re.IGNORECASE would let other scripts' digits and letters in.
_INDEX = re.compile(r"[0-9]+", re.ASCII)
_RANGE = re.compile(r"([0-9]+)-([0-9]+)", re.ASCII)
_UUID = re.compile(r"GPU-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})", re.ASCII | re.IGNORECASE)
_UUID_BODY = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_MIG_UUID = re.compile(rf"MIG-({_UUID_BODY})", re.ASCII | re.IGNORECASE)
_MIG_PLACEMENT = re.compile(rf"MIG-GPU-({_UUID_BODY})/([0-9]+)/([0-9]+)", re.ASCII | re.IGNORECASE)
_MIG_INDEX = re.compile(r"([0-9]+):([0-9]+)", re.ASCII)
MAX_GPU_INSTANCE = 14  # the driver's GPU instance ids (swizzIds) are 0..14
MAX_COMPUTE_INSTANCE = 7
MIG_MONITOR = "NVIDIA_MIG_MONITOR_DEVICES"
MIG_CONFIG = "NVIDIA_MIG_CONFIG_DEVICES"
_CUDA_VERSION = re.compile(r"([0-9]+)\.([0-9]+)(?:\..*)?", re.ASCII)
_KEYWORDS = ("void", "all", "none")
_FORMS = (
    "an index (0), a range (0-3), a GPU UUID (GPU-...), a PCI bus id (0000:07:00.0), "
    "a MIG device (MIG-<uuid>, <gpu>:<mig>, MIG-GPU-<uuid>/<gi>/<ci>), all, none or void"
)
_MIG_FORMS = "MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, MIG-GPU-<gpu uuid>/<gi>/<ci> or <gpu>:<mig>"
_CAPABILITY_BY_NAME = {c.value: c for c in Capability}
_REQUIRE_NAME = re.compile(r"NVIDIA_REQUIRE_[A-Z0-9_]*", re.ASCII)
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})  # Go's strconv.ParseBool
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_IMEX_HOW = f"NVIDIA_IMEX_CHANNELS or volume markers {VOLUME_MARKER_DIR}/{IMEX_MARKER_PREFIX}<id>"


def _bounded(value: str, what: str) -> str:
    """``value``, refused before any parsing when longer than ``MAX_VALUE_LENGTH``."""
    if len(value) > MAX_VALUE_LENGTH:
        raise RequestError(f"{what}: {len(value)} characters, longer than {MAX_VALUE_LENGTH}: {quoted(value, 40)}")
    return value


def _entries(value: str, what: str) -> list[str]:
    """``value`` split on commas and trimmed, at most ``MAX_LIST_ENTRIES`` entries."""
    if value.count(",") >= MAX_LIST_ENTRIES:
        raise RequestError(f"{what}: more than {MAX_LIST_ENTRIES} entries")
    return [entry.strip() for entry in value.split(",")]


# -- device lists -----------------------------------------------------------------


def parse_device_list(value: str, *, what: str) -> tuple[Selection, tuple[DeviceId, ...]] | None:
    """``NVIDIA_VISIBLE_DEVICES`` grammar; None means void (no request). ``what`` names the source in errors.

    >>> parse_device_list("0-1, GPU-8E9F0000-0000-0000-0000-0000000000AB", what="env")
    (<Selection.LIST: 'list'>, (ByIndex(index=0), ByIndex(index=1), ByUuid(uuid='GPU-8e9f0000-0000-0000-0000-0000000000ab')))
    >>> parse_device_list("void", what="env") is None, parse_device_list("0,all", what="env")
    (True, (<Selection.ALL: 'all'>, ()))
    """
    if not value.strip():
        return None
    return _parse_entries(_entries(value, what), what)


def _parse_entries(entries: list[str], what: str) -> tuple[Selection, tuple[DeviceId, ...]] | None:
    if "void" in entries:
        return None
    if "all" in entries:
        return Selection.ALL, ()
    if "none" in entries:
        return Selection.NONE, ()
    ids: list[DeviceId] = []
    for entry in entries:
        ids.extend(_parse_entry(entry, what))
        if len(ids) > MAX_DEVICES:
            raise RequestError(f"{what}: names more than {MAX_DEVICES} devices")
    return Selection.LIST, tuple(dict.fromkeys(ids))


def _parse_entry(entry: str, what: str) -> tuple[DeviceId, ...]:
    if _INDEX.fullmatch(entry):
        return (ByIndex(_index(entry, entry, what)),)
    if m := _RANGE.fullmatch(entry):
        first, last = _index(m[1], entry, what), _index(m[2], entry, what)
        if first > last:
            raise RequestError(f"{what}: range {quoted(entry)} runs backwards (write {last}-{first})")
        return tuple(ByIndex(i) for i in range(first, last + 1))
    if m := _UUID.fullmatch(entry):
        return (ByUuid("GPU-" + m[1].lower()),)
    if m := _MIG_INDEX.fullmatch(entry):
        return (ByMigIndex(_index(m[1], entry, what), _index(m[2], entry, what)),)
    if m := _MIG_PLACEMENT.fullmatch(entry):
        gi, ci = _instance_id(m[2], MAX_GPU_INSTANCE), _instance_id(m[3], MAX_COMPUTE_INSTANCE)
        if gi is None or ci is None:
            raise RequestError(
                f"{what}: MIG device {quoted(entry)}: GPU instances are 0-{MAX_GPU_INSTANCE} and "
                f"compute instances 0-{MAX_COMPUTE_INSTANCE}"
            )
        return (ByMigPlacement("GPU-" + m[1].lower(), gi, ci),)
    if m := _MIG_UUID.fullmatch(entry):
        return (ByMigUuid("MIG-" + m[1].lower()),)
    if entry.upper().startswith("MIG-"):
        raise RequestError(f"{what}: malformed MIG device id {quoted(entry)} (expected {_MIG_FORMS})")
    if entry.upper().startswith("GPU-"):
        raise RequestError(
            f"{what}: malformed GPU UUID {quoted(entry)} (expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"
        )
    try:
        return (ByBusId(canonical_bus_id(entry)),)
    except ValueError:
        pass
    raise RequestError(f"{what}: {_unknown_entry(entry)}")


def _index(digits: str, entry: str, what: str) -> int:
    significant = digits.lstrip("0") or "0"
    if len(significant) > len(str(MAX_DEVICES)) or int(significant) >= MAX_DEVICES:
        raise RequestError(f"{what}: GPU index in {quoted(entry)} is out of range (at most {MAX_DEVICES - 1})")
    return int(significant)


def _instance_id(digits: str, highest: int) -> int | None:
    """A GPU or compute instance id as the driver writes it (decimal, no leading zeros), or None."""
    if len(digits) > 2 or (len(digits) > 1 and digits[0] == "0") or int(digits) > highest:
        return None
    return int(digits)


def _unknown_entry(entry: str) -> str:
    if not entry:
        return f"empty entry (a stray comma?); expected {_FORMS}"
    if entry.lower() in _KEYWORDS:
        return f"unknown device {quoted(entry)}; did you mean {entry.lower()}?"
    if entry.startswith("cdi/") or "=" in entry:
        return f"{quoted(entry)}: CDI device names are not supported"
    if entry.startswith(IMEX_MARKER_PREFIX):
        return f"{quoted(entry)}: IMEX channels are asked for with {_IMEX_HOW}, not in a device list"
    return f"unknown device {quoted(entry)}; expected {_FORMS}"


def _marker_ids(mounts: Iterable[tuple[str, str]]) -> list[str]:
    prefix = VOLUME_MARKER_DIR + "/"
    ids: list[str] = []
    for src, dest in mounts:
        if src == "/dev/null" and dest.startswith(prefix):
            if len(ids) == MAX_LIST_ENTRIES:
                raise RequestError(f"volume mounts under {prefix}: more than {MAX_LIST_ENTRIES} entries")
            ids.append(_bounded(dest[len(prefix) :], f"volume mount {quoted(dest, 80)}").strip("/"))
    return ids


def _split_markers(mounts: Iterable[tuple[str, str]]) -> tuple[list[str], tuple[str, ...]]:
    """The markers' GPU ids, and the channel ids of the ``imex/<id>`` ones (the toolkit's split)."""
    ids = _marker_ids(mounts)
    imex = tuple(i[len(IMEX_MARKER_PREFIX) :] for i in ids if i.startswith(IMEX_MARKER_PREFIX))
    return [i for i in ids if not i.startswith(IMEX_MARKER_PREFIX)], imex


# -- capabilities and requirements -------------------------------------------------------


def parse_capabilities(
    value: str | None, *, legacy_image: bool, what: str = f"env {DRIVER_CAPABILITIES}="
) -> frozenset[Capability]:
    """``NVIDIA_DRIVER_CAPABILITIES``: unset or empty gives utility+compute (every one for a legacy image).

    Names compare case-insensitively; empty entries are skipped; ``all`` anywhere means all.
    ``what`` names the value's source in errors (``--capabilities `` for a flag).

    >>> sorted(c.value for c in parse_capabilities(" Compute, video ", legacy_image=False))
    ['compute', 'video']
    """
    if value is None or not value.strip():
        return ALL_CAPABILITIES if legacy_image else DEFAULT_CAPABILITIES
    caps: set[Capability] = set()
    everything = False
    for raw in _entries(_bounded(value, what.rstrip("= ")), f"{what}{quoted(value)}"):
        name = raw.strip().lower()
        if name == "all":
            everything = True
        elif name:
            cap = _CAPABILITY_BY_NAME.get(name)
            if cap is None:
                known = ", ".join(sorted(_CAPABILITY_BY_NAME))
                raise RequestError(
                    f"{what}{quoted(value)}: unknown capability {quoted(raw.strip())} (known: {known}, all)"
                )
            caps.add(cap)
    if everything:
        return ALL_CAPABILITIES
    return frozenset(caps) or (ALL_CAPABILITIES if legacy_image else DEFAULT_CAPABILITIES)


def _parse_bool(name: str, value: str) -> bool:
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise RequestError(
        f"env {name}={quoted(value)}: expected a boolean (1, t, true, TRUE, True, 0, f, false, FALSE, False)"
    )


def _is_legacy(env: Mapping[str, str]) -> bool:
    return bool(env.get("CUDA_VERSION")) and not env.get("NVIDIA_REQUIRE_CUDA")


def _legacy_requirement(cuda_version: str) -> str:
    m = _CUDA_VERSION.fullmatch(_bounded(cuda_version, "env CUDA_VERSION").strip())
    if m is None:
        raise RequestError(f"env CUDA_VERSION={quoted(cuda_version)}: expected a version like 12.4 or 12.4.1")
    # Leading zeros dropped as text, not by int(): a CUDA_VERSION of over 4300 digits
    # made int() raise ValueError instead of a RequestError (found by tests/fuzz).
    major, minor = m[1].lstrip("0") or "0", m[2].lstrip("0") or "0"
    return f"cuda>={major}.{minor}"


def _requirements(
    env: Mapping[str, str], policy: Policy, legacy: bool, notes: list[str]
) -> tuple[tuple[str, str], ...]:
    found = [
        (name, value)
        for name, value in env.items()
        if name.startswith(REQUIRE_PREFIX) and name not in IGNORED_REQUIREMENTS and value.strip()
    ]
    if not policy.require_checks:
        if found or legacy:
            notes.append("NVIDIA_REQUIRE_* not checked: policy.require_checks is off")
        return ()
    disable = env.get(DISABLE_REQUIRE)
    if disable and _parse_bool(DISABLE_REQUIRE, _bounded(disable, f"env {DISABLE_REQUIRE}")):
        if found or legacy:
            notes.append(f"NVIDIA_REQUIRE_* not checked: the container sets {DISABLE_REQUIRE}={disable}")
        return ()
    if len(found) > MAX_VARIABLES:
        raise RequestError(f"the container sets more than {MAX_VARIABLES} NVIDIA_REQUIRE_* variables ({len(found)})")
    for name, value in found:
        # Refused rather than quoted: a name is printed in messages and log lines,
        # and no real image has one with lower case or punctuation.
        if not _REQUIRE_NAME.fullmatch(name) or len(name) > 120:
            raise RequestError(
                f"env {quoted(name)}: not a requirement variable name (A-Z, 0-9 and _ after NVIDIA_REQUIRE_)"
            )
        _bounded(value, f"env {name}")
    if legacy:
        found.append(("CUDA_VERSION", _legacy_requirement(env["CUDA_VERSION"])))
    return tuple(sorted(found))


# -- the request ----------------------------------------------------------------------------


_VISIBLE_PREFIX = VISIBLE_DEVICES + "="
_LEGACY_PREFIX = "CUDA_VERSION="
_VISIBLE_AND_LEGACY = (_VISIBLE_PREFIX, _LEGACY_PREFIX)
_MARKER_PREFIX = VOLUME_MARKER_DIR + "/"


def may_request(
    annotations: Mapping[str, str],
    container_name: str,
    env: Iterable[str],
    mount_destinations: Iterable[str],
    policy: Policy,
) -> bool:
    """False only when ``parse_request`` would certainly find no source: no request,
    no note and no error (a property test holds the two together).

    The hot path's pre-filter: CreateContainer and StartContainer run for every
    container of the node and almost all ask for nothing, so it reads the raw
    ``KEY=VALUE`` env entries and mount destinations as they come, before any
    conversion: two annotation lookups, one prefix scan of the env and, only when
    policy reads them, one of the mounts. It mirrors the precedence above: the two
    annotations, the volume markers, ``NVIDIA_VISIBLE_DEVICES``, the legacy
    ``CUDA_VERSION`` rule. Saying yes too often costs a conversion; saying no
    wrongly would silently ignore a GPU request."""
    if POD_ANNOTATION in annotations or CONTAINER_ANNOTATION_PREFIX + container_name in annotations:
        return True
    # One C-level prefix test per entry: with the legacy rule on, half the cost of two.
    prefixes = _VISIBLE_AND_LEGACY if policy.legacy_image_all_gpus else _VISIBLE_PREFIX
    for entry in env:
        if entry.startswith(prefixes):
            return True
    return policy.accept_volume_mounts and any(d.startswith(_MARKER_PREFIX) for d in mount_destinations)


def parse_request(info: ContainerInfo, policy: Policy) -> RequestOutcome:
    """The GPU request of one container, by the precedence in the module docstring.

    Raises RequestError for a malformed or oversized list, capability, boolean,
    requirement variable or CUDA_VERSION, and for what policy forbids outright:
    an annotation or volume markers from a namespace not allowed.
    """
    annotations = info.pod_annotations
    for key in (CONTAINER_ANNOTATION_PREFIX + info.name, POD_ANNOTATION):
        value = annotations.get(key)
        if value is not None:
            source = f"annotation {quoted(key)}"
            _check_namespace(info, policy.namespaces, "namespaces", source)
            _check_namespace(info, policy.annotation_namespaces, "annotation_namespaces", source)
            what = f"{source}={quoted(_bounded(value, source))}"
            channels = _split_markers(info.mounts)[1] if policy.accept_volume_mounts else ()
            return _outcome(info, policy, source, parse_device_list(value, what=what), channels)

    env = info.env
    env_value = env.get(VISIBLE_DEVICES)
    names_markers = env_value is not None and env_value.strip() == VOLUME_MARKER_DIR
    imex: tuple[str, ...] = ()
    if policy.accept_volume_mounts:
        ids, imex = _split_markers(info.mounts)
        if ids:
            _check_namespace(info, policy.namespaces, "namespaces", "volume mounts")
            what = f"volume mounts under {VOLUME_MARKER_DIR}/ ({', '.join(map(quoted, ids[:8]))})"
            return _outcome(info, policy, "volume mounts", _parse_entries(ids, what), imex)
        if names_markers:
            return RequestOutcome(
                None, (f"env {VISIBLE_DEVICES}={VOLUME_MARKER_DIR} points at volume-mount markers, but there are none",)
            )
    elif names_markers:
        raise RequestError(
            f"env {VISIBLE_DEVICES}={VOLUME_MARKER_DIR} asks for GPUs by volume-mount markers, "
            "but policy.accept_volume_mounts is off; turn it on, or name the GPUs by annotation or env"
        )

    if env_value is None:
        if not (policy.legacy_image_all_gpus and _is_legacy(env)):
            return _NOTHING
        source = f"legacy CUDA image rule (CUDA_VERSION={quoted(env['CUDA_VERSION'])}, no {VISIBLE_DEVICES})"
        env_value = "all"
    else:
        source = f"env {VISIBLE_DEVICES}"
    # The env may come from the image (every nvidia/cuda image says "all"), so a
    # policy refusal leaves the container without GPUs rather than failing it.
    allowed = policy.namespaces
    if allowed is not None and info.pod_namespace not in allowed:
        return RequestOutcome(None, (f"{source} ignored by policy: {_not_allowed(info, allowed, 'namespaces')}",))
    if not info.privileged and not policy.accept_env_unprivileged:
        note = f"{source} ignored by policy: the container is not privileged and policy.accept_env_unprivileged is off"
        return RequestOutcome(None, (note,))
    what = f"{source}={quoted(_bounded(env_value, source))}"
    return _outcome(info, policy, source, parse_device_list(env_value, what=what), imex)


def _not_allowed(info: ContainerInfo, allowed: tuple[str, ...], key: str) -> str:
    listed = ", ".join(allowed[:16]) + (f" and {len(allowed) - 16} more" if len(allowed) > 16 else "")
    what = "have GPUs" if key == "namespaces" else "use the GPU annotations"
    return f"namespace {quoted(info.pod_namespace)} may not {what} (policy.{key}: {listed or 'none'})"


def _check_namespace(info: ContainerInfo, allowed: tuple[str, ...] | None, key: str, source: str) -> None:
    """Refuse a deliberate request (annotation, volume markers) from a namespace ``policy.<key>`` leaves out."""
    if allowed is not None and info.pod_namespace not in allowed:
        raise RequestError(
            f"{source} on pod {quoted(f'{info.pod_namespace}/{info.pod_name}')}: {_not_allowed(info, allowed, key)}"
        )


def _mig_grant(info: ContainerInfo, name: str, allowed: tuple[str, ...] | None, key: str) -> bool:
    """``NVIDIA_MIG_MONITOR_DEVICES`` / ``..._CONFIG_...``: unset or empty is no;
    ``all`` (the only value the toolkit knows) is yes where ``policy.<key>`` allows
    the pod's namespace, and refused elsewhere, as the toolkit refuses it to an
    unprivileged container."""
    value = info.env.get(name)
    if value is None or not value.strip():
        return False
    if value.strip() != "all":
        raise RequestError(f"env {name}={quoted(value)}: only all is supported (as in the NVIDIA Container Toolkit)")
    if allowed is not None and info.pod_namespace not in allowed:
        listed = ", ".join(allowed[:16]) or "none"
        raise RequestError(
            f"env {name}=all on pod {quoted(f'{info.pod_namespace}/{info.pod_name}')}: namespace "
            f"{quoted(info.pod_namespace)} may not have this MIG capability (policy.{key}: {listed})"
        )
    return True


def _outcome(
    info: ContainerInfo,
    policy: Policy,
    source: str,
    parsed: tuple[Selection, tuple[DeviceId, ...]] | None,
    imex_markers: tuple[str, ...] = (),
) -> RequestOutcome:
    if parsed is None:
        return _NOTHING
    env = info.env
    selection, ids = parsed
    monitor = _mig_grant(info, MIG_MONITOR, policy.mig_monitor_namespaces, "mig_monitor_namespaces")
    config = _mig_grant(info, MIG_CONFIG, policy.mig_config_namespaces, "mig_config_namespaces")
    if config and any(isinstance(i, (ByMigUuid, ByMigIndex, ByMigPlacement)) for i in ids):
        raise RequestError(
            f"env {MIG_CONFIG}=all together with specific MIG devices from {source}: the config capability "
            "would expose their sibling MIG instances; ask for whole GPUs (or all) with it"
        )
    notes: list[str] = []
    legacy = _is_legacy(env)
    asked = parse_capabilities(env.get(DRIVER_CAPABILITIES), legacy_image=legacy)
    capabilities = asked & policy.capabilities
    if capabilities != asked:
        dropped = ", ".join(sorted(c.value for c in asked - capabilities))
        notes.append(f"capabilities capped by policy.capabilities: {dropped} dropped")
    requirements = _requirements(env, policy, legacy, notes)
    fabric = parse_fabric(
        env,
        imex_markers,
        privileged=info.privileged,
        policy=policy,
        max_entries=MAX_LIST_ENTRIES,
        max_length=MAX_VALUE_LENGTH,
        notes=notes,
    )
    request = GpuRequest(
        selection,
        ids,
        capabilities,
        requirements,
        source,
        mig_monitor=monitor,
        mig_config=config,
        devices=info.devices,
        fabric=fabric,
    )
    return RequestOutcome(request, tuple(notes))
