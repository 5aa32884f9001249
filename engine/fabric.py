"""Fabric and I/O devices beside the GPUs: IMEX channels, GDS, MOFED, GDRCopy, NVSwitch.  (pure)

Theory of operation: these come only with GPUs. ``parse_fabric`` runs once a GPU
request was found (so the namespace policy and the source's own policy have
passed) and reads:

* the IMEX channels, from the device plugin's markers
  ``/var/run/nvidia-container-devices/imex/<id>`` where ``policy.accept_volume_mounts``
  reads markers and there are some, else from ``NVIDIA_IMEX_CHANNELS`` (a comma
  list of channel numbers) in a privileged container or with
  ``policy.accept_env_unprivileged``. ``all`` alone is ignored with a note, as the
  toolkit ignores it (every channel would join every IMEX domain of the node);
  empty, ``void`` and ``none`` ask for none;
* ``NVIDIA_GDS``, ``NVIDIA_MOFED``, ``NVIDIA_GDRCOPY``, ``NVIDIA_NVSWITCH``: exactly
  ``enabled`` turns one on (as the toolkit; no privilege check there either), any
  other value is ignored with a note.

``plan_fabric`` then holds them against the node (``Fabric``) and refuses, naming
the value and what the node lacks, a channel at or past ``ImexChannelCount``,
channels on a driver without the IMEX major, and a feature none of whose nodes
exist: an explicit ``enabled`` that cannot be served fails loudly. A channel's
node is made from numbers (major ``nvidia-caps-imex-channels``, minor the channel,
mode 0666): the host need not have it (the driver makes only channel0). A
feature gives every node of its set that the node has, with the host node's
numbers and mode; GDS also binds ``/etc/cufile.json`` and ``/run/udev/data`` read-only
when the driver root has them. Where the request selected no GPU (``none``, or
``all`` on a node without GPUs) all of them are left out with a note.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from nri_gpu.engine.config import Policy
from nri_gpu.engine.errors import RequestError, quoted
from nri_gpu.engine.model import DeviceKind, DeviceNode, Fabric, Feature

IMEX_CHANNELS = "NVIDIA_IMEX_CHANNELS"
IMEX_MARKER_PREFIX = "imex/"
IMEX_DIR = "/dev/nvidia-caps-imex-channels"
IMEX_MAJOR_NAME = "nvidia-caps-imex-channels"
MAX_IMEX_CHANNEL = (1 << 20) - 1  # the toolkit's bound; the driver's minors are 20 bits
DEFAULT_IMEX_CHANNEL_COUNT = 2048  # NVreg_ImexChannelCount's default
IMEX_MODE = 0o666  # what the driver gives channel0 (NVreg_CreateImexChannel0)
ENABLED = "enabled"
# Where each feature's nodes are, as the toolkit globs them (``internal/discover``).
FEATURE_KINDS = {
    Feature.GDS: DeviceKind.NVIDIA_FS,
    Feature.MOFED: DeviceKind.INFINIBAND,
    Feature.GDRCOPY: DeviceKind.GDRDRV,
    Feature.NVSWITCH: DeviceKind.NVSWITCH,
}
FEATURE_NODES = {
    Feature.GDS: "/dev/nvidia-fs*",
    Feature.MOFED: "/dev/infiniband/uverbs* or /dev/infiniband/rdma_cm",
    Feature.GDRCOPY: "/dev/gdrdrv",
    Feature.NVSWITCH: "/dev/nvidia-nvswitchctl or /dev/nvidia-nvswitch*",
}
_MODULES = {
    Feature.GDS: "nvidia-fs",
    Feature.MOFED: "ib_uverbs / rdma_ucm",
    Feature.GDRCOPY: "gdrdrv",
    Feature.NVSWITCH: "nvidia (on an NVSwitch system)",
}
_CHANNEL = re.compile(r"[0-9]{1,8}", re.ASCII)
_NO_CHANNELS = frozenset({"", "void", "none"})


@dataclass(frozen=True)
class FabricRequest:
    """The fabric devices a GPU request asks for: channel numbers (deduplicated, in
    request order) and where they came from, and the features turned on."""

    imex_channels: tuple[int, ...] = ()
    imex_source: str = ""
    features: frozenset[Feature] = field(default_factory=frozenset)

    @property
    def is_empty(self) -> bool:
        return not (self.imex_channels or self.features)


@dataclass(frozen=True)
class FabricPlan:
    """What a container gets of them: nodes, (destination, source node path) mounts, notes."""

    devices: tuple[DeviceNode, ...] = ()
    mounts: tuple[tuple[str, str], ...] = ()
    imex_channels: tuple[int, ...] = ()
    features: tuple[Feature, ...] = ()
    notes: tuple[str, ...] = ()


def parse_channel(entry: str, what: str) -> int:
    """One channel number, 0 to ``MAX_IMEX_CHANNEL``; raises RequestError naming it.

    >>> parse_channel(" 05 ", "env"), parse_channel("1048575", "env")
    (5, 1048575)
    """
    text = entry.strip()
    if not _CHANNEL.fullmatch(text) or int(text) > MAX_IMEX_CHANNEL:
        raise RequestError(
            f"{what}: IMEX channel {quoted(text, 80)} is not a channel number (0 to {MAX_IMEX_CHANNEL}, decimal)"
        )
    return int(text)


def _channels(entries: Iterable[str], what: str) -> tuple[int, ...]:
    return tuple(dict.fromkeys(parse_channel(e, what) for e in entries))


def parse_fabric(
    env: Mapping[str, str],
    markers: tuple[str, ...],
    *,
    privileged: bool,
    policy: Policy,
    max_entries: int,
    max_length: int,
    notes: list[str],
) -> FabricRequest:
    """The fabric part of a GPU request (module docstring). ``markers``: the ids after
    ``imex/`` of the IMEX volume markers (already bounded); ``max_entries`` and
    ``max_length`` bound the env value as every other list. Raises RequestError for a
    malformed channel, naming it and its source; appends to ``notes`` what it ignores."""
    features = frozenset(f for f in Feature if _feature_on(env, f, max_length, notes))
    if policy.accept_volume_mounts and markers:
        what = f"volume mounts under /var/run/nvidia-container-devices/{IMEX_MARKER_PREFIX}"
        return FabricRequest(_channels(markers, what), "volume mounts", features)
    value = env.get(IMEX_CHANNELS)
    if value is None or value.strip() in _NO_CHANNELS:
        return FabricRequest(features=features)
    source = f"env {IMEX_CHANNELS}"
    if len(value) > max_length:
        raise RequestError(f"{source}: {len(value)} characters, longer than {max_length}: {quoted(value, 40)}")
    if value.strip() == "all":
        notes.append(f"{source}=all ignored: name the channels (as the NVIDIA Container Toolkit, all is not served)")
        return FabricRequest(features=features)
    if not privileged and not policy.accept_env_unprivileged:
        notes.append(
            f"{source} ignored by policy: the container is not privileged and policy.accept_env_unprivileged is off"
        )
        return FabricRequest(features=features)
    if value.count(",") >= max_entries:
        raise RequestError(f"{source}: more than {max_entries} entries")
    return FabricRequest(_channels(value.split(","), f"{source}={quoted(value, 80)}"), source, features)


def _feature_on(env: Mapping[str, str], feature: Feature, max_length: int, notes: list[str]) -> bool:
    value = env.get(feature.env)
    if value is None or not value.strip():
        return False
    if value == ENABLED:
        return True
    shown = quoted(value[:max_length], 40)
    notes.append(f"env {feature.env}={shown} ignored: only {ENABLED} turns it on (as in the NVIDIA Container Toolkit)")
    return False


def plan_fabric(request: FabricRequest, fabric: Fabric, *, with_gpus: bool) -> FabricPlan:
    """The nodes and mounts for ``request`` on this node. Raises RequestError, naming
    the request and what the node lacks, for a channel it cannot have or a feature
    none of whose nodes exist (module docstring)."""
    if request.is_empty:
        return FabricPlan()
    if not with_gpus:
        asked = [f"{f.env}={ENABLED}" for f in sorted(request.features, key=_order)]
        if request.imex_channels:
            asked.insert(0, f"IMEX channels from {request.imex_source}")
        return FabricPlan(notes=(f"{', '.join(asked)} ignored: they come only with GPUs, and none was selected",))
    devices = list(_imex_nodes(request, fabric))
    mounts: list[tuple[str, str]] = []
    features = sorted(request.features, key=_order)
    for feature in features:
        nodes = fabric.nodes_of(FEATURE_KINDS[feature])
        if not nodes:
            raise RequestError(
                f"env {feature.env}={ENABLED}: this node has no {FEATURE_NODES[feature]} character device "
                f"(is the {_MODULES[feature]} module loaded?)"
            )
        devices += nodes
        if feature is Feature.GDS:
            mounts += fabric.gds_files
    return FabricPlan(tuple(devices), tuple(mounts), request.imex_channels, tuple(features))


def _order(feature: Feature) -> int:
    return list(Feature).index(feature)


def _imex_nodes(request: FabricRequest, fabric: Fabric) -> tuple[DeviceNode, ...]:
    channels = request.imex_channels
    if not channels:
        return ()
    shown = ",".join(map(str, channels[:16])) + (",..." if len(channels) > 16 else "")
    if fabric.imex_major is None:
        raise RequestError(
            f"{request.imex_source} asks for IMEX channels {shown}, but /proc/devices lists no "
            f"{IMEX_MAJOR_NAME} major (the driver has no IMEX channels)"
        )
    count = fabric.imex_channel_count
    if count is None:
        raise RequestError(
            f"{request.imex_source} asks for IMEX channels {shown}, but this node's ImexChannelCount "
            "(/proc/driver/nvidia/params) could not be read"
        )
    for channel in channels:
        if channel >= count:
            have = f"channels 0-{count - 1}" if count else "no channels"
            raise RequestError(
                f"{request.imex_source} asks for IMEX channel {channel}, but this node has {have} "
                f"(ImexChannelCount {count} in /proc/driver/nvidia/params)"
            )
    return tuple(
        DeviceNode(f"{IMEX_DIR}/channel{c}", fabric.imex_major, c, "c", IMEX_MODE, DeviceKind.IMEX_CHANNEL)
        for c in sorted(channels)
    )
