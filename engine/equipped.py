"""Containers that already have GPUs when nri-gpu sees them.  (pure)

Another producer may have equipped a container before NRI's CreateContainer
reaches us: the runtime applies CDI edits first (Kubernetes DRA's
``k8s.gpu.nvidia.com/claim=...``, the device plugin's ``cdi-annotations`` and
``cdi-cri`` strategies with ``k8s.device-plugin.nvidia.com/gpu=...``, any
``nvidia.com/gpu=...`` spec named in a ``cdi.k8s.io/`` annotation), and the
device plugin's ``passDeviceSpecs`` adds device nodes. nri-gpu must never
inject a second, different set.

What a container has is read from what the runtime hands us, not from names:
its ``/dev/nvidia<M>`` nodes (by major and minor) are its whole GPUs, and the
MIG devices whose three nodes it holds are its MIG devices (a parent node there
for them is not a whole GPU). Who gave them:

* **CDI** (``Source.CDI``): NVIDIA's driver libraries are already bind-mounted,
  or the container names CDI devices of an NVIDIA vendor (containerd >= 2.3
  passes the names in ``Container.CDI_devices``; containerd 1.7 and 2.1 apply
  the ``cdi.k8s.io/`` annotations, which NRI shows too). Its files, env and
  hooks are the CDI spec's.
* **device nodes only** (``Source.DEVICE_SPECS``): the device plugin's
  ``passDeviceSpecs``; the driver files are still ours to give.

Rules (``reconcile``): a request of ours for anything else than what the
container has is refused, naming both. A container with device nodes only is
then served as usual (an identical node is not added twice). A CDI-equipped
one is left alone (``policy.equipped_containers = "stand-aside"``, the default:
its producer did the whole job, ours would fight it), or gets only what CDI
cannot give (``"complete"``): the ``/proc/driver/nvidia`` view limited to its
GPUs and the ld.so.cache entries of the driver libraries it already mounts.

A privileged container holds every host device (``/dev/mem`` among them): its
nodes say nothing about an allocation, and it is served as usual.

NVIDIA's own NRI plugin injects after us from its pod annotations
``nvidia.cdi.k8s.io/...``: what it will give cannot be seen here, so a
deliberate request of ours beside it (annotation, volume markers) is refused,
and one from the env (which the image may carry) is ignored with a note.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from nri_gpu.engine.config import EQUIPPED_MODES, EngineConfig
from nri_gpu.engine.model import Capability, Gpu, Inventory, MigDevice, Plan
from nri_gpu.engine.plan import plan as make_plan
from nri_gpu.engine.request import ByMigPlacement, ByUuid, DeviceId, GpuRequest, Selection
from nri_gpu.engine.selection import mig_devices_in

__all__ = [
    "CDI_ANNOTATION_PREFIX",
    "EQUIPPED_MODES",
    "NVIDIA_NRI_ANNOTATION_PREFIX",
    "NVIDIA_VENDORS",
    "Equipped",
    "Source",
    "cdi_names",
    "completion",
    "conflict",
    "equipped",
    "nvidia_nri_annotation",
]

CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
NVIDIA_NRI_ANNOTATION_PREFIX = "nvidia.cdi.k8s.io/"
# CDI vendors whose devices are NVIDIA GPUs: ours and NVIDIA's specs, the device
# plugin's, DRA's claims, NVIDIA's management spec.
NVIDIA_VENDORS = ("nvidia.com/", "k8s.device-plugin.nvidia.com/", "k8s.gpu.nvidia.com/", "management.nvidia.com/")
_MEM = (1, 1)  # /dev/mem: only a privileged container holds it
MAX_CDI_NAMES = 256  # names read from annotations; past that the rest are not looked at


class Source(enum.Enum):
    CDI = "CDI"
    DEVICE_SPECS = "device nodes"


@dataclass(frozen=True)
class Equipped:
    """The GPUs and MIG devices a container already has, and how it got them."""

    gpus: tuple[Gpu, ...]
    mig_devices: tuple[MigDevice, ...]
    source: Source
    evidence: str  # for messages: "CDI devices nvidia.com/gpu=0", "driver files mounted (libcuda.so.550.163.01)", ...

    def names(self) -> tuple[str, ...]:
        return tuple(g.uuid for g in self.gpus) + tuple(m.name for m in self.mig_devices)

    def describe(self) -> str:
        gpus = [f"GPU {g.index}" for g in self.gpus] + [
            f"MIG {m.parent.index}/{m.gpu_instance.gi}/{m.compute_instance.ci}" for m in self.mig_devices
        ]
        return ", ".join(gpus) or "no GPU"


def cdi_names(annotations: Mapping[str, str], names: Iterable[str] = ()) -> tuple[str, ...]:
    """NVIDIA CDI device names the container carries: ``names`` (NRI's
    ``Container.CDI_devices``) and the values of its ``cdi.k8s.io/`` annotations
    (comma-separated, as containerd reads them); at most ``MAX_CDI_NAMES``."""
    found: list[str] = []
    for name in names:
        found.append(name)
    for key, value in annotations.items():
        if key.startswith(CDI_ANNOTATION_PREFIX):
            found.extend(part.strip() for part in value[:65536].split(",")[:MAX_CDI_NAMES])
    return tuple(n for n in found[:MAX_CDI_NAMES] if n.startswith(NVIDIA_VENDORS))


def nvidia_nri_annotation(annotations: Mapping[str, str]) -> str | None:
    """The first ``nvidia.cdi.k8s.io/`` annotation key of the pod, if any."""
    return next((key for key in annotations if key.startswith(NVIDIA_NRI_ANNOTATION_PREFIX)), None)


def equipped(
    devices: Iterable[tuple[int, int]],
    mounted: Iterable[str],
    names: tuple[str, ...],
    inventory: Inventory,
) -> Equipped | None:
    """What the container already has (None: no NVIDIA GPU node, or privileged).

    ``devices``: (major, minor) of its character devices; ``mounted``: its mount
    destinations; ``names``: its NVIDIA CDI device names (``cdi_names``).
    """
    nodes = set(devices)
    if inventory.nvidia_major is None or _MEM in nodes:
        return None
    migs = mig_devices_in(nodes, inventory)
    parents = {m.parent.minor for m in migs}
    gpus = tuple(g for g in inventory.gpus if (inventory.nvidia_major, g.minor) in nodes and g.minor not in parents)
    if not gpus and not migs:
        return None
    if names:
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        return Equipped(gpus, migs, Source.CDI, f"CDI devices {shown}")
    libraries = {lib.path for lib in inventory.libraries}
    found = next((path for path in mounted if path in libraries), None)
    if found is not None:
        return Equipped(gpus, migs, Source.CDI, f"driver files already mounted ({found.rsplit('/', 1)[-1]})")
    return Equipped(gpus, migs, Source.DEVICE_SPECS, "device nodes already in its spec")


def conflict(have: Equipped, plan: Plan, source: str) -> str | None:
    """Why ``plan`` (what the container's own request selects) may not be added to
    what it ``have``s, or None when both name the same GPUs and MIG devices."""
    wanted = {g.uuid for g in plan.gpus} | {m.placement for m in plan.mig_devices}
    present = {g.uuid for g in have.gpus} | {m.placement for m in have.mig_devices}
    if wanted == present:
        return None
    asked = ", ".join(
        [f"GPU {g.index}" for g in plan.gpus]
        + [f"MIG {m.parent.index}/{m.gpu_instance.gi}/{m.compute_instance.ci}" for m in plan.mig_devices]
    )
    return (
        f"it already has {have.describe()} ({have.evidence}), and {source} asks for {asked or 'no GPU'}: "
        "nri-gpu never adds a second, different set; ask for the same GPUs or only one way"
    )


def completion(
    have: Equipped, inventory: Inventory, config: EngineConfig, capabilities: frozenset[Capability], mounted: set[str]
) -> Plan:
    """What CDI cannot give a CDI-equipped container (``"complete"``): no device,
    mount or env (the spec's stand), only the start work: the procfs view of its
    GPUs (and MIG access files), and for the driver libraries it already mounts
    their ld.so.cache entries and the links those name (``libcuda.so.1 ->
    libcuda.so.550.163.01``: a spec whose hook made them already keeps them, the
    same link is left as it is). Raises what ``plan`` raises."""
    ids: list[DeviceId] = [ByUuid(g.uuid) for g in have.gpus]
    ids += [ByMigPlacement(m.parent.uuid, m.gpu_instance.gi, m.compute_instance.ci) for m in have.mig_devices]
    request = GpuRequest(Selection.LIST, tuple(ids), capabilities, (), f"{have.source.value} ({have.evidence})")
    full = make_plan(request, inventory, config)
    entries = tuple(e for e in full.ld_cache_entries if _target(e.path, full) in mounted)
    links = tuple(s for s in full.symlinks if _target(s.path, full) in mounted)
    return dataclasses.replace(
        full,
        devices=(),
        mounts=(),
        env=(),
        symlinks=links,
        ipc=(),
        ld_cache_entries=entries,
        ldconfig_folders=tuple(sorted({e.path.rsplit("/", 1)[0] for e in entries})),
        notes=(
            *full.notes,
            f"already equipped by {have.evidence}: only the procfs view, library links and ld.so.cache added",
        ),
    )


def _target(link: str, plan: Plan) -> str:
    """The library file an ld.so.cache entry's path leads to (``libcuda.so.1`` ->
    ``libcuda.so.550.163.01``, through the plan's links), for "is it mounted"."""
    targets = {s.path: s.target for s in plan.symlinks}
    path = link
    for _ in range(4):
        target = targets.get(path)
        if target is None:
            return path
        path = target if target.startswith("/") else f"{path.rsplit('/', 1)[0]}/{target}"
    return path
